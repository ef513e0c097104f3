"""The custom resources' API names, spelled once: group, version, kinds and plurals.

Everything that names a Kompaktor resource on the wire takes it from here — the CR models and the
CRDs generated from them (``crdgen``), the operator's kopf registrations, its API paths
(``kompaktor_operator.kube``), its labels and annotations (``kompaktor_operator.naming``), local
mode's YAML, the tests and benchmarks. Must not import anything.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "kompaktor.io"
VERSION: Final = "v1alpha1"
#: f"{GROUP}/{VERSION}", spelled out so that a type checker sees the literal the models'
#: ``apiVersion`` field takes (tests/unit/test_crds.py checks the two agree)
GROUP_VERSION: Final = "kompaktor.io/v1alpha1"

#: the kinds
SERVICE_KIND = "CompactionService"
GROUP_KIND = "CompactorGroup"
COMPACTION_KIND = "Compaction"

#: the plurals (their URLs, kopf's selectors, the CRDs' names)
SERVICES = "compactionservices"
GROUPS = "compactorgroups"
COMPACTIONS = "compactions"

#: (group, version, plural) as kopf's decorators take them
SERVICE_RESOURCE = (GROUP, VERSION, SERVICES)
GROUP_RESOURCE = (GROUP, VERSION, GROUPS)
COMPACTION_RESOURCE = (GROUP, VERSION, COMPACTIONS)

#: the prefix of every label and annotation key Kompaktor owns ("kompaktor.io/")
KEY_PREFIX = f"{GROUP}/"
