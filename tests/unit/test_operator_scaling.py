"""decide_scale: the HPA says how many, the operator says which — never a busy compactor."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kompaktor_operator.scaling import CompactorView, PodView, decide_scale, parked_replicas


def pods(*names: str, **flags: dict) -> list[PodView]:
    return [PodView(name=n, **flags.get(n, {})) for n in names]


def beat(
    id_: str, state: str = "idle", ecid: str | None = None, remaining_s: float | None = None
) -> tuple[str, CompactorView]:
    return id_, CompactorView(id=id_, state=state, ecid=ecid, remaining_s=remaining_s)  # type: ignore[arg-type]


def test_scale_up_sets_replicas_at_once() -> None:
    d = decide_scale(2, 5, pods("a", "b"), dict([beat("a"), beat("b")]))
    assert d.replicas == 5 and not d.drain and not d.delete


def test_scale_down_drains_idle_first_and_waits() -> None:
    comps = dict([beat("a", "busy", "e1"), beat("b"), beat("c", "busy", "e2")])
    d = decide_scale(3, 2, pods("a", "b", "c"), comps)
    assert d.victims == ("b",) and d.drain == ("b",) and d.mark == ("b",)
    assert d.replicas == 3, "replicas fall only after the victim drained"
    # b acknowledged the drain: it gets the lowest cost, still no removal in this pass
    comps["b"] = CompactorView("b", "draining")
    d = decide_scale(3, 2, pods("a", "b", "c", b={"marked": True}), comps)
    assert d.lowest_cost == ("b",) and d.replicas == 3 and not d.drain
    # next pass: b carries the cost, so the replicas drop by one
    d = decide_scale(3, 2, pods("a", "b", "c", b={"marked": True, "lowest_cost": True}), comps)
    assert d.replicas == 2 and d.victims == ("b",) and not d.waiting


def test_under_load_the_jobs_that_end_soonest_are_drained_then_removed() -> None:
    """Every compactor busy (the queue never empty), the cap lowered 3 -> 1: the two whose jobs
    end soonest are asked to drain at once, finish their jobs, and only then go."""
    comps = dict([beat("a", "busy", "e1", 50.0), beat("b", "busy", "e2", 4.0), beat("c", "busy", "e3", 9.0)])
    d = decide_scale(3, 1, pods("a", "b", "c"), comps)
    assert d.victims == ("b", "c") and d.drain == ("b", "c") and d.mark == ("b", "c")
    assert d.replicas == 3 and d.waiting == ("b", "c") and not d.lowest_cost, "no busy pod gets the cost"
    # they acknowledged: still finishing their jobs, nothing more to ask; a's job got shorter
    # meanwhile, yet the victims stay those asked first (no churn)
    comps.update([beat("a", "busy", "e1", 1.0), beat("b", "draining", "e2", 2.0), beat("c", "draining", "e3", 7.0)])
    marked = {"b": {"marked": True}, "c": {"marked": True}}
    d = decide_scale(3, 1, pods("a", "b", "c", **marked), comps)
    assert d.victims == ("b", "c") and not d.drain and d.replicas == 3 and d.waiting == ("b", "c")
    # b finished its job: drained, it gets the lowest cost, then goes; c is still waited for
    comps.update([beat("b", "draining")])
    d = decide_scale(3, 1, pods("a", "b", "c", **marked), comps)
    assert d.lowest_cost == ("b",) and d.replicas == 3
    d = decide_scale(3, 1, pods("a", "b", "c", b={"marked": True, "lowest_cost": True}, c={"marked": True}), comps)
    assert d.replicas == 2 and d.waiting == ("c",)


def test_idle_compactors_go_before_busy_ones() -> None:
    comps = dict([beat("a", "busy", "e1", 1.0), beat("b"), beat("c", "busy", "e2", 99.0)])
    d = decide_scale(3, 1, pods("a", "b", "c"), comps)
    assert d.victims == ("b", "a") and set(d.drain) == {"a", "b"}


def test_a_job_without_an_estimate_ends_last() -> None:
    comps = dict([beat("a", "busy", "e1"), beat("b", "busy", "e2", 600.0)])
    d = decide_scale(2, 1, pods("a", "b"), comps)
    assert d.victims == ("b",)


def test_a_compactor_already_draining_goes_before_an_idle_one() -> None:
    comps = dict([beat("a"), beat("b", "draining", "e1", 30.0)])
    d = decide_scale(2, 1, pods("a", "b"), comps)
    assert d.victims == ("b",) and d.drain == ("b",) and d.waiting == ("b",)


def test_a_drained_pod_that_is_not_a_victim_is_replaced() -> None:
    """Drained by hand (or asked before the target went back up): it would take no job until its
    pod is gone, so the pod is deleted and the Deployment makes a fresh one."""
    comps = dict([beat("a", "draining"), beat("b")])
    d = decide_scale(2, 2, pods("a", "b"), comps)
    assert d.delete == ("a",) and d.replicas == 2
    comps = dict([beat("a", "draining"), beat("b", "draining"), beat("c")])
    d = decide_scale(3, 2, pods("a", "b", "c", b={"marked": True}), comps)
    assert d.victims == ("b",) and d.delete == ("a",)


def test_draining_with_a_job_is_waited_for() -> None:
    comps = dict([beat("a", "draining", "e1")])
    d = decide_scale(1, 0, pods("a", a={"marked": True}), comps)
    assert d.replicas == 1 and d.waiting == ("a",) and d.drain == ()


def test_pods_without_heartbeat_go_first_when_not_ready() -> None:
    comps = dict([beat("a"), beat("b")])
    d = decide_scale(3, 2, pods("a", "b", "new", new={"ready": False}), comps)
    assert d.victims == ("new",) and d.drain == ("new",) and d.lowest_cost == ("new",)


def test_no_removal_while_a_working_pod_carries_the_victim_cost() -> None:
    comps = dict([beat("a", "draining"), beat("b", "busy", "e")])
    views = pods("a", "b", a={"marked": True, "lowest_cost": True}, b={"marked": True, "lowest_cost": True})
    d = decide_scale(2, 1, views, comps)
    assert d.replicas == 2 and "b" in d.unmark


def test_earlier_victims_are_kept_no_churn() -> None:
    comps = dict([beat("a"), beat("b", "draining"), beat("c")])
    d = decide_scale(3, 2, pods("a", "b", "c", c={"marked": True}), comps)
    assert d.victims == ("c",)


def test_scale_back_up_replaces_drained_and_unmarks_others() -> None:
    comps = dict([beat("a", "draining"), beat("b", "busy", "e")])
    d = decide_scale(2, 3, pods("a", "b", a={"marked": True}, b={"marked": True}), comps)
    assert d.replicas == 3 and d.delete == ("a",) and d.unmark == ("b",)


def test_terminating_pods_are_ignored() -> None:
    comps = dict([beat("a"), beat("b")])
    d = decide_scale(2, 1, pods("a", "b", a={"terminating": True}), comps)
    assert d.victims == ("b",)


@given(
    states=st.lists(st.sampled_from(["idle", "busy", "draining", "draining-job", "none"]), min_size=0, max_size=12),
    desired=st.integers(0, 12),
    marks=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_never_removes_a_working_compactor(states: list[str], desired: int, marks: list[bool]) -> None:
    names = [f"p{i}" for i in range(len(states))]
    comps: dict[str, CompactorView] = {}
    for name, state in zip(names, states, strict=True):
        if state == "none":
            continue
        ecid = "e" if state in ("busy", "draining-job") else None
        comps[name] = CompactorView(name, "draining" if state == "draining-job" else state, ecid)  # type: ignore[arg-type]
    views = [PodView(n, marked=m, lowest_cost=m) for n, m in zip(names, marks, strict=False)]
    current = len(names)
    d = decide_scale(current, desired, views, comps)
    working = {n for n, c in comps.items() if c.working}
    assert not working & set(d.delete) and not working & set(d.lowest_cost)
    if d.replicas < current:
        assert not any(v.lowest_cost and v.name in working for v in views)
    for name in working & set(d.victims):  # asked to drain (or draining already), waited for
        assert name in d.waiting and (name in d.drain or comps[name].state == "draining")
    assert len(d.victims) == min(len(views), max(0, current - desired))
    assert d.replicas >= desired
    if desired < current:
        removed = current - d.replicas
        # every removed replica corresponds to a pod carrying the lowest cost that is not working
        cheap = [v for v in views if v.lowest_cost and v.name not in working]
        assert removed <= len(cheap)


# -- scale to zero and back under an HPA ----------------------------------------------------------
def test_a_parked_group_wakes_at_its_first_job() -> None:
    assert parked_replicas(None, work=1, idle_s=0, window_s=300) == 1
    assert parked_replicas(0, work=5, idle_s=0, window_s=300) == 1  # the HPA takes it from 1
    assert parked_replicas(0, work=0, idle_s=9999, window_s=300) is None  # nothing to do: stays at 0


def test_a_group_parks_only_at_the_hpas_floor_after_a_quiet_window() -> None:
    assert parked_replicas(1, work=0, idle_s=299, window_s=300) is None
    assert parked_replicas(1, work=0, idle_s=300, window_s=300) == 0
    assert parked_replicas(1, work=1, idle_s=9999, window_s=300) is None  # a job queued or running
    assert parked_replicas(3, work=0, idle_s=9999, window_s=300) is None  # the HPA lowers it to 1 first


def test_without_pod_deletion_cost_a_drained_victim_goes_only_once_not_ready() -> None:
    """Kubernetes 1.20 ignores pod-deletion-cost and removes NotReady pods first: lowering the
    replicas while the drained victim still looks Ready lets the ReplicaSet take another pod
    (and the Deployment then starts a third). The replicas drop only once the victim is NotReady."""
    comps = dict([beat("a"), beat("b", "draining")])
    victim = {"marked": True, "lowest_cost": True}
    d = decide_scale(2, 1, pods("a", "b", b=victim), comps, deletion_cost=False)
    assert d.replicas == 2 and d.waiting == ("b",) and d.victims == ("b",)
    d = decide_scale(2, 1, pods("a", "b", b={**victim, "ready": False}), comps, deletion_cost=False)
    assert d.replicas == 1 and d.waiting == ()
    # where the cost is honoured, the cost alone is enough (one pass sooner)
    assert decide_scale(2, 1, pods("a", "b", b=victim), comps).replicas == 1


def test_without_pod_deletion_cost_a_victim_that_never_reported_goes_at_once() -> None:
    """A pod whose compactor never sent a heartbeat (it runs none, or never started) has no
    drained compactor whose readiness probe would fail: waiting for NotReady would wait forever
    (the HPA test's group of pods without compactors never scaled down)."""
    comps = dict([beat("a")])
    victim = {"marked": True, "lowest_cost": True}
    d = decide_scale(2, 1, pods("a", "b", b=victim), comps, deletion_cost=False)
    assert d.replicas == 1 and d.victims == ("b",) and d.waiting == ()
