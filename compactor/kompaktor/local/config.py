"""The local configuration (`kompaktor up --config local.yaml`): the same CompactionService and
CompactorGroup documents a cluster takes, validated by the same pydantic models as the operator's
(``kompaktor.resources``) and held to the same admission rules."""

from __future__ import annotations

from dataclasses import dataclass

from kompaktor.model.errors import KompaktorError
from kompaktor.policy.services import GroupConfig, ServiceConfig
from kompaktor.resources.admission import check_group
from kompaktor.resources.models import CompactorGroup, DocumentError, configs, load_documents
from kompaktor.resources.operator_config import OperatorConfig


@dataclass(frozen=True)
class LocalConfig:
    services: dict[str, ServiceConfig]
    groups: dict[str, GroupConfig]


def load_config(yaml_text: str) -> LocalConfig:
    try:
        docs = load_documents(yaml_text)
    except DocumentError as exc:
        raise KompaktorError(f"invalid configuration: {exc}") from None
    # the operator's rules, with the allowances an admin set in this environment (the chart's
    # compactor.allowed* values are the same KOMPAKTOR_ALLOWED_* variables): a group cannot
    # choose what code its compactors run or where their data goes here either
    rules = OperatorConfig.from_env()
    for doc in docs:
        if isinstance(doc, CompactorGroup) and (refusal := check_group(doc.spec, rules)) is not None:
            raise KompaktorError(f"CompactorGroup {doc.name}: {refusal.message} ({refusal.rule})")
    services, groups = configs(docs)
    cfg = LocalConfig({s.name: s for s in services}, {g.name: g for g in groups})
    missing = sorted({t.group for s in cfg.services.values() for t in s.tiers} - set(cfg.groups))
    if missing:
        raise KompaktorError(
            f"invalid configuration: services send work to unknown compactor groups {missing}; "
            f"declare a CompactorGroup for each"
        )
    return cfg


DEMO_CONFIG = """\
apiVersion: kompaktor.io/v1alpha1
kind: CompactionService
metadata: {name: default}
spec:
  ratio: 2
  maxOpen: 10
  maxFilesPerTablet: 15
  tables: ["*"]
  tiers:
    - {name: small, maxSize: 512Ki, compactorGroup: small}
    - {name: large, compactorGroup: large}
---
apiVersion: kompaktor.io/v1alpha1
kind: CompactorGroup
metadata: {name: small}
spec:
  minReplicas: 1
  maxReplicas: 3
  jobsPerReplica: 2
  drainGraceSeconds: 30
  spark: {engine: arrow}
---
apiVersion: kompaktor.io/v1alpha1
kind: CompactorGroup
metadata: {name: large}
spec:
  minReplicas: 1
  maxReplicas: 2
  jobsPerReplica: 1
  drainGraceSeconds: 60
  spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: "2"}}
"""
