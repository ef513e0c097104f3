"""Helpers shared by the test tiers (and the benchmarks), one of each: ``wait`` (poll with a
deadline), ``ports`` (a free loopback port), ``procs`` (process trees, on psutil), ``snapshot``
(a Redis database's contents), ``entries`` (rows of key/value entries), ``k8s`` (a Helm release
on the real control plane). Imported as ``tests.support.<module>``: the repository root is on
``sys.path`` (pytest's ``pythonpath``; ``python -m bench.<name>`` from the root)."""
