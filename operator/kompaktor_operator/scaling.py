"""Pure scale decisions: the autoscaler says how many compactors; this module says which go.

Owns: ``decide_scale`` — given the Deployment's replicas, the desired count, the group's pods
and the compactors' Redis heartbeats, which pods to ask to drain, which drained pods can go,
and the replica count to set now. A replica is removed only after its pod reported itself
drained (or never did any work): a busy compactor is never stopped, but it can be chosen — it
then takes no new job, finishes the one it holds and goes. So a lowered target is reached within
one job's duration whatever the queue holds. Must not import: kopf, redis, kube.

The sequence for a scale-down by k, over successive reconciles:
1. pick k victims — no heartbeat and not ready, then drained or already draining, then no
   heartbeat, then idle, then busy ones whose current job will end soonest (the job's heartbeat
   carries the estimate) — and ask them to drain;
2. once a victim is drained (state ``draining`` and no ECID) or has no heartbeat, give it the
   lowest pod-deletion-cost, and on the next pass lower the replicas by the number of such
   victims: the ReplicaSet removes the lowest-cost pods first. A server that ignores the cost
   (Kubernetes before 1.22, where the annotation is off by default) ranks NotReady pods first
   instead: there a victim counts only once its pod is seen NotReady (a drained compactor's
   readiness probe fails), or the ReplicaSet may remove another pod than the drained one.
A drained pod that is not a victim (the target went back up, or it was drained by hand) is
deleted, so the Deployment replaces it with a fresh compactor: a drained compactor takes no job
until its pod is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

State = Literal["idle", "busy", "draining"]


@dataclass(frozen=True)
class PodView:
    """What the scaler needs to know about one compactor pod (from the Kubernetes API)."""

    name: str
    ready: bool = True
    terminating: bool = False
    marked: bool = False  # carries the operator's draining annotation
    lowest_cost: bool = False  # carries the victim pod-deletion-cost


@dataclass(frozen=True)
class CompactorView:
    """One compactor's last heartbeat (from Redis). id is the pod name."""

    id: str
    state: State
    ecid: str | None = None
    #: for a compactor holding a job: the estimated seconds until that job ends (None: unknown)
    remaining_s: float | None = None

    @property
    def working(self) -> bool:
        return self.state == "busy" or self.ecid is not None

    @property
    def drained(self) -> bool:
        return self.state == "draining" and self.ecid is None


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int  # what the Deployment's spec.replicas should be now
    drain: tuple[str, ...] = ()  # ask these compactors to drain
    mark: tuple[str, ...] = ()  # give these pods the draining annotation
    lowest_cost: tuple[str, ...] = ()  # give these (drained) pods the victim pod-deletion-cost
    unmark: tuple[str, ...] = ()  # remove the annotation and cost (no longer victims, not drained)
    delete: tuple[str, ...] = ()  # drained pods no longer needed: delete so a fresh one replaces them
    waiting: tuple[str, ...] = ()  # victims still finishing a job or acknowledging the drain
    victims: tuple[str, ...] = ()
    reason: str = ""


def _rank(pod: PodView, beat: CompactorView | None) -> tuple[int, float, str]:
    """Victim preference, lower first: what goes soonest at the least cost."""
    if beat is None:
        return (0 if not pod.ready else 2, 0.0, pod.name)
    if beat.state == "draining":  # drained, or finishing its job before it goes: soonest first
        return (1, _remaining(beat), pod.name)
    if beat.working:  # finishes its job first: the one that ends soonest
        return (4, _remaining(beat), pod.name)
    return (3, 0.0, pod.name)  # idle


def _remaining(beat: CompactorView) -> float:
    if not beat.working:
        return 0.0
    return beat.remaining_s if beat.remaining_s is not None else float("inf")


def _replaceable(live: list[PodView], victims: set[str], compactors: Mapping[str, CompactorView]) -> tuple[str, ...]:
    """Drained pods that are not victims: deleted, so that fresh compactors replace them (a
    drained compactor takes no job until its pod is gone)."""
    return tuple(
        p.name for p in live if p.name not in victims and (b := compactors.get(p.name)) is not None and b.drained
    )


def decide_scale(
    current: int,
    desired: int,
    pods: Iterable[PodView],
    compactors: Mapping[str, CompactorView],
    *,
    deletion_cost: bool = True,
) -> ScaleDecision:
    """The next step towards ``desired`` replicas from the Deployment's ``current``;
    ``deletion_cost``: whether the server's ReplicaSet controller honours pod-deletion-cost.

    A pod gets the victim pod-deletion-cost one pass *before* the replicas drop, so that the
    ReplicaSet controller's cache has seen it when it chooses which pods to remove; only pods
    that are drained (or never reported a heartbeat) ever get that cost.
    """
    live = sorted((p for p in pods if not p.terminating), key=lambda p: p.name)
    if desired >= current:
        # Drained pods are useless now: replace them; lift other marks.
        delete = _replaceable(live, set(), compactors)
        unmark = tuple(p.name for p in live if (p.marked or p.lowest_cost) and p.name not in delete)
        reason = "scale up" if desired > current else "steady"
        return ScaleDecision(replicas=desired, delete=delete, unmark=unmark, reason=reason)

    excess = current - desired
    ranked = sorted(live, key=lambda p: (0 if p.marked else 1, _rank(p, compactors.get(p.name))))
    victims = ranked[:excess]  # earlier victims first: no churn
    steps = _victim_steps(victims, compactors, deletion_cost)
    names = {p.name for p in victims}
    # A pod that is no longer a victim: replace it when drained, else lift its mark.
    delete = _replaceable(live, names, compactors)
    unmark = tuple(p.name for p in live if (p.marked or p.lowest_cost) and p.name not in names and p.name not in delete)
    exposed = [p.name for p in live if p.lowest_cost and (b := compactors.get(p.name)) and b.working]
    if exposed:
        # A working pod still carries the victim cost (it started a job after being marked):
        # lift that mark first; removing a replica now could take that pod.
        steps.removable = []
        unmark = tuple(sorted({*unmark, *exposed}))
    if steps.removable:
        reason = f"removing {len(steps.removable)} drained compactor(s)"
    elif victims:
        reason = f"draining {len(victims)} compactor(s) before scaling down"
    else:
        reason = "no pod to drain yet"
    return ScaleDecision(
        replicas=current - len(steps.removable),
        drain=tuple(steps.drain),
        mark=tuple(p.name for p in victims if not p.marked),
        lowest_cost=tuple(steps.lowest),
        unmark=unmark,
        delete=delete,
        waiting=tuple(steps.waiting),
        victims=tuple(p.name for p in victims),
        reason=reason,
    )


@dataclass
class _VictimSteps:
    """What each victim needs next: removal, a drain request, the victim cost, or a wait."""

    removable: list[str] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    lowest: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


def _victim_steps(victims: list[PodView], compactors: Mapping[str, CompactorView], deletion_cost: bool) -> _VictimSteps:
    """A drained victim (or one that never reported) with the victim cost is removable — on a
    server without pod-deletion-cost only once its readiness probe turned it NotReady; without
    the cost it gets it first. A victim still working is asked to drain, and waited for."""
    out = _VictimSteps()
    for pod in victims:
        beat = compactors.get(pod.name)
        if beat is None and not pod.marked:
            out.drain.append(pod.name)  # a starting compactor must not take a job either
        if beat is None or beat.drained:
            # Before 1.22 a drained compactor's pod is removable once its readiness probe failed;
            # a pod that never reported has no compactor whose probe would: it goes at once.
            if pod.lowest_cost and (deletion_cost or not pod.ready or beat is None):
                out.removable.append(pod.name)
            elif pod.lowest_cost:
                out.waiting.append(pod.name)  # until its readiness probe turns it NotReady
            else:
                out.lowest.append(pod.name)
                out.waiting.append(pod.name)
        else:
            if not pod.marked or beat.state != "draining":
                out.drain.append(pod.name)
            out.waiting.append(pod.name)
    return out


def parked_replicas(spec_replicas: int | None, work: int, idle_s: float, window_s: float) -> int | None:
    """Scale to zero and back under a HorizontalPodAutoscaler, for a group with ``minReplicas: 0``.

    An HPA cannot do it alone: its own minReplicas is at least 1 (0 needs an alpha feature gate),
    and it leaves a target whose replicas are 0 alone (autoscaling disabled). So the operator parks
    the group: with one replica left (the HPA's floor) and no queued or running job (``work``) for
    ``window_s`` seconds (the group's scale-down stabilisation), spec.replicas goes to 0 — the last
    compactor is drained like any other; the first job queued for a parked group sets it back to 1,
    and the HPA takes over from there. Returns the spec.replicas to set, or None to leave it."""
    current = spec_replicas or 0
    if current == 0 and work > 0:
        return 1
    if current == 1 and work == 0 and idle_s >= window_s:
        return 0
    return None
