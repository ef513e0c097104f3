"""The test suite, importable as ``tests`` from the repository root (pytest's ``pythonpath``
puts the root on ``sys.path``; ``python -m bench.<name>`` runs from it): shared helpers live in
:mod:`tests.support`, servers the tests start in :mod:`tests.harness`."""
