"""AsyncProducer and Producer against fake brokers: every send mode, batching, retries,
timeouts, selectors, compression, validation and the blocking wrapper."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import zstandard

from orbitmq.client import (
    AsyncAdminClient,
    Message,
    MessageQueue,
    Producer,
    SendResult,
    SendStatus,
    hash_selector,
)
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import AUTO_CREATE_QUEUE_ID
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    InvalidTopicError,
    MessageIllegalError,
    MessageTooLargeError,
    MQError,
    RemoteError,
    RequestTimeoutError,
)
from orbitmq.common.message import (
    PROPERTY_SHARDING_KEY,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZSTD,
)
from orbitmq.common.record import decode
from orbitmq.protocol.codes import RequestCode
from tests.client.conftest import FakeCluster, MakeProducer, dead_addr

ZSTD = SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZSTD


def all_bodies(cluster: FakeCluster, topic: str = "T") -> list[bytes]:
    return [b for broker in cluster.brokers for b in broker.bodies(topic)]


# ---------------------------------------------------------------------- sync send


async def test_send_returns_where_the_message_went(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    results = [await p.send(Message("T", f"m{i}".encode(), tags="a", keys=["k"])) for i in range(8)]
    # Round-robin over the 8 queues of two brokers.
    assert len({r.message_queue for r in results}) == 8
    for r in results:
        assert r.status is SendStatus.SEND_OK
        assert r.msg_ids == (r.msg_id,) and len(r.msg_id) == 32
        broker = cluster.a if r.message_queue.broker_name == "broker-a" else cluster.b
        rec = broker.queues[("T", r.message_queue.queue_id)][r.queue_offset]
        assert rec.physical_offset == r.offset
        msg = decode(rec.raw)
        assert msg.msg_id == r.msg_id and msg.tags == "a" and msg.keys == ["k"]
    assert sorted(all_bodies(cluster)) == sorted(f"m{i}".encode() for i in range(8))
    assert all(s.code == RequestCode.SEND_MESSAGE and s.count == 1 for s in cluster.a.sends)


async def test_user_supplied_unique_id_is_kept(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    r = await p.send(Message("T", b"x", properties={PROPERTY_UNIQ_KEY: "MYID", "u": "v"}))
    assert r.msg_id == "MYID"


async def test_retries_on_system_busy_go_to_the_other_broker(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 100
    cluster.b.fail_next = []
    for _ in range(6):
        r = await p.send(Message("T", b"x"))
        assert r.message_queue.broker_name == "broker-b"
    # broker-a was tried once at most: after its first failure it is avoided for 30 s.
    assert len(cluster.a.sends) == 1
    assert p.fault.is_available("broker-b") and not p.fault.is_available("broker-a")


async def test_retry_budget_is_bounded_and_last_error_raised(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(retry_times_when_send_failed=2)
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 100
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"x"))
    assert info.value.code == ResponseCode.SYSTEM_BUSY
    assert "failed 3 times" in "".join(getattr(info.value, "__notes__", []))
    assert len(cluster.a.sends) + len(cluster.b.sends) == 3
    # The tries alternate brokers.
    assert 1 <= len(cluster.a.sends) <= 2 and 1 <= len(cluster.b.sends) <= 2


async def test_non_retriable_error_is_not_retried(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.MESSAGE_ILLEGAL, {})]
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"x"))
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert len(cluster.a.sends) + len(cluster.b.sends) == 1


async def test_stored_but_not_flushed_is_a_status_not_a_retry(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.FLUSH_DISK_TIMEOUT, {"stored": True})]
    r = await p.send(Message("T", b"x"))
    assert r.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert all_bodies(cluster) == [b"x"]
    # Without the fields (the broker could not say where it went) it is an error, not retried.
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.FLUSH_DISK_TIMEOUT, {})]
    with pytest.raises(RemoteError) as info:
        await p.send(Message("T", b"y"))
    assert info.value.code == ResponseCode.FLUSH_DISK_TIMEOUT
    assert len(cluster.a.sends) + len(cluster.b.sends) == 2


async def test_dead_broker_fails_over(cluster: FakeCluster, make_producer: MakeProducer) -> None:
    p = await make_producer()
    await p.send(Message("T", b"warm"))
    await cluster.a.stop()
    for i in range(5):
        r = await p.send(Message("T", f"{i}".encode()))
        assert r.message_queue.broker_name == "broker-b"
    assert not p.fault.is_available("broker-a")


async def test_hanging_broker_times_out_within_budget(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(send_timeout_s=0.3)
    cluster.a.hang = cluster.b.hang = True
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        await p.send(Message("T", b"x"))
    assert 0.25 < time.monotonic() - started < 1.0
    # The slow broker is avoided next time; the other one answers.
    cluster.b.hang = False
    cluster.b.released.set()
    tried = cluster.a.sends[-1:] + cluster.b.sends[-1:]
    assert len(tried) == 1
    if cluster.a.sends:
        r = await p.send(Message("T", b"y"))
        assert r.message_queue.broker_name == "broker-b"


async def test_unreachable_namesrv_is_a_client_error(make_producer: MakeProducer) -> None:
    p = await make_producer([dead_addr()])
    with pytest.raises(ClientError, match="NameServer"):
        await p.send(Message("T", b"x"))


async def test_no_broker_for_unknown_topic(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(auto_create_fallback=False)
    with pytest.raises(ClientError, match="no route"):
        await p.send(Message("Missing", b"x"))


async def test_auto_create_stand_in_route(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    # Brokers without auto-create answer TOPIC_NOT_EXIST: final for a stand-in route.
    with pytest.raises(RemoteError) as info:
        await p.send(Message("Fresh", b"x"))
    assert info.value.code == ResponseCode.TOPIC_NOT_EXIST
    assert len(cluster.a.sends) + len(cluster.b.sends) == 1
    for broker in cluster.brokers:
        broker.auto_create = True
    r = await p.send(Message("Fresh", b"y"))
    assert r.message_queue.queue_id == 0  # what the broker picked for queue -1
    sent = (cluster.a.sends + cluster.b.sends)[-1]
    assert sent.queue_id == AUTO_CREATE_QUEUE_ID


# ---------------------------------------------------------------------- validation


async def test_invalid_messages_raise_before_sending(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(max_message_size=1000, compress_over_bytes=-1)
    with pytest.raises(InvalidTopicError):
        await p.send(Message("bad topic", b"x"))
    with pytest.raises(EmptyBodyError):
        await p.send(Message("T", b""))
    with pytest.raises(MessageTooLargeError):
        await p.send(Message("T", b"x" * 1001))
    with pytest.raises(MessageIllegalError):
        await p.send(Message("T", b"x", properties={"a\x01b": "c"}))
    with pytest.raises(MessageIllegalError):
        p.send_async(Message("T", b"x", tags="t\x02"))
    assert not cluster.a.sends and not cluster.b.sends


async def test_not_started_and_closed(cluster: FakeCluster, make_producer: MakeProducer) -> None:
    from orbitmq.client import AsyncProducer

    p = AsyncProducer([cluster.namesrv.addr])
    with pytest.raises(ClientError, match="not started"):
        await p.send(Message("T", b"x"))
    await p.close()
    q = await make_producer()
    await q.close()
    with pytest.raises(ClientError, match="closed"):
        q.send_async(Message("T", b"x"))


# ---------------------------------------------------------------------- selectors


def test_hash_selector_is_deterministic() -> None:
    qs = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(4)]
    msg = Message("T", b"x")
    picks = {k: hash_selector(qs, msg, k) for k in ("order-1", "order-2", 42, b"raw")}
    for _ in range(3):
        assert {k: hash_selector(qs, msg, k) for k in picks} == picks
    # Pinned: CRC32C of the key modulo the queue count, the same in every process and run.
    assert [picks[k] for k in ("order-1", "order-2", 42)] == [qs[4], qs[0], qs[3]]
    spread = {hash_selector(qs, msg, f"k{i}") for i in range(200)}
    assert spread == set(qs)
    sharded = Message("T", b"x", properties={PROPERTY_SHARDING_KEY: "order-1"})
    assert hash_selector(qs, sharded, None) == picks["order-1"]
    keyed = Message("T", b"x", keys=["order-2"])
    assert hash_selector(qs, keyed, None) == picks["order-2"]
    with pytest.raises(ClientError):
        hash_selector(qs, msg, None)


async def test_selector_sends_same_key_to_same_queue_in_order(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    sent: dict[str, list[SendResult]] = {}
    for i in range(40):
        key = f"order-{i % 4}"
        r = await p.send(Message("T", f"{key}:{i}".encode()), selector=hash_selector, arg=key)
        sent.setdefault(key, []).append(r)
    futs = [
        p.send_async(Message("T", f"order-0:a{i}".encode()), selector=hash_selector, arg="order-0")
        for i in range(30)
    ]
    results = await asyncio.gather(*futs)
    for rs in sent.values():
        assert len({r.message_queue for r in rs}) == 1
    q0 = sent["order-0"][0].message_queue
    assert {r.message_queue for r in results} == {q0}
    broker = cluster.a if q0.broker_name == "broker-a" else cluster.b
    bodies = [decode(r.raw).body for r in broker.queues[("T", q0.queue_id)]]
    expected = [f"order-0:{i}".encode() for i in range(0, 40, 4)]
    expected += [f"order-0:a{i}".encode() for i in range(30)]
    assert bodies == expected


async def test_explicit_queue_and_bad_queues(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    mq = MessageQueue("T", "broker-b", 3)
    r = await p.send(Message("T", b"x"), queue=mq)
    assert r.message_queue == mq and r.queue_offset == 0
    with pytest.raises(ClientError):
        await p.send(Message("T", b"x"), queue=MessageQueue("Other", "broker-b", 3))

    def wrong(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        return MessageQueue("Other", "broker-a", 0)

    with pytest.raises(ClientError):
        await p.send(Message("T", b"x"), selector=wrong)
    with pytest.raises(ClientError):
        await p.send_async(Message("T", b"x"), selector=wrong)


# ---------------------------------------------------------------------- automatic batching


async def test_send_async_batches_into_few_frames(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=20)
    n = 300
    futs = [p.send_async(Message("T", f"m{i}".encode(), keys=[f"k{i}"])) for i in range(n)]
    results = await asyncio.gather(*futs)
    sends = cluster.a.sends + cluster.b.sends
    assert len(sends) == 1, [(s.queue_id, s.count) for s in sends]
    assert sends[0].code == RequestCode.SEND_BATCH_MESSAGE and sends[0].count == n
    mq = results[0].message_queue
    assert [r.queue_offset for r in results] == list(range(n))
    assert all(r.message_queue == mq for r in results)
    assert len({r.msg_id for r in results}) == n
    broker = cluster.a if mq.broker_name == "broker-a" else cluster.b
    records = broker.queues[("T", mq.queue_id)]
    for r, rec in zip(results, records, strict=True):
        assert rec.physical_offset == r.offset  # derived from record sizes
        assert decode(rec.raw).msg_id == r.msg_id
    assert p.frames_sent == 1


@pytest.mark.parametrize("bound", ["max_in_flight_batches", "max_in_flight_per_key"])
async def test_sends_held_while_every_slot_is_busy_leave_as_one_batch(
    cluster: FakeCluster, make_producer: MakeProducer, bound: str
) -> None:
    p = await make_producer(linger_ms=0, **{bound: 1})
    first = p.send_async(Message("T", b"first"))
    await asyncio.sleep(0)  # its batch now holds the only slot
    later = []
    for i in range(40):  # one per loop iteration, as concurrent gRPC calls arrive
        later.append(p.send_async(Message("T", f"m{i}".encode())))
        await asyncio.sleep(0)
    results = await asyncio.gather(first, *later)
    assert len({r.msg_id for r in results}) == 41
    sends = cluster.a.sends + cluster.b.sends
    # What arrived while a send was out waited for it and left together: without holding,
    # each of the 41 would have been its own frame (the fake brokers answer within a few
    # loop iterations, so how many go together varies; less than half the frames is sure).
    assert sum(s.count for s in sends) == 41
    assert p.frames_sent == len(sends) <= 20, [s.count for s in sends]


async def test_linger_only_in_flight_lone_send_goes_at_once_later_ones_linger(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    for b in cluster.brokers:
        b.delay_s = 0.3  # the first batch stays in flight for 0.3 s
    p = await make_producer(linger_ms=100, linger_only_in_flight=True, max_in_flight_per_key=2)
    await p.publish_queues("T")
    loop = asyncio.get_running_loop()

    def frames() -> int:
        return len(cluster.a.sends + cluster.b.sends)

    began = loop.time()
    first = p.send_async(Message("T", b"first"))
    while frames() == 0 and loop.time() - began < 0.09:
        await asyncio.sleep(0.005)
    assert frames() == 1, "a send with nothing in flight must not linger"
    later = []
    for i in range(5):  # while the first is in flight: they linger and leave together
        later.append(p.send_async(Message("T", f"m{i}".encode())))
        await asyncio.sleep(0.01)
    results = await asyncio.gather(first, *later)
    assert len({r.msg_id for r in results}) == 6
    assert [s.count for s in cluster.a.sends + cluster.b.sends] == [1, 5]


async def test_per_key_bound_holds_only_its_own_topic(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    for b in cluster.brokers:
        b.add_topic("U", 4)
        b.delay_s = 0.5  # every answer comes 0.5 s after the send arrived
    cluster.reregister()
    p = await make_producer(linger_ms=0, max_in_flight_per_key=1)
    await p.publish_queues("T")
    await p.publish_queues("U")
    loop = asyncio.get_running_loop()

    def seen(topic: str) -> int:
        return sum(1 for s in cluster.a.sends + cluster.b.sends if s.topic == topic)

    t1 = p.send_async(Message("T", b"t1"))
    await asyncio.sleep(0)
    t2 = p.send_async(Message("T", b"t2"))  # T is at its bound: held
    u1 = p.send_async(Message("U", b"u1"))  # another topic: not held back by T
    deadline = loop.time() + 0.4
    while seen("U") == 0 and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert seen("U") == 1
    assert seen("T") == 1  # t2 waits for t1's answer
    results = await asyncio.gather(t1, t2, u1)
    assert seen("T") == 2 and len({r.msg_id for r in results}) == 3


async def test_batches_split_by_size_count_and_go_round_robin(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(
        linger_ms=50, batch_max_messages=50, batch_max_bytes=64 * 1024, compress_over_bytes=-1
    )
    futs = [p.send_async(Message("T", bytes([65 + i % 26]) * 100)) for i in range(400)]
    results = await asyncio.gather(*futs)
    sends = cluster.a.sends + cluster.b.sends
    assert sum(s.count for s in sends) == 400
    assert all(s.count <= 50 for s in sends)
    assert len(sends) == 8
    assert len({r.message_queue for r in results}) == 8  # batches spread over the queues
    na, nb = len(cluster.a.sends), len(cluster.b.sends)
    big = [p.send_async(Message("T", b"z" * 20_000)) for _ in range(10)]
    await asyncio.gather(*big)
    big_sends = cluster.a.sends[na:] + cluster.b.sends[nb:]
    assert sum(s.count for s in big_sends) == 10
    assert all(s.count <= 3 for s in big_sends)  # 64 KiB holds three 20 KB bodies


async def test_linger_zero_still_batches_one_loop_iteration(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=0)
    futs = [p.send_async(Message("T", b"x")) for _ in range(100)]
    await asyncio.gather(*futs)
    assert len(cluster.a.sends + cluster.b.sends) == 1


async def test_different_flags_and_compression_make_separate_batches(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=20, compress_over_bytes=1000)
    big = b"0123456789" * 500
    futs = [p.send_async(Message("T", b"small")) for _ in range(5)]
    futs += [p.send_async(Message("T", big)) for _ in range(5)]
    futs += [p.send_async(Message("T", b"flagged", flag=7)) for _ in range(5)]
    await asyncio.gather(*futs)
    sends = sorted(
        ((s.sys_flag, s.flag, s.count) for s in cluster.a.sends + cluster.b.sends),
        key=lambda t: (t[0], t[1]),
    )
    assert sends == [(0, 0, 5), (0, 7, 5), (ZSTD, 0, 5)]


async def test_async_failure_reaches_every_future_and_callback(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=10)
    for broker in cluster.brokers:
        broker.fail_next = [(ResponseCode.MESSAGE_ILLEGAL, {})]
    seen: list[tuple[SendResult | None, BaseException | None]] = []
    futs = [
        p.send_async(Message("T", b"x"), callback=lambda r, e: seen.append((r, e)))
        for _ in range(10)
    ]
    outs = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(o, RemoteError) for o in outs)
    assert len(seen) == 10 and all(r is None and isinstance(e, RemoteError) for r, e in seen)
    assert len(cluster.a.sends) + len(cluster.b.sends) == 1  # one batch, not retried
    for broker in cluster.brokers:
        broker.fail_next = []
    ok = await p.send_async(Message("T", b"y"), callback=lambda r, e: seen.append((r, e)))
    await asyncio.sleep(0)
    assert seen[-1] == (ok, None)


async def test_async_batch_retries_to_other_broker(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=10)
    cluster.a.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 10
    cluster.b.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 10
    # Whichever broker gets the batch first is busy once; the retry goes to the other.
    cluster.a.fail_next = cluster.a.fail_next[:1]
    cluster.b.fail_next = cluster.b.fail_next[:1]
    futs = [p.send_async(Message("T", f"{i}".encode())) for i in range(20)]
    results = await asyncio.gather(*futs)
    assert len({r.message_queue.broker_name for r in results}) == 1
    assert sorted(all_bodies(cluster)) == sorted(f"{i}".encode() for i in range(20))


async def test_a_batch_busy_beyond_send_timeout_is_sent_then_busy_timeout_bounds_it(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    """Busy answers for longer than send_timeout_s do not fail a send_async batch (each one
    gives it send_timeout_s again); busy_timeout_s still ends a broker that stays busy."""
    p = await make_producer(
        linger_ms=0, send_timeout_s=0.2, busy_backoff_ms=40.0, busy_backoff_max_ms=40.0,
        busy_timeout_s=30.0,
    )  # fmt: skip
    busy = [(ResponseCode.SYSTEM_BUSY, {})] * 12  # 12 pauses of 20-40 ms: past 0.2 s
    cluster.a.fail_next, cluster.b.fail_next = list(busy), list(busy)
    started = asyncio.get_running_loop().time()
    result = await p.send_async(Message("T", b"patient"))
    assert result.status is SendStatus.SEND_OK
    assert asyncio.get_running_loop().time() - started > 0.2
    q = await make_producer(
        linger_ms=0, send_timeout_s=0.2, busy_backoff_ms=20.0, busy_backoff_max_ms=20.0,
        busy_timeout_s=0.3,
    )  # fmt: skip
    cluster.a.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 1000
    cluster.b.fail_next = [(ResponseCode.SYSTEM_BUSY, {})] * 1000
    started = asyncio.get_running_loop().time()
    with pytest.raises(MQError):
        await q.send_async(Message("T", b"never"))
    assert asyncio.get_running_loop().time() - started < 2.0
    assert b"never" not in all_bodies(cluster)


async def test_a_late_answer_from_a_broker_that_answers_others_is_waited_for_not_resent(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    """A send_async batch answered after send_timeout_s while the broker answers the producer's
    other batches (alive, behind) succeeds, stored once; a send() still times out then."""
    p = await make_producer(linger_ms=0, send_timeout_s=0.4, busy_timeout_s=30.0)
    mq = MessageQueue("T", "broker-a", 0)
    await p.send(Message("T", b"warm"), queue=mq)  # connected
    cluster.a.delay_s = 1.0  # only the next request, see below
    late = p.send_async(Message("T", b"late"), queue=mq)
    await asyncio.sleep(0.05)
    cluster.a.delay_s = 0.0
    other = MessageQueue("T", "broker-a", 1)  # same connection, not behind "late" in a queue
    for i in range(60):  # answered at once meanwhile: bytes keep coming on that connection
        if late.done():
            break
        await p.send_async(Message("T", f"{i}".encode()), queue=other)
        await asyncio.sleep(0.05)
    result = await asyncio.wait_for(late, 5)
    assert result.status is SendStatus.SEND_OK
    assert all_bodies(cluster).count(b"late") == 1
    cluster.a.delay_s = 1.0
    with pytest.raises(MQError):  # send(): the caller's own budget, as before
        await p.send(Message("T", b"sync"), queue=mq)


async def test_close_flushes_pending_batches(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer(linger_ms=10_000)
    futs = [p.send_async(Message("T", f"{i}".encode())) for i in range(10)]
    await asyncio.sleep(0.01)
    assert not cluster.a.sends and not cluster.b.sends and p.pending == 10
    await p.close()
    assert all(f.done() and not f.exception() for f in futs)
    assert len(all_bodies(cluster)) == 10


# ---------------------------------------------------------------------- batch, oneway


async def test_send_batch_one_frame_one_result(
    cluster: FakeCluster, make_producer: MakeProducer
) -> None:
    p = await make_producer()
    msgs = [Message("T", f"b{i}".encode(), keys=[f"k{i}"]) for i in range(10)]
    r = await p.send_batch(msgs)
    assert len(r.msg_ids) == 10 and r.msg_id == ",".join(r.msg_ids)
    sends = cluster.a.sends + cluster.b.sends
    assert len(sends) == 1 and sends[0].code == RequestCode.SEND_BATCH_MESSAGE
    broker = cluster.a if r.message_queue.broker_name == "broker-a" else cluster.b
    recs = broker.queues[("T", r.message_queue.queue_id)]
    assert [decode(x.raw).body for x in recs] == [m.body for m in msgs]
    assert recs[0].physical_offset == r.offset
    with pytest.raises(ClientError):
        await p.send_batch([Message("T", b"x"), Message("U", b"y")])
    with pytest.raises(EmptyBodyError):
        await p.send_batch([])


async def test_send_oneway(cluster: FakeCluster, make_producer: MakeProducer) -> None:
    p = await make_producer()
    for i in range(5):
        await p.send_oneway(Message("T", f"o{i}".encode()))
    for _ in range(100):
        if len(all_bodies(cluster)) == 5:
            break
        await asyncio.sleep(0.01)
    assert sorted(all_bodies(cluster)) == [f"o{i}".encode() for i in range(5)]
    assert all(s.oneway for s in cluster.a.sends + cluster.b.sends)
    # A broker that cannot be reached is skipped (once the client saw its connection close:
    # until then a oneway write into the dead connection is lost, as oneway allows).
    await cluster.a.stop()
    await asyncio.sleep(0.05)
    for i in range(4):
        await p.send_oneway(Message("T", f"p{i}".encode()))
    want = {f"p{i}".encode() for i in range(4)}
    for _ in range(100):
        if want <= set(cluster.b.bodies("T")):
            break
        await asyncio.sleep(0.01)
    assert want <= set(cluster.b.bodies("T"))


# ---------------------------------------------------------------------- compression


async def test_compression_round_trip(
    cluster: FakeCluster, make_producer: MakeProducer, admin: AsyncAdminClient
) -> None:
    p = await make_producer(compress_over_bytes=1024)
    big = b"orbitmq " * 2000
    r1 = await p.send(Message("T", big), queue=MessageQueue("T", "broker-a", 0))
    r2 = await p.send(Message("T", b"tiny"), queue=MessageQueue("T", "broker-a", 0))
    f3 = p.send_async(Message("T", big + b"!"), queue=MessageQueue("T", "broker-a", 0))
    await f3
    r4 = await p.send_batch(
        [Message("T", big), Message("T", b"short")], queue=MessageQueue("T", "broker-a", 0)
    )
    raw = [decode(x.raw) for x in cluster.a.queues[("T", 0)]]
    assert [m.sys_flag for m in raw] == [ZSTD, 0, ZSTD, ZSTD, ZSTD]
    assert len(raw[0].body) < len(big) // 10
    assert zstandard.ZstdDecompressor().decompress(raw[0].body) == big
    pulled = await admin.pull(MessageQueue("T", "broker-a", 0), 0, max_nums=10)
    assert [m.body for m in pulled.messages] == [big, b"tiny", big + b"!", big, b"short"]
    assert all(m.sys_flag == 0 for m in pulled.messages)
    assert [r1.queue_offset, r2.queue_offset, r4.queue_offset] == [0, 1, 3]
    # The compressed size is what the limit applies to: an incompressible body is not shrunk.
    import os

    noise = os.urandom(3000)
    await p.send(Message("T", noise), queue=MessageQueue("T", "broker-a", 1))
    stored = decode(cluster.a.queues[("T", 1)][0].raw)
    assert stored.sys_flag == 0 and stored.body == noise


# ---------------------------------------------------------------------- blocking wrapper


def test_blocking_producer_against_fakes_on_own_thread() -> None:
    from orbitmq.client._loop_thread import LoopThread
    from tests.client.fakes import FakeBroker, FakeNamesrv

    server_thread = LoopThread("fake-servers")
    try:

        async def setup() -> tuple[FakeNamesrv, FakeBroker]:
            b = await FakeBroker("broker-a").start()
            b.add_topic("T", 2)
            ns = await FakeNamesrv().start()
            ns.register([b])
            return ns, b

        ns, broker = server_thread.run(setup())
        with Producer([ns.addr], ProducerConfig(linger_ms=5, send_timeout_s=2.0)) as p:
            r = p.send(Message("T", b"sync"))
            assert r.status is SendStatus.SEND_OK
            assert p.send_batch([Message("T", b"b1"), Message("T", b"b2")]).msg_ids
            p.send_oneway(Message("T", b"oneway"))
            got: list[SendResult] = []
            done = threading.Event()

            def cb(res: SendResult | None, err: BaseException | None) -> None:
                assert err is None and res is not None
                got.append(res)
                if len(got) == 200:
                    done.set()

            futs = [p.send_async(Message("T", f"a{i}".encode()), cb) for i in range(200)]
            results = [f.result(timeout=5) for f in futs]
            assert done.wait(5)
            assert {r.msg_id for r in results} == {r.msg_id for r in got}

            # From several threads at once.
            def worker(k: int) -> None:
                for i in range(50):
                    p.send_async(Message("T", f"t{k}-{i}".encode())).result(timeout=5)

            threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            with pytest.raises(InvalidTopicError):
                p.send_async(Message("bad topic", b"x"))
        with pytest.raises(ClientError):
            p.send(Message("T", b"after close"))
        with pytest.raises(ClientError):
            p.send_async(Message("T", b"after close"))
        bodies = server_thread.run(_bodies(broker))
        assert len(bodies) == 1 + 2 + 1 + 200 + 200
        frames = len(broker.sends)
        assert frames < 1 + 1 + 1 + 200 // 2 + 200  # async sends were batched
    finally:
        try:
            server_thread.run(_stop(ns, broker))
        finally:
            server_thread.stop()


async def _bodies(broker: Any) -> list[bytes]:
    await asyncio.sleep(0.05)  # let the oneway land
    return list(broker.bodies("T"))


async def _stop(*servers: Any) -> None:
    for s in servers:
        await s.stop()


def test_blocking_producer_buffer_limit_blocks_until_answered() -> None:
    from orbitmq.client._loop_thread import LoopThread
    from tests.client.fakes import FakeBroker, FakeNamesrv

    server_thread = LoopThread("fake-servers")
    try:

        async def setup() -> tuple[FakeNamesrv, FakeBroker]:
            b = await FakeBroker("broker-a").start()
            b.add_topic("T", 1)
            b.delay_s = 0.3
            ns = await FakeNamesrv().start()
            ns.register([b])
            return ns, b

        ns, broker = server_thread.run(setup())
        with Producer(
            [ns.addr],
            ProducerConfig(
                send_timeout_s=2.0, max_buffered_bytes=10_000, linger_ms=1, compress_over_bytes=-1
            ),
        ) as p:
            first = p.send_async(Message("T", b"x" * 6000))
            started = time.monotonic()
            # The second does not fit until the first is answered (after 0.3 s).
            second = p.send_async(Message("T", b"y" * 6000))
            assert time.monotonic() - started > 0.2
            assert first.done()
            assert second.result(timeout=5).queue_offset == 1
    finally:
        try:
            server_thread.run(_stop(ns, broker))
        finally:
            server_thread.stop()
