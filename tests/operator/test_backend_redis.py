"""backend.RedisBackend (the operator's Redis backend) against a real redis-server and the core store."""

from __future__ import annotations

import time

import pytest

from kompaktor.metadata import compactions
from kompaktor.metadata import user_compactions as usercompaction
from kompaktor.model.job import Job
from kompaktor.model.tablet import FileMeta
from kompaktor.resources import models as m
from kompaktor.resources.operator_config import OperatorConfig
from kompaktor_operator import backend as backends
from kompaktor_operator.runtime import Runtime

pytestmark = [pytest.mark.operator, pytest.mark.redis]


def test_configs_heartbeats_drain_and_figures(redis_url: str) -> None:
    backend = backends.RedisBackend(redis_url)
    svc = m.CompactionServiceSpec.model_validate(
        {
            "tiers": [
                {"name": "small", "maxSize": "32Mi", "compactorGroup": "small"},
                {"name": "large", "compactorGroup": "large"},
            ]
        }
    )
    backend.put_service(m.to_service_config("cs1", svc))
    backend.put_group(m.to_group_config("small", m.CompactorGroupSpec(max_replicas=3)))
    assert backend.store.fleet.groups()["small"].max_replicas == 3
    backend.store.fleet.register_compactor("small", "pod-a", "idle")
    backend.store.fleet.register_compactor("small", "pod-b", "busy", "ECID-1")
    beats = backend.compactors("small")
    assert beats["pod-a"].state == "idle" and beats["pod-b"].working
    assert beats["pod-b"].remaining_s is None  # the job has not said how long it needs yet
    # the job's heartbeat says 30 s left, as of 10 s ago: 20 s now (what scale-down ranks by)
    backend.store.running.put_heartbeat(
        "ECID-1", {"compactor": "pod-b", "updated": time.time() - 10, "remaining_s": "30.0"}
    )
    assert 19 < (backend.compactors("small")["pod-b"].remaining_s or 0) <= 20
    backend.request_drain("pod-a")
    assert backend.store.fleet.drain_requested("pod-a")
    assert backend.queue_figures("small") == backends.QueueFigures(
        queued=0, running=0, rejected=0, dead_lettered=0, oldest_age_s=0.0
    )
    # two queued jobs, one of them reserved: the figures the HPA's metric adds up
    backend.store.tables.create_table("t", splits=[b"m"])
    tablets = backend.store.tables.tablets(backend.store.tables.table_id("t"))
    files = {f"tables/x/F{i}.parquet": FileMeta(10, 1, 0, row, row) for i, row in enumerate((b"a", b"b", b"x"))}
    backend.store.files.add_files("t", files)
    for t in tablets:
        backend.store.queues.add(t.id, [Job(t.id, "SYSTEM", 100, "small", {f: 10 for f in t.files})])
    assert compactions.reserve(backend.store, backend.store.queues, "small", "pod-b") is not None
    figures = backend.queue_figures("small")
    assert (figures.queued, figures.running, figures.rejected, figures.dead_lettered) == (1, 1, 0, 0)
    backend.delete_group("small")
    backend.delete_service("cs1")
    assert "small" not in backend.store.fleet.groups()


def test_user_compaction_starts_once_per_request(redis_url: str) -> None:
    backend = backends.RedisBackend(redis_url)
    backend.store.tables.create_table("ci", splits=[b"m"])
    first = backend.start_compaction("uid-1", "ci", None, None, {"ageoff_ttl_ms": 1000})
    again = backend.start_compaction("uid-1", "ci", None, None, {"ageoff_ttl_ms": 1000})
    assert first == again
    progress = backend.compaction_progress(first)  # no coordinator runs: it cannot have finished
    assert (progress.phase, progress.tablets_done, progress.tablets_total) == ("Running", 0, 2)
    assert len(usercompaction.all_compactions(backend.store)) == 1  # the replay started nothing
    backend.cancel_compaction(first)
    assert backend.compaction_progress(first).phase == "Cancelled"
    with pytest.raises(backends.CompactionRejected):
        backend.start_compaction("uid-2", "no-such-table", None, None, {})


def test_redis_going_away_is_backend_unavailable(redis_url: str) -> None:
    from tests.support.ports import free_port

    backend = backends.RedisBackend(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    for call in (
        lambda: backend.compactors("g"),
        lambda: backend.queue_figures("g"),
        lambda: backend.start_compaction("uid", "t", None, None, {}),
    ):
        with pytest.raises(backends.BackendUnavailable, match="unreachable"):
            call()


def test_unreachable_redis_is_a_retry(redis_url: str) -> None:
    rt = Runtime(config=OperatorConfig(), redis_url=None)  # no --redis, no KOMPAKTOR_REDIS_URL
    with pytest.raises(backends.BackendUnavailable, match="KOMPAKTOR_REDIS_URL is not set"):
        rt.backend()
    from tests.support.ports import free_port

    rt = Runtime(config=OperatorConfig(), redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(backends.BackendUnavailable):
        rt.backend().queue_figures("g")
    rt.use_backend(None)
