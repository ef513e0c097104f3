"""The coordinator: one leader (:mod:`.lease`) that plans changed tablets into the group queues
(:mod:`.core`), advances user compactions, detects dead compactions (:mod:`.dead`),
garbage-collects files (:mod:`.gc`) and exports the queue metrics (:mod:`.metrics`)."""

from kompaktor.coordinator.core import Coordinator, CoordinatorSettings

__all__ = ["Coordinator", "CoordinatorSettings"]
