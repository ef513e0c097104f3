"""depth.RedisBackend against a real redis-server and the core store."""

from __future__ import annotations

import pytest

from kompaktor_operator import depth
from kompaktor_operator import models as m

pytestmark = [pytest.mark.operator, pytest.mark.redis]


def test_configs_heartbeats_drain_and_figures(redis_url: str) -> None:
    backend = depth.RedisBackend(redis_url)
    svc = m.CompactionServiceSpec.model_validate(
        {"tiers": [{"name": "small", "maxSize": "32Mi", "compactorGroup": "small"},
                   {"name": "large", "compactorGroup": "large"}]})
    backend.put_service(m.to_service_config("cs1", svc))
    backend.put_group(m.to_group_config("small", m.CompactorGroupSpec(max_replicas=3)))
    assert backend.store.groups()["small"].max_replicas == 3
    backend.store.register_compactor("small", "pod-a", "idle")
    backend.store.register_compactor("small", "pod-b", "busy", "ECID-1")
    beats = backend.compactors("small")
    assert beats["pod-a"].state == "idle" and beats["pod-b"].working
    backend.request_drain("pod-a")
    assert backend.store.drain_requested("pod-a")
    figures = backend.queue_figures("small")
    assert figures.queued == 0 and figures.running >= 0
    backend.delete_group("small")
    backend.delete_service("cs1")
    assert "small" not in backend.store.groups()


def test_user_compaction_starts_once_per_request(redis_url: str) -> None:
    backend = depth.RedisBackend(redis_url)
    backend.store.create_table("ci", splits=[b"m"])
    first = backend.start_compaction("uid-1", "ci", None, None, {"ageoff_ttl_ms": 1000})
    again = backend.start_compaction("uid-1", "ci", None, None, {"ageoff_ttl_ms": 1000})
    assert first == again
    progress = backend.compaction_progress(first)
    assert progress.phase in ("Running", "Succeeded") and progress.tablets_total == 2
    backend.cancel_compaction(first)
    assert backend.compaction_progress(first).phase in ("Cancelled", "Succeeded")
    with pytest.raises(depth.CompactionRejected):
        backend.start_compaction("uid-2", "no-such-table", None, None, {})


def test_unreachable_redis_is_a_retry(redis_url: str) -> None:
    depth.set_backend(None)
    try:
        with pytest.raises(depth.BackendUnavailable):
            depth.backend()  # KOMPAKTOR_REDIS_URL is unset in tests
    finally:
        depth.set_backend(None)
