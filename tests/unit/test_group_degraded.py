"""Which reason a CompactorGroup's Degraded condition gives (kompaktor_operator.conditions).

The operator tier (tests/operator/test_operator.py) and the Kubernetes tier make the causes happen
and read the condition; this table pins the choice among several causes at once."""

from __future__ import annotations

import pytest

from kompaktor_operator.conditions import Verdict, decide_group_degraded

BLIND = "FailedGetExternalMetric: unable to get external metric"


@pytest.mark.parametrize(
    ("queued", "ready", "dead_lettered", "blind", "reason"),
    [
        (0, 2, 0, None, "Healthy"),
        (5, 2, 0, None, "Healthy"),
        (5, 0, 0, None, "NoReadyCompactors"),
        (0, 0, 3, None, "DeadLetteredJobs"),
        (5, 2, 3, None, "DeadLetteredJobs"),
        # a blind autoscaler comes first: it is why no pod is ready, and why jobs wait
        (5, 0, 3, BLIND, "AutoscalerCannotReadMetric"),
        (5, 2, 0, BLIND, "AutoscalerCannotReadMetric"),
        # no job waits: a blind autoscaler stops nothing
        (0, 0, 0, BLIND, "Healthy"),
        # no job waits and none failed: no ready pod is no trouble (a group parked at zero)
        (0, 0, 0, None, "Healthy"),
        # queued jobs and no ready pod come before the dead letters
        (5, 0, 3, None, "NoReadyCompactors"),
    ],
)
def test_the_most_pressing_cause_is_the_reason(
    queued: int, ready: int, dead_lettered: int, blind: str | None, reason: str
) -> None:
    verdict = decide_group_degraded("big", queued, ready, dead_lettered, blind)
    assert verdict.reason == reason
    assert verdict.status is (reason != "Healthy")


def test_the_messages_name_what_to_look_at() -> None:
    blind = decide_group_degraded("big", 7, 0, 0, BLIND)
    assert "7 job(s) queued" in blind.message and "kompaktor-big" in blind.message and BLIND in blind.message
    assert "7 job(s) queued but no compactor pod is ready" in decide_group_degraded("big", 7, 0, 0).message
    assert "2 job(s) failed too often" in decide_group_degraded("big", 0, 1, 2).message
    assert decide_group_degraded("big", 0, 1, 0) == Verdict(False, "Healthy", "")
