"""The test suite, importable as ``tests`` from the repository root (pytest's ``pythonpath``
puts the root on ``sys.path``; ``python -m bench.<name>`` runs from it): shared helpers, and the
servers the tests start (S3, containerd, a TCP proxy), live in :mod:`tests.support`."""
