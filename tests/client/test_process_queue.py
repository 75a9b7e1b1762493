"""ProcessQueue: ordering, committable offsets, flow control, dropping, thread-safe counting."""

from __future__ import annotations

import asyncio
import random
import threading

from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue
from orbitmq.common.record import StoredMessage

MQ = MessageQueue("T", "broker-a", 0)


def msg(offset: int, size: int = 10) -> StoredMessage:
    return StoredMessage(
        total_size=0,
        queue_id=0,
        flag=0,
        queue_offset=offset,
        physical_offset=offset * 100,
        sys_flag=0,
        born_timestamp_ms=0,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=0,
        store_host=("127.0.0.1", 2),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"x" * size,
        topic="T",
        properties={},
    )


async def test_put_take_remove_and_committable() -> None:
    pq = ProcessQueue(MQ, 10)
    assert pq.committable() == 10
    added = pq.put([msg(10), msg(11), msg(13)], 14)  # 12 was filtered out
    assert [m.queue_offset for m in added] == [10, 11, 13]
    assert pq.next_offset == 14 and pq.cached_count == 3 and pq.cached_bytes == 30
    # Duplicates and old offsets are ignored.
    assert pq.put([msg(11), msg(13)], 14) == []
    batch = pq.take(2)
    assert [m.queue_offset for m in batch] == [10, 11]
    assert pq.pending_count == 1 and pq.taken_count == 2
    # Finishing out of order never lets the committable offset pass an unfinished message.
    assert pq.remove([batch[1]]) == 10
    assert pq.remove([batch[0]]) == 13
    assert pq.remove(pq.take(5)) == 14
    assert pq.cached_count == 0 and pq.cached_bytes == 0
    assert pq.put([], 20) == [] and pq.committable() == 20


async def test_randomized_out_of_order_completion() -> None:
    seed = random.randrange(1 << 32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    pq = ProcessQueue(MQ, 0)
    offsets = sorted(rng.sample(range(1000), 200))
    pq.put([msg(o) for o in offsets], offsets[-1] + 1)
    taken = pq.take(1000)
    rng.shuffle(taken)
    done: set[int] = set()
    for m in taken:
        committable = pq.remove([m])
        done.add(m.queue_offset)
        pending = [o for o in offsets if o not in done]
        assert committable == (pending[0] if pending else offsets[-1] + 1)


async def test_untake_puts_messages_back_in_front() -> None:
    pq = ProcessQueue(MQ, 0)
    pq.put([msg(i) for i in range(5)], 5)
    first = pq.take(2)
    pq.untake(first)
    assert [m.queue_offset for m in pq.take(3)] == [0, 1, 2]


async def test_flow_control_by_count_and_bytes() -> None:
    pq = ProcessQueue(MQ, 0)
    pq.put([msg(i, size=100) for i in range(5)], 5)
    assert pq.is_full(5, 10_000)
    assert pq.is_full(100, 500)
    assert not pq.is_full(6, 501)
    assert pq.is_full(5, 10_000)
    waiter = asyncio.create_task(pq.wait_space(5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    pq.remove(pq.take(1))
    await asyncio.wait_for(waiter, 1.0)


async def test_drop_abandons_unstarted_batches_and_waits_for_running_ones() -> None:
    pq = ProcessQueue(MQ, 0)
    pq.put([msg(i) for i in range(4)], 4)
    running = pq.take(1)
    queued = pq.take(1)
    assert pq.try_begin(pq.generation)
    pq.drop()
    assert pq.dropped and pq.pending_count == 0
    assert not pq.try_begin(pq.generation)  # the queued batch is abandoned
    assert pq.put([msg(9)], 10) == []  # a late pull delivers nothing
    assert not await pq.wait_idle(0.05)
    pq.remove(running)
    pq.end()
    assert await pq.wait_idle(0.5)
    # Abandoned messages stay uncommitted: the next owner gets them.
    assert pq.committable() == queued[0].queue_offset


async def test_reset_drops_everything_and_bumps_generation() -> None:
    pq = ProcessQueue(MQ, 0)
    pq.put([msg(i) for i in range(4)], 4)
    gen = pq.generation
    pq.reset(2)
    assert pq.generation == gen + 1 and pq.cached_count == 0 and pq.committable() == 2
    assert not pq.try_begin(gen)
    assert [m.queue_offset for m in pq.put([msg(1), msg(2), msg(3)], 4)] == [2, 3]


async def test_try_begin_and_end_from_many_threads() -> None:
    pq = ProcessQueue(MQ, 0)
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for _ in range(2000):
            if pq.try_begin():
                pq.end()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert pq.running == 0
    assert await pq.wait_idle(0.1)


async def test_lock_validity() -> None:
    pq = ProcessQueue(MQ, 0)
    assert not pq.lock_valid(30.0)
    pq.locked = True
    pq.lock_renewed_at = 100.0
    assert pq.lock_valid(30.0, now=120.0)
    assert not pq.lock_valid(30.0, now=131.0)
