"""Kompaktor's custom resources, shared by the operator and local mode (pure: no I/O).

``api`` spells the API names once; ``models`` holds the pydantic spec/status models, the only
definition of the CRD schemas; ``crdgen`` turns them into ``crds/``; ``admission`` and
``operator_config`` say what a CompactorGroup may use (the operator and ``kompaktor up`` apply the
same rules). Layer: above ``policy`` (its defaults and configs), below everything that reads
resources; must not import ``kompaktor_operator``, kopf, redis or a Kubernetes client.
"""
