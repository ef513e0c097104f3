"""The compactor process: the job loop (:mod:`.compactor`), its HTTP endpoints (:mod:`.http`)
and its metrics (:mod:`.metrics`)."""

from kompaktor.worker.compactor import BUSY, DRAINING, IDLE, Compactor, JobOutcome, WorkerSettings

__all__ = ["BUSY", "DRAINING", "IDLE", "Compactor", "JobOutcome", "WorkerSettings"]
