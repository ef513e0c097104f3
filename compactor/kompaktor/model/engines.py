"""The merge engines' names: what a CompactorGroup may name (``kompaktor.policy.services``, the
CRD's enum, the ``--engine`` choices) and what ``kompaktor.engines`` builds. Here, below both, so
that the engines need nothing from the policy layer."""

ENGINES = ("spark", "arrow")
