"""Supervision of the store's background services: a failing service is reported, not dead.

Every background loop (dispatcher, flusher, checkpoint, retention; the broker's writer thread
and its asyncio loops -- Pop reviver and FIFO expiry, timer, transaction check-back, offset
writer, housekeeping, NameServer registration -- use the same record) holds a
:class:`ServiceHealth`. It has no lock held across a wait, so an asyncio loop uses it as is:
``await asyncio.sleep(health.failed(exc))``. When one turn of the loop raises, the loop
calls ``failed(exc)``: the first failure of an outage is logged once with its cause (the
traceback), every one is counted, and the loop waits the returned backoff (doubling from
``BACKOFF_MIN_S`` to ``BACKOFF_MAX_S``) before it tries again. The first turn that succeeds
calls ``ok()``, which logs the recovery and clears the cause. ``degraded`` is the cause while the
outage lasts: the store's ``health()`` collects these, so an operator (``orbitmq cluster list``,
the ``orbitmq_service_failures`` metric) sees what is degraded and why, and the store
refuses sends while the service that makes them visible is failing.

Why not let the thread die: a dead dispatcher used to leave the broker acknowledging messages no
consumer could ever read (issue #14). Why log once: a loop retrying every second against a full
disk would otherwise bury everything else in the log.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 5.0


class ServiceHealth:
    """The failure record of one background service. Thread-safe for readers (plain fields)."""

    __slots__ = ("_lock", "_streak", "degraded", "failures", "name", "since")

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0
        """Failed turns since start (a counter for metrics)."""
        self.degraded: str | None = None
        """The cause of the current outage, None while the service works."""
        self.since = 0.0
        self._streak = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> float:
        """Record a failed turn; returns how long to wait before the next try."""
        with self._lock:
            self.failures += 1
            self._streak += 1
            first = self.degraded is None
            self.degraded = f"{type(exc).__name__}: {exc}"
            if first:
                self.since = time.monotonic()
            streak = self._streak
        if first:
            log.error("%s failed; retrying with backoff until it works", self.name, exc_info=exc)
        return float(min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(streak - 1, 16)))

    def ok(self) -> None:
        """Record a turn that worked: ends the outage (logged) if there was one."""
        if self.degraded is None:
            return
        with self._lock:
            cause, self.degraded, self._streak = self.degraded, None, 0
            lasted = time.monotonic() - self.since
        log.warning("%s works again after %.1f s (was: %s)", self.name, lasted, cause)
