"""The local YAML (`kompaktor up --config`) goes through the operator's models: bad settings get a
clear error that names the problem, and nothing is applied."""

from __future__ import annotations

import pytest

from kompaktor.local.config import DEMO_CONFIG, load_config
from kompaktor.model.errors import KompaktorError


def test_demo_config_loads_two_tiers_and_groups() -> None:
    cfg = load_config(DEMO_CONFIG)
    svc = cfg.services["default"]
    assert [(t.name, t.max_size, t.group) for t in svc.tiers] == [
        ("small", 512 * 1024, "small"),
        ("large", None, "large"),
    ]
    assert cfg.groups["small"].engine == "arrow" and cfg.groups["large"].engine == "spark"


def test_a_local_group_takes_the_resume_settings_of_a_compactor_group() -> None:
    """Local mode reads the same CRs: spec.resume reaches the group it runs."""
    cfg = load_config(
        DEMO_CONFIG.replace("drainGraceSeconds: 60", "drainGraceSeconds: 60\n  resume: {minInputSize: 64Mi}")
    )
    assert (cfg.groups["large"].resume, cfg.groups["large"].resume_min_bytes) == (True, 64 << 20)
    assert (cfg.groups["small"].resume, cfg.groups["small"].resume_min_bytes) == (True, 1 << 30)
    off = load_config(DEMO_CONFIG.replace("drainGraceSeconds: 30", "drainGraceSeconds: 30\n  resume: {enabled: false}"))
    assert off.groups["small"].resume is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("ratio: 2", "ratio: -1"), "ratio"),
        (("compactorGroup: large}", "compactorGroup: huge}"), "unknown compactor groups ['huge']"),
        (
            (
                "{name: small, maxSize: 512Ki, compactorGroup: small}\n    - {name: large, compactorGroup: large}",
                "{name: large, compactorGroup: large}\n    - {name: small, maxSize: 512Ki, compactorGroup: small}",
            ),
            "only the last tier may be unbounded",
        ),
        (("maxOpen: 10", "maxOpen: 1"), "maxOpen"),
        (
            (
                "minReplicas: 1\n  maxReplicas: 3\n  jobsPerReplica: 2",
                "minReplicas: 4\n  maxReplicas: 3\n  jobsPerReplica: 2",
            ),
            "minReplicas",
        ),
        (("kind: CompactorGroup", "kind: CompactorGroupz"), "kind"),
        (("drainGraceSeconds: 60", "drainGraceSeconds: 60\n  resume: {minInputSize: -2Gi}"), "is negative"),
        (
            ("drainGraceSeconds: 60", "drainGraceSeconds: 60\n  resume: {minInputSize: 2GB}"),
            "not a Kubernetes quantity",
        ),
    ],
)
def test_bad_settings_are_refused_with_a_clear_error(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in DEMO_CONFIG
    with pytest.raises(KompaktorError) as err:
        load_config(DEMO_CONFIG.replace(old, new, 1))
    assert message in str(err.value)
    assert "\n" not in str(err.value)
