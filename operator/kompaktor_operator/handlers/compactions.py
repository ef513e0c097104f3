"""Compaction handlers: a user compaction started once per resource (its uid), tracked until it
ends, cancelled when the resource is deleted; its spec cannot change.
"""

from __future__ import annotations

from typing import Any

import kopf

from kompaktor.resources import api
from kompaktor.resources import models as m
from kompaktor_operator import conditions, runtime
from kompaktor_operator.backend import CompactionRejected
from kompaktor_operator.handlers.common import backend_call, counted, mark, now, parse, refused


def terminal(status: kopf.Status) -> bool:
    phase = status.get("phase")
    return phase is not None and m.CompactionPhase(phase).terminal


@counted(api.COMPACTION_KIND)
async def start_compaction(
    uid: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    rt = runtime.of(memo)
    if status.get("compactionId"):
        return  # already started (a replayed or resumed handler)
    generation = meta.get("generation")
    comp = parse(m.CompactionSpec, spec, patch, status, generation)
    start_row, end_row = comp.row_bytes()
    try:
        cid = await backend_call(
            rt, lambda b: b.start_compaction(uid, comp.table, start_row, end_row, comp.iterator_config())
        )
    except CompactionRejected as exc:
        refused()
        patch.status.update(
            {
                "phase": m.CompactionPhase.FAILED.value,
                "message": str(exc),
                "endTime": now(),
                "observedGeneration": generation,
            }
        )
        mark(patch, status, conditions.READY, False, "Rejected", str(exc), generation)
        return
    patch.status.update(
        {
            "compactionId": cid,
            "phase": m.CompactionPhase.SELECTING.value,
            "startTime": now(),
            "tabletsDone": 0,
            "observedGeneration": generation,
        }
    )
    mark(patch, status, conditions.READY, True, "Started", f"user compaction {cid} started", generation)


async def track_compaction(status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime.of(memo)
    cid = status.get("compactionId")
    if not cid or terminal(status):
        return
    progress = await backend_call(rt, lambda b: b.compaction_progress(cid))
    phase = progress.phase
    if (
        phase == m.CompactionPhase.RUNNING.value
        and progress.tablets_done == 0
        and status.get("phase") in (None, m.CompactionPhase.SELECTING.value)
    ):
        phase = m.CompactionPhase.SELECTING.value  # no tablet done yet: still selecting files
    patch.status.update(
        {
            "phase": phase,
            "tabletsDone": progress.tablets_done,
            "tabletsTotal": progress.tablets_total,
            "message": progress.message or None,
        }
    )
    if m.CompactionPhase(phase).terminal:
        patch.status["endTime"] = now()
        ok = phase == m.CompactionPhase.SUCCEEDED.value
        mark(patch, status, conditions.READY, ok, phase, progress.message, meta.get("generation"))


async def compaction_changed(status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
    """A Compaction's spec cannot change (the CRD's CEL rule says so where the server has CEL;
    this says it everywhere): the running compaction keeps the spec it started with."""
    if status.get("compactionId"):
        mark(
            patch,
            status,
            conditions.DEGRADED,
            True,
            "SpecChanged",
            "a Compaction cannot change; the running compaction keeps its original spec (delete it and create another)",
            meta.get("generation"),
        )


async def cancel_compaction(status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime.of(memo)
    cid = status.get("compactionId")
    if cid and not terminal(status):
        await backend_call(rt, lambda b: b.cancel_compaction(cid))


def not_terminal(status: kopf.Status, **_: Any) -> bool:
    return not terminal(status)
