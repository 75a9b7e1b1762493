"""The bridge between the broker's event loop and the blocking store.

Appends run on one writer thread (the store serialises them anyway), reads on a small pool;
the event loop only awaits. Overload is answered quickly: beyond ``capacity`` waiting sends, or
once a send has waited ``wait_timeout_ms`` for the writer, the broker replies SYSTEM_BUSY
instead of letting clients time out (RocketMQ's "broker busy", with the wait made explicit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from orbitmq.common.errors import FlushTimeoutError, SystemBusyError
from orbitmq.common.message import MessageBatch
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import MessageStore

T = TypeVar("T")


class StoreBridge:
    def __init__(self, store: MessageStore, capacity: int, wait_timeout_ms: int) -> None:
        self.store = store
        self.capacity = capacity
        self.wait_timeout_s = wait_timeout_ms / 1000
        self.pending = 0
        self.busy_rejections = 0
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="orbitmq-store-write")
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="orbitmq-store-read")

    def _append(self, batch: MessageBatch, queued_at: float) -> AppendResult:
        waited = time.monotonic() - queued_at
        if waited > self.wait_timeout_s:
            raise SystemBusyError(f"send waited {waited * 1000:.0f} ms for the store")
        return self.store.append(batch)

    async def put(self, batch: MessageBatch) -> AppendResult:
        """Append and, in SYNC_FLUSH, wait for the fsync. Raises SystemBusyError when full."""
        if self.pending >= self.capacity:
            self.busy_rejections += 1
            raise SystemBusyError(f"{self.pending} sends are waiting for the store")
        self.pending += 1
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._writer, self._append, batch, time.monotonic())
        except SystemBusyError:
            self.busy_rejections += 1
            raise
        finally:
            self.pending -= 1
        flushed = self.store.flush_future(result.end_offset)
        if not flushed.done():
            timeout = self.store.config.sync_flush_timeout_ms / 1000
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.wrap_future(flushed)
            except TimeoutError as exc:
                err = FlushTimeoutError(f"not fsynced within {timeout:.1f}s")
                err.result = result  # stored, not yet durable: the sender learns where
                raise err from exc
        else:
            flushed.result()
        return result

    async def read(self, fn: Callable[..., T], *args: object) -> T:
        """Run a store read off the loop (mapped pages may have to come from disk)."""
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run another blocking store call (open, close, checkpoint) off the loop."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
