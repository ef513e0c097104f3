"""The coordinator's leadership: a Redis lease with a fencing token taken at each takeover.

The lease is renewed by a thread of its own, every third of its length, whatever the coordinator
is doing (a long full scan included). The leader trusts its lease only until ``lease_ms`` (less a
margin for clock rate differences) after the start of the last renewal that succeeded, measured
on this process's monotonic clock, which keeps running while the process is stopped (SIGSTOP) or
the machine is suspended: :meth:`Lease.valid` turns false before Redis can give the lease to
another coordinator. That check is the coordinator's courtesy; the guarantee is the fencing
token: every write the coordinator makes carries :attr:`Lease.token` and is refused inside Redis
once a newer token exists (:meth:`kompaktor.metadata.store.MetadataStore.fenced`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from kompaktor.metadata.store import MetadataStore
from kompaktor.model.errors import KompaktorError

log = logging.getLogger("kompaktor.coordinator")

#: the share of the lease this holder trusts (Redis' expiry and our clock may run at different rates)
TRUST = 0.8


@dataclass
class Lease:
    store: MetadataStore
    holder: str
    lease_ms: int = 10_000
    fence: int | None = None  # the fencing token while this holder leads
    #: the last fencing token this holder was given (None: never led); the coordinator's writes
    #: carry it, so once another coordinator takes over they are refused even if this one missed it
    token: int | None = None
    _valid_until: float = field(default=0.0, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def held(self) -> bool:
        return self.fence is not None

    def valid(self) -> bool:
        """Whether this holder may act as leader now: it holds the lease and the last renewal is
        recent enough that the lease cannot have expired in Redis."""
        with self._lock:
            return self.fence is not None and time.monotonic() < self._valid_until

    def acquire_or_renew(self) -> bool:
        """Take or keep the lease. Returns whether this holder leads now; a new leader gets a new
        fencing token. The renewal itself runs in the background (:meth:`_renew_loop`)."""
        if self.fence is not None:
            if self.valid():
                return True
            log.warning("%s lost the coordinator lease (fencing token %d)", self.holder, self.fence)
            self.drop()
        started = time.monotonic()
        fence = self.store.lease.acquire_lease(self.holder, self.lease_ms)
        if fence is None:
            return False
        with self._lock:
            self.fence = self.token = fence
            self._valid_until = started + TRUST * self.lease_ms / 1000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, args=(fence, self._stop), name=f"lease-{self.holder}", daemon=True
        )
        self._thread.start()
        log.info("%s leads (fencing token %d)", self.holder, fence)
        return True

    def _renew_loop(self, fence: int, stop: threading.Event) -> None:
        every = self.lease_ms / 3000.0
        while not stop.wait(every):
            started = time.monotonic()
            try:
                ok = self.store.lease.renew_lease(self.holder, self.lease_ms)
            except KompaktorError as exc:  # Redis unreachable: the lease runs out unless a retry works
                log.warning("%s: lease renewal failed: %s", self.holder, exc)
                continue
            with self._lock:
                if stop.is_set() or self.fence != fence:
                    return
                if not ok:
                    self._valid_until = 0.0  # expired in Redis (and maybe taken): stop acting now
                    return
                self._valid_until = started + TRUST * self.lease_ms / 1000.0

    def drop(self) -> None:
        """Stop leading, without touching Redis (the lease is lost or about to be released)."""
        self._stop.set()
        with self._lock:
            self.fence = None
            self._valid_until = 0.0
        self._thread = None  # it ends after its call in flight, if any: the fence is no longer its own

    def release(self) -> None:
        fence = self.fence
        self.drop()
        if fence is not None:
            self.store.lease.release_lease(self.holder)  # compare and delete: never the next leader's lease
