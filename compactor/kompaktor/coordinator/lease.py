"""The coordinator's leadership: a Redis lease with a fencing token taken at each takeover."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kompaktor.metadata.store import MetadataStore

log = logging.getLogger("kompaktor.coordinator")


@dataclass
class Lease:
    store: MetadataStore
    holder: str
    lease_ms: int = 10_000
    fence: int | None = None  # the fencing token while this holder leads

    @property
    def held(self) -> bool:
        return self.fence is not None

    def acquire_or_renew(self) -> bool:
        """Take or keep the lease. Returns whether this holder leads now; a new leader gets a new
        fencing token."""
        if self.fence is not None:
            if self.store.renew_lease(self.holder, self.lease_ms):
                return True
            log.warning("%s lost the coordinator lease", self.holder)
            self.fence = None
        fence = self.store.acquire_lease(self.holder, self.lease_ms)
        if fence is None:
            return False
        self.fence = fence
        log.info("%s leads (fencing token %d)", self.holder, fence)
        return True

    def release(self) -> None:
        if self.fence is not None:
            self.store.release_lease(self.holder)
        self.fence = None
