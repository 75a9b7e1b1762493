"""The bridge between the broker's event loop and the blocking store.

One thread on the hot path (Redis's shape: group commit per loop iteration). Sends that arrive
during one loop iteration go on a list; one ``call_soon`` callback appends them all on the
loop thread as one store append (``MessageStore.append_many``: one lock, one ``pwrite``,
page cache only), then runs one inline dispatch round
(``MessageStore.dispatch_ready``), which makes them readable and wakes long-polled pulls on
this same thread. ASYNC_FLUSH replies at once. In SYNC_FLUSH each send's Future waits in a
heap by end offset; the drain asks the flusher once for the highest end, the flusher fsyncs
(GIL released) and reports once per fsync, and one callback on the loop completes every send
it covered: two hand-offs per fsync, none per message.

Batches with more than ``inline_max_bytes`` of bodies are appended on one writer thread
instead (encoding them would hold the loop); while the writer is busy, later sends queue
behind it, so appends stay in arrival order. ``inline_max_bytes=0`` puts every append on the
writer.

Overload is answered quickly: beyond ``capacity`` waiting sends, or once a send has waited
``wait_timeout_ms`` for the writer, the broker replies SYSTEM_BUSY instead of letting clients
time out (RocketMQ's "broker busy", with the wait made explicit). Reads run on a small pool
(the pull path reads the tail on the loop itself).

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
        inline_max_bytes: int = 256 * 1024,
    ) -> None:
        self.store = store
        self.on_append = on_append
        """Called with each append's duration (metrics), on the thread that appended."""
        self.capacity = capacity
        self.wait_timeout_s = wait_timeout_ms / 1000
        self.inline_max_bytes = inline_max_bytes
        self.busy_rejections = 0
        self.inline_appends = 0
        self.writer_appends = 0
        self.health = ServiceHealth("writer")
        self._watched: list[ServiceHealth] = []
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="orbitmq-store-write")
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="orbitmq-store-read")
        self._queue: list[_Job] = []
        self._in_writer = 0
        self._writer_busy = False
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # (end offset, seq, future, deadline, result): a heap by offset, which is also the
        # order of their deadlines, so one timer checks the oldest instead of one per send.
        self._flush_waiters: list[
            tuple[int, int, asyncio.Future[AppendResult], float, AppendResult]
        ] = []
        self._expiry: asyncio.TimerHandle | None = None
        self._seq = itertools.count()
        self._listening = False

    @property
    def pending(self) -> int:
        return len(self._queue) + self._in_writer

    # ------------------------------------------------------------------ appends

    async def put(self, batch: MessageBatch) -> AppendResult:
        """Append and, in SYNC_FLUSH, wait for the fsync. Raises SystemBusyError when full,
        FlushTimeoutError (carrying the result) when the fsync does not come in time."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            if not self._listening:
                self._listening = True
                self.store.add_flush_listener(self._on_flushed)
        if self.pending >= self.capacity:
            self.busy_rejections += 1
            raise SystemBusyError(f"{self.pending} sends are waiting for the store")
        fut: asyncio.Future[AppendResult] = loop.create_future()
        self._queue.append((batch, fut, time.monotonic()))
        if not self._drain_scheduled and not self._writer_busy:
            self._drain_scheduled = True
            loop.call_soon(self._drain)
        try:
            return await fut
        except SystemBusyError:
            self.busy_rejections += 1
            raise

    def _drain(self) -> None:
        """On the loop, once per iteration with sends: append the small ones here, in arrival
        order, up to the first large one; that one and everything after it go to the writer."""
        self._drain_scheduled = False
        if self._writer_busy or not self._queue:
            return  # the writer's completion drains what queued behind it
        jobs = self._queue
        cut = len(jobs)
        limit = self.inline_max_bytes
        for i, (batch, _f, _t) in enumerate(jobs):
            if limit <= 0 or sum(map(len, batch.bodies)) > limit:
                cut = i
                break
        inline, self._queue = jobs[:cut], jobs[cut:]
        if inline:
            results = self._append_group(inline)
            self.inline_appends += len(inline)
            try:
                self.store.dispatch_ready()
            except Exception:  # the messages are stored: the dispatcher thread makes them visible
                log.exception("inline dispatch failed")
                self.store.dispatcher.wake()
            self._settle(inline, results)
        if self._queue:
            self._kick()

    def _append_group(self, jobs: list[_Job]) -> list[AppendResult | BaseException]:
        """On the loop: the sends of one iteration as one store append (one lock, one
        ``pwrite``); a send with bad input is answered alone. Where the group straddles a
        segment end, one append per send."""
        out: list[AppendResult | BaseException | None] = []
        valid: list[MessageBatch] = []
        for batch, _fut, _t in jobs:
            try:
                self.store.validate(batch)
            except Exception as exc:  # noqa: BLE001 - that send's answer
                out.append(exc)
                continue
            out.append(None)
            valid.append(batch)
        if not valid:
            return [r for r in out if r is not None]
        began = time.perf_counter()
        try:
            grouped = self.store.append_many(valid, validated=True)
        except Exception as exc:  # noqa: BLE001 - nothing written: every valid send's answer
            return [exc if r is None else r for r in out]
        if grouped is None:
            return self._run_jobs(jobs, wake_dispatcher=False)
        self._observe(began)
        done = iter(grouped)
        return [next(done) if r is None else r for r in out]

    def _observe(self, began: float) -> None:
        if self.on_append is not None:
            try:
                self.on_append(time.perf_counter() - began)
            except Exception:  # the message is stored: a metric must not fail its send
                log.exception("append listener failed")

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

    def _run_jobs(
        self, jobs: list[_Job], wake_dispatcher: bool = True
    ) -> list[AppendResult | BaseException]:
        """Every queued append, in arrival order (on the loop or on the writer thread)."""
        out: list[AppendResult | BaseException] = []
        now = time.monotonic()
        append = self.store.append
        for batch, _fut, queued_at in jobs:
            waited = now - queued_at
            if waited > self.wait_timeout_s:
                out.append(SystemBusyError(f"send waited {waited * 1000:.0f} ms for the store"))
                continue
            try:
                began = time.perf_counter()
                out.append(append(batch, wake_dispatcher=wake_dispatcher))
            except Exception as exc:  # noqa: BLE001 - goes to that send's Future; others go on
                out.append(exc)
                continue
            self._observe(began)
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
            self.writer_appends += len(jobs)
        self._settle(jobs, results)
        if self._queue:
            self._drain()

    def _settle(self, jobs: list[_Job], results: list[AppendResult | BaseException]) -> None:
        """Answer each send: its error, its result, or (SYNC_FLUSH, not yet durable) a place
        among the flush waiters; then one flush request for all of them."""
        sync = self.store.sync_flush
        flushed = self.store.commit_log.flushed_offset
        highest = 0
        for (_batch, fut, _t), result in zip(jobs, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            elif sync and flushed < result.end_offset:
                self._wait_flushed(fut, result)
                highest = max(highest, result.end_offset)
            else:
                fut.set_result(result)
        if highest:
            self.store.request_flush(highest)
            # An fsync that ended between the look above and the listener's registration
            # reports to nobody: complete what it covered now.
            self._complete(self.store.commit_log.flushed_offset, None)

    # ------------------------------------------------------------------ group commit

    def _wait_flushed(self, fut: asyncio.Future[AppendResult], result: AppendResult) -> None:
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + self.store.config.sync_flush_timeout_ms / 1000
        heapq.heappush(
            self._flush_waiters, (result.end_offset, next(self._seq), fut, deadline, result)
        )
        if self._expiry is None:
            self._expiry = loop.call_later(0.1, self._expire)

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
            _o, _s, fut, _d, result = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(result)

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


def _fail(fut: asyncio.Future[AppendResult], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
