"""Helpers shared by the test tiers (and the benchmarks), one of each: ``wait`` (poll with a
deadline), ``ports`` (a free loopback port), ``procs`` (process trees, on psutil), ``snapshot``
(a Redis database's contents), ``rawredis`` (a client of a store's Redis, the test's own),
``entries`` (rows of key/value entries), ``mergeinputs`` (the merge
bench's key shapes and sorted input files), ``growth`` (the soaks' per-process growth and its
limits), ``k8s`` (a Helm release on the real control plane); and servers the tests start:
``s3server`` (an S3 API server), ``containerd`` (a containerd of the test's own), ``images`` (the
images as built by `make images`), ``tcpproxy`` (a TCP proxy that can cut connections). Imported
as ``tests.support.<module>``: the repository root is on ``sys.path`` (pytest's ``pythonpath``;
``python -m bench.<name>`` from the root). The benchmarks import these; the tests never import
``bench`` (an import contract in pyproject.toml, and tests/unit/test_import_direction.py)."""
