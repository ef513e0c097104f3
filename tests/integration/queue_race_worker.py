"""Code run in spawned processes by test_jobqueue.py's reserve races (a plain module so that
multiprocessing's spawn start method can import it in the child)."""

from __future__ import annotations


def reserve_all(url: str, groups: list[str], compactor: str, barrier) -> list[tuple[str, str, list[str]]]:
    """Reserve from ``groups`` (round robin) until every one is empty; returns (ecid, tablet,
    files) of each reservation."""
    from kompaktor.metadata import compactions
    from kompaktor.metadata.store import MetadataStore

    store = MetadataStore.from_url(url)
    try:
        queues = store.queues
        barrier.wait(timeout=60)
        got: list[tuple[str, str, list[str]]] = []
        live = list(groups)
        while live:
            for g in list(live):
                res = compactions.reserve(store, queues, g, compactor)
                if res is None:
                    live.remove(g)
                else:
                    got.append((res.ecid, res.tablet, list(res.inputs)))
        return got
    finally:
        store.close()
