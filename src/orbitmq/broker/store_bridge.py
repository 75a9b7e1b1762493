"""The bridge between the broker's event loop and the blocking store.

Appends run on one writer thread (the store serialises them anyway). Sends that arrive while
the writer is busy queue up and go to it together, so under load one thread hand-off carries
many appends instead of one each. In SYNC_FLUSH a send then waits on a plain asyncio Future;
the store's flusher reports each fsync once, and one callback on the loop completes every send
it covered (group commit without a Future per message crossing threads).

Overload is answered quickly: beyond ``capacity`` waiting sends, or once a send has waited
``wait_timeout_ms`` for the writer, the broker replies SYSTEM_BUSY instead of letting clients
time out (RocketMQ's "broker busy", with the wait made explicit). Reads run on a small pool.

The writer is supervised like the store's services (``health``): if handing jobs to it or a
whole batch of jobs fails, every send of that batch gets the error (none is left waiting),
the failure is logged once and counted, and the next send tries again. A failing metrics
callback never turns a stored message into a failed send.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from orbitmq.common.errors import FlushTimeoutError, StoreClosedError, SystemBusyError
from orbitmq.common.message import MessageBatch
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import MessageStore
from orbitmq.store.supervise import ServiceHealth

log = logging.getLogger(__name__)

T = TypeVar("T")
_Job = tuple[MessageBatch, "asyncio.Future[AppendResult]", float]


class StoreBridge:
    def __init__(
        self,
        store: MessageStore,
        capacity: int,
        wait_timeout_ms: int,
        on_append: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.on_append = on_append
        """Called on the writer thread with each append's duration (metrics)."""
        self.capacity = capacity
        self.wait_timeout_s = wait_timeout_ms / 1000
        self.busy_rejections = 0
        self.health = ServiceHealth("writer")
        self._watched: list[ServiceHealth] = []
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="orbitmq-store-write")
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="orbitmq-store-read")
        self._queue: list[_Job] = []
        self._in_writer = 0
        self._writer_busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # (end offset, seq, future, deadline, result): a heap by offset, which is also the
        # order of their deadlines, so one timer checks the oldest instead of one per send.
        self._flush_waiters: list[tuple[int, int, asyncio.Future[None], float, AppendResult]] = []
        self._expiry: asyncio.TimerHandle | None = None
        self._seq = itertools.count()
        self._listening = False

    @property
    def pending(self) -> int:
        return len(self._queue) + self._in_writer

    # ------------------------------------------------------------------ appends

    async def put(self, batch: MessageBatch) -> AppendResult:
        """Append and, in SYNC_FLUSH, wait for the fsync. Raises SystemBusyError when full."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if self.pending >= self.capacity:
            self.busy_rejections += 1
            raise SystemBusyError(f"{self.pending} sends are waiting for the store")
        fut: asyncio.Future[AppendResult] = loop.create_future()
        self._queue.append((batch, fut, time.monotonic()))
        if not self._writer_busy:
            self._kick()
        try:
            result = await fut
        except SystemBusyError:
            self.busy_rejections += 1
            raise
        if self.store.sync_flush and self.store.commit_log.flushed_offset < result.end_offset:
            await self._wait_flushed(result)
        return result

    def _kick(self) -> None:
        assert self._loop is not None
        jobs, self._queue = self._queue, []
        self._writer_busy = True
        self._in_writer = len(jobs)
        try:
            done = self._writer.submit(self._run_jobs, jobs)
        except RuntimeError as exc:  # shut down: fail the sends rather than strand them
            self.health.failed(exc)
            self._writer_busy = False
            self._in_writer = 0
            for _batch, fut, _t in jobs:
                if not fut.done():
                    fut.set_exception(StoreClosedError(f"store writer unavailable: {exc}"))
            return
        loop = self._loop
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._jobs_done, jobs, f))

    def _run_jobs(self, jobs: list[_Job]) -> list[AppendResult | BaseException]:
        """On the writer thread: every queued append, in arrival order."""
        out: list[AppendResult | BaseException] = []
        now = time.monotonic()
        for batch, _fut, queued_at in jobs:
            waited = now - queued_at
            if waited > self.wait_timeout_s:
                out.append(SystemBusyError(f"send waited {waited * 1000:.0f} ms for the store"))
                continue
            try:
                began = time.perf_counter()
                out.append(self.store.append(batch))
            except Exception as exc:  # noqa: BLE001 - goes to that send's Future; others go on
                out.append(exc)
                continue
            if self.on_append is not None:
                try:
                    self.on_append(time.perf_counter() - began)
                except Exception:  # the message is stored: a metric must not fail its send
                    log.exception("append listener failed")
        return out

    def _jobs_done(
        self, jobs: list[_Job], done: Future[list[AppendResult | BaseException]]
    ) -> None:
        self._writer_busy = False
        self._in_writer = 0
        try:
            results = done.result()
        except BaseException as exc:  # noqa: BLE001 - the writer itself failed (shut down)
            self.health.failed(exc)
            results = [exc] * len(jobs)
        else:
            self.health.ok()
        for (_batch, fut, _t), result in zip(jobs, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        if self._queue:
            self._kick()

    # ------------------------------------------------------------------ group commit

    async def _wait_flushed(self, result: AppendResult) -> None:
        assert self._loop is not None
        if not self._listening:
            self._listening = True
            self.store.add_flush_listener(self._on_flushed)
        loop = self._loop
        fut: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + self.store.config.sync_flush_timeout_ms / 1000
        heapq.heappush(
            self._flush_waiters, (result.end_offset, next(self._seq), fut, deadline, result)
        )
        if self._expiry is None:
            self._expiry = loop.call_later(0.1, self._expire)
        self.store.request_flush(result.end_offset)
        await fut

    def _expire(self) -> None:
        """Fail sends whose fsync has not come within sync_flush_timeout_ms."""
        assert self._loop is not None
        self._expiry = None
        now = self._loop.time()
        waiters = self._flush_waiters
        while waiters and waiters[0][3] <= now:
            _o, _s, fut, _d, result = heapq.heappop(waiters)
            if not fut.done():
                timeout = self.store.config.sync_flush_timeout_ms / 1000
                err = FlushTimeoutError(f"not fsynced within {timeout:.1f}s")
                err.result = result  # stored, not yet durable: the sender learns where
                fut.set_exception(err)
        if waiters:
            self._expiry = self._loop.call_later(0.1, self._expire)

    def _on_flushed(self, flushed: int, error: BaseException | None) -> None:
        """On the flush thread: hand the news to the loop once."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._complete, flushed, error)

    def _complete(self, flushed: int, error: BaseException | None) -> None:
        waiters = self._flush_waiters
        if error is not None:  # after a failed fsync nothing pending can be trusted
            while waiters:
                _o, _s, fut, _d, _r = heapq.heappop(waiters)
                if not fut.done():
                    fut.set_exception(error)
            return
        while waiters and waiters[0][0] <= flushed:
            _o, _s, fut, _d, _r = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ health

    def watch(self, *services: ServiceHealth) -> None:
        """Add the broker's own supervised services (reviver, timer, ...) to the health."""
        self._watched.extend(services)

    def degraded(self) -> dict[str, str]:
        """What is degraded in the store, the writer and the watched broker services, with
        causes (empty: healthy)."""
        out = self.store.health()
        for h in (self.health, *self._watched):
            cause = h.degraded
            if cause is not None:
                out[h.name] = cause
        return out

    def failure_counts(self) -> dict[str, int]:
        """Failed turns so far of every supervised service (store services and the writer)."""
        counts = {h.name: h.failures for h in self.store.services()}
        for h in (self.health, *self._watched):
            counts[h.name] = h.failures
        counts["read"] = self.store.read_errors  # reads failed by an I/O error
        return counts

    def health_text(self) -> str:
        """One line for runtime info / ``orbitmq cluster list``: "ok" or "part: cause; ..."."""
        degraded = self.degraded()
        return "; ".join(f"{k}: {v}" for k, v in sorted(degraded.items())) if degraded else "ok"

    # ------------------------------------------------------------------ other calls

    async def read(self, fn: Callable[..., T], *args: object) -> T:
        """Run a store read off the loop (mapped pages may have to come from disk)."""
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run another blocking store call (open, close, checkpoint) off the loop."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        for _o, _s, fut, _d, _r in self._flush_waiters:
            if not fut.done():
                fut.get_loop().call_soon_threadsafe(
                    _fail, fut, StoreClosedError("broker is stopping")
                )
        self._flush_waiters.clear()


def _fail(fut: asyncio.Future[None], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
