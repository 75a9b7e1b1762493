"""The store bridge's hot path (issue #15): sends of one loop iteration appended together on
the loop thread, made readable there and long polls woken there; big batches on the writer
thread in arrival order; SYNC_FLUSH completing many sends per fsync; overload answered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.long_polling import LongPolling
from orbitmq.broker.store_bridge import StoreBridge
from orbitmq.common.errors import FlushTimeoutError, SystemBusyError
from orbitmq.common.message import MessageBatch
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.config import FlushDiskType
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_store_config

Make = Callable[..., tuple[MessageStore, StoreBridge]]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    made: list[tuple[MessageStore, StoreBridge]] = []

    def build(inline_max_bytes: int = 256 * 1024, capacity: int = 10_000,
              **store: Any) -> tuple[MessageStore, StoreBridge]:  # fmt: skip
        s = MessageStore(small_store_config(tmp_path / f"s{len(made)}", **store))
        s.open()
        b = StoreBridge(s, capacity, 1_000, inline_max_bytes=inline_max_bytes)
        made.append((s, b))
        return s, b

    try:
        yield build
    finally:
        for s, b in made:
            b.shutdown()
            s.close()


def batch(n: int = 1, size: int = 16, queue_id: int = 0, topic: str = "B") -> MessageBatch:
    return MessageBatch(topic, queue_id, [b"m" * size] * n, [b""] * n)


def appending_threads(store: MessageStore) -> list[tuple[str, int]]:
    """Record each store append: (which call, which thread)."""
    seen: list[tuple[str, int]] = []
    one, many = store.append, store.append_many

    def spy_one(b: MessageBatch, **kw: Any) -> AppendResult:
        seen.append(("append", threading.get_ident()))
        return one(b, **kw)

    def spy_many(bs: list[MessageBatch], **kw: Any) -> list[AppendResult] | None:
        seen.append(("append_many", threading.get_ident()))
        return many(bs, **kw)

    store.append = spy_one  # type: ignore[method-assign]  # a spy on the real append
    store.append_many = spy_many  # type: ignore[method-assign]  # and on the grouped one
    return seen


async def test_one_iteration_appends_on_the_loop_and_is_readable_at_once(make: Make) -> None:
    store, bridge = make()
    seen = appending_threads(store)
    results = await asyncio.gather(*(bridge.put(batch(2, queue_id=q % 3)) for q in range(30)))
    # One store append for the 30 sends of the iteration, on the loop's thread.
    assert seen == [("append_many", threading.get_ident())]
    assert bridge.inline_appends == 30 and bridge.writer_appends == 0
    # Dispatched in the same callback: readable without waiting for the dispatcher thread.
    assert store.dispatcher.reput_offset >= max(r.end_offset for r in results)
    assert sum(store.max_offset("B", q) for q in range(3)) == 60
    got = store.get_messages("B", 0, 0, 100)
    assert got.count == 20


async def test_long_polls_are_woken_on_the_loop_thread(make: Make) -> None:
    store, bridge = make()
    polling = LongPolling()
    polling.bind(asyncio.get_running_loop())
    store.add_arrival_listener(polling.on_arrival)
    loop = asyncio.get_running_loop()
    handoffs: list[object] = []
    real = loop.call_soon_threadsafe

    def spy(*args: Any, **kw: Any) -> Any:
        handoffs.append(args[0])
        return real(*args, **kw)

    waiter = asyncio.ensure_future(polling.wait("B", 0, 0, 5.0))
    await asyncio.sleep(0)
    loop.call_soon_threadsafe = spy  # type: ignore[method-assign]  # count hand-offs
    try:
        await bridge.put(batch())
        assert await asyncio.wait_for(waiter, 5)
    finally:
        del loop.call_soon_threadsafe
    assert not any(getattr(h, "__name__", "") == "_wake" for h in handoffs)


async def test_big_batches_go_to_the_writer_and_order_is_kept(make: Make) -> None:
    store, bridge = make(inline_max_bytes=1024)
    seen = appending_threads(store)
    sends = [batch(1, 16), batch(4, 512), batch(1, 16), batch(1, 16)]
    results = await asyncio.gather(*(bridge.put(b) for b in sends))
    offsets = [r.first_queue_offset for r in results]
    assert offsets == [0, 1, 5, 6]  # arrival order, although two paths appended
    loop_thread = threading.get_ident()
    assert seen[0] == ("append_many", loop_thread) and seen[1] == ("append", seen[1][1])
    assert seen[1][1] != loop_thread
    assert bridge.inline_appends >= 1 and bridge.writer_appends >= 1
    assert store.wait_for_dispatch(5)
    assert store.max_offset("B", 0) == 7


async def test_all_on_the_writer_when_inline_is_off(make: Make) -> None:
    store, bridge = make(inline_max_bytes=0)
    seen = appending_threads(store)
    await asyncio.gather(*(bridge.put(batch()) for _ in range(10)))
    assert threading.get_ident() not in {t for _c, t in seen} and bridge.inline_appends == 0


async def test_sync_flush_acks_after_fsync_with_few_fsyncs(make: Make) -> None:
    store, bridge = make(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    before = store.flusher.fsync_count
    results = await asyncio.gather(*(bridge.put(batch()) for _ in range(64)))
    end = max(r.end_offset for r in results)
    assert store.commit_log.flushed_offset >= end
    assert all(isinstance(r, AppendResult) for r in results)
    # One loop iteration's 64 sends: one flush request, a group commit or two, not 64.
    assert store.flusher.fsync_count - before <= 4
    for _ in range(5):  # one at a time: each still waits for its fsync
        r = await bridge.put(batch())
        assert store.commit_log.flushed_offset >= r.end_offset


async def test_sync_flush_timeout_says_where_it_is_stored(make: Make) -> None:
    store, bridge = make(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=200)
    store.flusher.stop()  # no fsync will come
    try:
        with pytest.raises(FlushTimeoutError) as info:
            await asyncio.wait_for(bridge.put(batch()), 5)
        assert isinstance(info.value.result, AppendResult)
    finally:
        store.flusher.start()


async def test_capacity_answers_system_busy(make: Make) -> None:
    _store, bridge = make(capacity=5)
    puts = [asyncio.ensure_future(bridge.put(batch())) for _ in range(8)]
    done = await asyncio.gather(*puts, return_exceptions=True)
    busy = [d for d in done if isinstance(d, SystemBusyError)]
    assert len(busy) == 3 and bridge.busy_rejections == 3
    assert sum(isinstance(d, AppendResult) for d in done) == 5


async def test_a_bad_send_in_a_group_is_answered_alone(make: Make) -> None:
    store, bridge = make()
    sends = [batch(), batch(topic="bad topic!"), batch(), batch(queue_id=-1)]
    done = await asyncio.gather(*(bridge.put(b) for b in sends), return_exceptions=True)
    assert isinstance(done[0], AppendResult) and isinstance(done[2], AppendResult)
    assert isinstance(done[1], Exception) and isinstance(done[3], Exception)
    assert (done[0].first_queue_offset, done[2].first_queue_offset) == (0, 1)
    assert store.max_offset("B", 0) == 2
