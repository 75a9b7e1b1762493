"""Getting the CommitLog to disk: ASYNC_FLUSH's background flusher and SYNC_FLUSH's group commit.

Group commit: an appender in SYNC_FLUSH mode gets a Future for its end offset. One thread takes
every request pending at that moment and fsyncs once up to the log's current end, which covers
all of them and whatever arrived meanwhile; then it completes their Futures. Sixty-four
concurrent appenders therefore cost about one fsync per round, not sixty-four.

The fsync runs outside the append lock and releases the GIL, so appends continue meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from orbitmq.common.errors import StoreClosedError, StoreError
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.supervise import ServiceHealth

log = logging.getLogger(__name__)
PAGE = 4096

FlushListener = Callable[[int, BaseException | None], None]
"""Called on the flush thread after each fsync: (flushed offset, error or None)."""


class FlushService:
    """Background flushing of the CommitLog in the configured mode."""

    def __init__(self, commit_log: CommitLog, config: StoreConfig) -> None:
        self.commit_log = commit_log
        self.config = config
        self.sync = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self._cond = threading.Condition()
        self._pending: list[tuple[int, Future[None]]] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self._last_thorough = time.monotonic()
        self._wanted = 0  # highest offset someone waits for without a Future (request_offset)
        self.listeners: list[FlushListener] = []
        self.fsync_count = 0
        self.last_fsync_s = 0.0
        """How long the latest flush took (for metrics: listeners read it)."""
        self.health = ServiceHealth("flusher")

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="orbitmq-flush", daemon=True)
        self._thread.start()

    def request(self, offset: int) -> Future[None]:
        """A Future that completes once the CommitLog is fsynced up to ``offset``."""
        fut: Future[None] = Future()
        if self.commit_log.flushed_offset >= offset:
            fut.set_result(None)
            return fut
        with self._cond:
            if self._stop:
                fut.set_exception(StoreClosedError("store is closing"))
                return fut
            self._pending.append((offset, fut))
            self._cond.notify()
        return fut

    def request_offset(self, offset: int) -> None:
        """Ask for an fsync up to ``offset`` without a Future per request: callers learn of it
        through ``listeners`` (one call per fsync, however many requests it covered)."""
        if offset <= self.commit_log.flushed_offset:
            return
        with self._cond:
            if offset > self._wanted:
                self._wanted = offset
                self._cond.notify()

    def forget_beyond(self, offset: int) -> None:
        """The log was cut at ``offset`` (replication's truncation): a wish to flush past it
        can never come true, and left in place would keep the flush thread spinning."""
        with self._cond:
            self._wanted = min(self._wanted, offset)

    def _run(self) -> None:
        interval = self.config.flush_interval_commit_log_ms / 1000
        while True:
            with self._cond:
                wanted = self._wanted > self.commit_log.flushed_offset
                if not self._pending and not wanted and not self._stop:
                    self._cond.wait(interval)
                    wanted = self._wanted > self.commit_log.flushed_offset
                batch, self._pending = self._pending, []
                stopping = self._stop
            try:
                if batch or wanted or stopping:
                    self._flush_batch(batch)
                elif self._async_due():
                    self._flush_batch([])
            except Exception as exc:  # noqa: BLE001 - supervised: waiters learn of it, loop goes on
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                self._tell(self.commit_log.flushed_offset, exc)
                if stopping:
                    return
                time.sleep(self.health.failed(exc))
                continue
            if stopping:
                return

    def _async_due(self) -> bool:
        dirty = self.commit_log.max_offset - self.commit_log.flushed_offset
        if dirty <= 0:
            return False
        thorough_s = self.config.flush_commit_log_thorough_interval_ms / 1000
        return (
            dirty >= self.config.flush_commit_log_least_pages * PAGE
            or time.monotonic() - self._last_thorough >= thorough_s
        )

    def _flush_batch(self, batch: list[tuple[int, Future[None]]]) -> None:
        try:
            began = time.perf_counter()
            self.commit_log.flush()
            self.last_fsync_s = time.perf_counter() - began
            self.fsync_count += 1
            self._last_thorough = time.monotonic()
        except StoreError as exc:
            self.health.failed(exc)
            for _, fut in batch:
                fut.set_exception(exc)
            self._tell(self.commit_log.flushed_offset, exc)
            return
        self.health.ok()
        flushed = self.commit_log.flushed_offset
        self._tell(flushed, None)
        for offset, fut in batch:
            if offset <= flushed:
                fut.set_result(None)
            else:  # cannot happen: flush() covers the end at the time of the call
                fut.set_exception(StoreError(f"flush stopped at {flushed} < {offset}"))

    def _tell(self, flushed: int, error: BaseException | None) -> None:
        for listener in self.listeners:
            try:
                listener(flushed, error)
            except Exception:
                log.exception("flush listener failed")

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class PeriodicService:
    """Runs ``fn`` every ``interval_s`` on its own thread, supervised: a failure is logged once
    per outage with its cause, counted (``health``), and retried after a backoff no longer
    than the interval."""

    def __init__(self, name: str, interval_s: float, fn: Callable[[], None]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.fn = fn
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self.health = ServiceHealth(name.removeprefix("orbitmq-"))

    @property
    def failures(self) -> int:
        return self.health.failures

    def start(self) -> None:
        self._stop.clear()
        self._kick.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run now rather than at the end of the interval."""
        self._kick.set()

    def _run(self) -> None:
        wait = self.interval_s
        while True:
            self._kick.wait(wait)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                self.fn()
            except Exception as exc:  # noqa: BLE001 - supervised: reported and retried
                wait = min(self.interval_s, self.health.failed(exc))
                continue
            self.health.ok()
            wait = self.interval_s

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
