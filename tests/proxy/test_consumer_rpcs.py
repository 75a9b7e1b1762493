"""The proxy's consumer RPCs over a real gRPC channel, with OrbitMQ's generated stubs, against a
real NameServer and two real brokers (in-process, on a background loop with the proxy).

Messages are produced with the native SDK and consumed through the proxy, so every test also
checks that the two meet. Each test has its own topic and consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.proxy import receipt
from orbitmq.proxy.consumer_service import ConsumerRpcs
from orbitmq.proxy.convert import crc32_hex
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from tests.proxy.conftest import ProxyEnv, proxy_env_fixture

BROKERS = ("broker-a", "broker-b")
QUEUES = 2
TOPICS = {  # name -> message type; each test owns one
    "PxBasic": "NORMAL",
    "PxChange": "NORMAL",
    "PxRedeliver": "NORMAL",
    "PxFifo": "FIFO",
    "PxFilter": "NORMAL",
    "PxPoll": "NORMAL",
    "PxCancel": "NORMAL",
    "PxPull": "NORMAL",
    "PxRenew": "NORMAL",
    "PxDlq": "NORMAL",
    "PxBad": "NORMAL",
    "PxOff": "NORMAL",
}


env = proxy_env_fixture(
    TOPICS,
    brokers=BROKERS,
    queues=QUEUES,
    # Auto-renewed messages: a 2 s invisible time, renewed 1 s before it ends, every 0.2 s.
    proxy_options={
        "invisible_default_s": 2.0,
        "auto_renew_period_s": 0.2,
        "auto_renew_ahead_s": 1.0,
    },
)


def rpcs_of(env: ProxyEnv) -> ConsumerRpcs:
    assert env.proxy.servicer is not None
    consumer = env.proxy.servicer.consumer
    assert isinstance(consumer, ConsumerRpcs)
    return consumer


@pytest.fixture
async def producer(env: ProxyEnv) -> AsyncIterator[AsyncProducer]:
    p = AsyncProducer([env.ns], ProducerConfig(send_timeout_s=3.0))
    await p.start()
    try:
        yield p
    finally:
        await p.close()


def md(client_id: str = "test-client") -> list[tuple[str, str]]:
    return [("x-mq-client-id", client_id)]


def res(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def mq(topic: str, broker: str = "broker-a", queue_id: int = 0) -> pb.MessageQueue:
    return pb.MessageQueue(topic=res(topic), id=queue_id, broker=pb.Broker(name=broker))


@dataclass
class Received:
    responses: list[svc.ReceiveMessageResponse]

    @property
    def status(self) -> pb.Status:
        found = [r.status for r in self.responses if r.HasField("status")]
        assert len(found) == 1, self.responses
        return found[0]

    @property
    def messages(self) -> list[pb.Message]:
        return [r.message for r in self.responses if r.HasField("message")]


async def receive(
    stub: service_pb2_grpc.MessagingServiceStub,
    group: str,
    topic: str,
    *,
    broker: str = "broker-a",
    batch: int = 16,
    invisible_s: float | None = 10.0,
    poll_s: float = 0.0,
    expr: pb.FilterExpression | None = None,
    auto_renew: bool = False,
    queue_id: int = 0,
    client_id: str = "test-client",
) -> Received:
    req = svc.ReceiveMessageRequest(
        group=res(group),
        message_queue=mq(topic, broker, queue_id),
        filter_expression=expr or pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=batch,
        auto_renew=auto_renew,
    )
    if invisible_s is not None:
        req.invisible_duration.FromMilliseconds(int(invisible_s * 1000))
    req.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
    call = stub.ReceiveMessage(req, metadata=md(client_id), timeout=poll_s + 5)
    return Received([r async for r in call])


async def no_backoff(env: ProxyEnv, group: str) -> None:
    """RocketMQ 5's simple consumer behaviour: visible again right when the invisible time ends
    (OrbitMQ's default adds the group's Pop backoff, 10 s first)."""
    async with AsyncAdminClient([env.ns]) as admin:
        await admin.update_group_config(
            SubscriptionGroupConfig(group_name=group, pop_retry_delays_ms=[])
        )


async def prime(stub: service_pb2_grpc.MessagingServiceStub, group: str, topic: str) -> None:
    """A group's first pop fixes where it starts (the queues' ends, RocketMQ 5's default)."""
    for broker in BROKERS:
        r = await receive(stub, group, topic, broker=broker)
        assert r.status.code == pb.MESSAGE_NOT_FOUND, r.status


async def receive_n(
    stub: service_pb2_grpc.MessagingServiceStub, group: str, topic: str, n: int, **kw: Any
) -> list[Received]:
    """Receives until ``n`` messages came (a message is popped once the broker dispatched it,
    which may be a moment after the send was answered)."""
    out: list[Received] = []
    deadline = time.monotonic() + 10
    while sum(len(r.messages) for r in out) < n:
        assert time.monotonic() < deadline, out
        got = await receive(stub, group, topic, poll_s=2, **kw)
        if got.messages:
            out.append(got)
    return out


async def send(
    producer: AsyncProducer, topic: str, n: int, *, broker: str = "broker-a", **kw: Any
) -> list[str]:
    ids = []
    for i in range(n):
        m = Message(topic, f"m{i}".encode(), **kw)
        r = await producer.send(m, queue=MessageQueue(topic, broker, i % QUEUES))
        ids.append(r.msg_id)
    return ids


async def ack(
    stub: service_pb2_grpc.MessagingServiceStub,
    group: str,
    topic: str,
    msgs: Sequence[tuple[str, str]],
) -> svc.AckMessageResponse:
    req = svc.AckMessageRequest(group=res(group), topic=res(topic))
    for mid, handle in msgs:
        req.entries.add(message_id=mid, receipt_handle=handle)
    return await stub.AckMessage(req, metadata=md(), timeout=5)


def ids_handles(msgs: Sequence[pb.Message]) -> list[tuple[str, str]]:
    return [(m.system_properties.message_id, m.system_properties.receipt_handle) for m in msgs]


# ---------------------------------------------------------------------------------------------


async def test_receive_and_ack_across_brokers(stub: Any, producer: AsyncProducer) -> None:
    topic, group = "PxBasic", "GBasic"
    await prime(stub, group, topic)
    sent = await send(
        producer, topic, 3, tags="TagA", keys=["k1", "k2"], properties={"color": "red"}
    )
    sent += await send(producer, topic, 1, broker="broker-b", tags="TagA")
    got_a = await receive_n(stub, group, topic, 3, broker="broker-a")
    got_b = await receive_n(stub, group, topic, 1, broker="broker-b")
    # Stream layout: status first, then the messages, then the delivery timestamp.
    for got in got_a + got_b:
        kinds = [r.WhichOneof("content") for r in got.responses]
        n = len(got.messages)
        assert kinds == ["status"] + ["message"] * n + ["delivery_timestamp"], kinds
        assert got.status.code == pb.OK
    msgs = [m for got in got_a + got_b for m in got.messages]
    assert sorted(m.system_properties.message_id for m in msgs) == sorted(sent)
    first = min(msgs, key=lambda m: m.body)
    sp = first.system_properties
    assert first.topic.name == topic and first.body == b"m0"
    assert sp.tag == "TagA" and list(sp.keys) == ["k1", "k2"]
    assert dict(first.user_properties) == {"color": "red"}
    assert sp.body_encoding == pb.IDENTITY
    assert sp.body_digest.type == pb.CRC32 and sp.body_digest.checksum == crc32_hex(b"m0")
    assert sp.delivery_attempt == 1 and sp.message_type == pb.NORMAL
    assert sp.receipt_handle.startswith("o1:") and sp.receipt_handle.endswith(":broker-a")
    assert sp.queue_id == 0 and sp.HasField("queue_offset")
    assert sp.born_timestamp.ToMilliseconds() > 0 and sp.store_timestamp.ToMilliseconds() > 0
    # One AckMessage with handles of both brokers: one batch ack per broker, per-entry status.
    resp = await ack(stub, group, topic, ids_handles(msgs))
    assert resp.status.code == pb.OK, resp.status
    assert [e.status.code for e in resp.entries] == [pb.OK] * 4
    # Acked twice: the broker's handle is no longer current.
    again = await ack(stub, group, topic, ids_handles(msgs[:1]))
    assert again.status.code == pb.INVALID_RECEIPT_HANDLE, again.status
    # Nothing left.
    assert (await receive(stub, group, topic)).status.code == pb.MESSAGE_NOT_FOUND


async def test_change_invisible_then_ack_with_new_handle(
    stub: Any, producer: AsyncProducer
) -> None:
    topic, group = "PxChange", "GChange"
    await prime(stub, group, topic)
    await send(producer, topic, 1)
    (msg,) = (await receive_n(stub, group, topic, 1))[0].messages
    mid, old = msg.system_properties.message_id, msg.system_properties.receipt_handle
    req = svc.ChangeInvisibleDurationRequest(
        group=res(group), topic=res(topic), receipt_handle=old, message_id=mid
    )
    req.invisible_duration.FromSeconds(30)
    changed = await stub.ChangeInvisibleDuration(req, metadata=md(), timeout=5)
    assert changed.status.code == pb.OK, changed.status
    new = changed.receipt_handle
    assert new != old and new.startswith("o1:")
    assert (await ack(stub, group, topic, [(mid, old)])).status.code == pb.INVALID_RECEIPT_HANDLE
    assert (await ack(stub, group, topic, [(mid, new)])).status.code == pb.OK
    # An illegal duration is refused, and the client keeps its handle (it copies the answer's).
    req.invisible_duration.FromMilliseconds(10)
    req.receipt_handle = new
    bad = await stub.ChangeInvisibleDuration(req, metadata=md(), timeout=5)
    assert bad.status.code == pb.ILLEGAL_INVISIBLE_TIME and bad.receipt_handle == new


async def test_redelivery_after_invisible_time(
    env: ProxyEnv, stub: Any, producer: AsyncProducer
) -> None:
    topic, group = "PxRedeliver", "GRedeliver"
    await no_backoff(env, group)
    await prime(stub, group, topic)
    (sent,) = await send(producer, topic, 1)
    (first,) = (await receive_n(stub, group, topic, 1, invisible_s=1.0))[0].messages
    assert first.system_properties.delivery_attempt == 1
    again = await receive(stub, group, topic, invisible_s=10.0, poll_s=8)
    (second,) = again.messages
    assert second.system_properties.message_id == sent
    assert second.system_properties.delivery_attempt == 2
    assert second.topic.name == topic  # read from the pop retry topic, reported as the original
    stale = await ack(stub, group, topic, ids_handles([first]))
    assert stale.status.code == pb.INVALID_RECEIPT_HANDLE
    assert (await ack(stub, group, topic, ids_handles([second]))).status.code == pb.OK


async def test_fifo_one_message_per_group_in_flight(stub: Any, producer: AsyncProducer) -> None:
    topic, group = "PxFifo", "GFifo"
    await prime(stub, group, topic)
    for body, mgroup in [("a1", "ga"), ("b1", "gb"), ("a2", "ga"), ("a3", "ga"), ("b2", "gb")]:
        msg = Message(topic, body.encode(), properties={"__SHARDINGKEY": mgroup})
        await producer.send(msg, queue=MessageQueue(topic, "broker-a", 0))
    order: list[bytes] = []
    for _ in range(5):
        got = await receive(stub, group, topic, batch=32, poll_s=2)
        assert got.status.code == pb.OK, got.status
        groups = [m.system_properties.message_group for m in got.messages]
        assert len(groups) == len(set(groups)), groups  # never two of one group at once
        assert all(m.system_properties.message_type == pb.FIFO for m in got.messages)
        order += [m.body for m in got.messages]
        # Held: nothing more of these groups until they are acked.
        held = await receive(stub, group, topic, batch=32)
        assert not {m.system_properties.message_group for m in held.messages} & set(groups)
        await ack(stub, group, topic, ids_handles(got.messages + held.messages))
        order += [m.body for m in held.messages]
        if len(order) == 5:
            break
    assert [b for b in order if b.startswith(b"a")] == [b"a1", b"a2", b"a3"]
    assert [b for b in order if b.startswith(b"b")] == [b"b1", b"b2"]


async def test_tag_and_sql_filters(stub: Any, producer: AsyncProducer) -> None:
    topic = "PxFilter"
    await prime(stub, "GTag", topic)
    await prime(stub, "GSql", topic)
    for i, tag in enumerate(["TagA", "TagB", "TagC", "TagA"]):
        await producer.send(
            Message(topic, f"{tag}-{i}".encode(), tags=tag, properties={"n": str(i)}),
            queue=MessageQueue(topic, "broker-a", 0),
        )
    tag_expr = pb.FilterExpression(type=pb.TAG, expression="TagA || TagC")
    got = await receive_n(stub, "GTag", topic, 3, expr=tag_expr)
    assert sorted(m.body for r in got for m in r.messages) == [b"TagA-0", b"TagA-3", b"TagC-2"]
    sql = pb.FilterExpression(type=pb.SQL, expression="n >= 1 AND TAGS <> 'TagC'")
    got = await receive_n(stub, "GSql", topic, 2, expr=sql)
    assert sorted(m.body for r in got for m in r.messages) == [b"TagA-3", b"TagB-1"]
    for group in ("GTag", "GSql"):  # nothing else passes
        assert not (await receive(stub, group, topic, expr=tag_expr, poll_s=0.5)).messages
    bad = pb.FilterExpression(type=pb.SQL, expression="n >>> 1")
    refused = await receive(stub, "GSql", topic, expr=bad)
    assert refused.status.code == pb.ILLEGAL_FILTER_EXPRESSION, refused.status


async def test_long_poll_returns_when_a_message_arrives(stub: Any, producer: AsyncProducer) -> None:
    topic, group = "PxPoll", "GPoll"
    await prime(stub, group, topic)
    started = time.monotonic()
    pending = asyncio.ensure_future(receive(stub, group, topic, poll_s=15))
    await asyncio.sleep(0.3)
    assert not pending.done()
    (sent,) = await send(producer, topic, 1, broker="broker-a")
    got = await asyncio.wait_for(pending, 10)
    assert [m.system_properties.message_id for m in got.messages] == [sent]
    assert time.monotonic() - started < 8  # well before the 15 s poll ends
    # The client's deadline bounds the poll: a 30 s poll with a 2 s deadline answers in time.
    req = svc.ReceiveMessageRequest(
        group=res(group), message_queue=mq(topic), batch_size=1, auto_renew=False
    )
    req.invisible_duration.FromSeconds(10)
    req.long_polling_timeout.FromSeconds(30)
    t0 = time.monotonic()
    call = stub.ReceiveMessage(req, metadata=md(), timeout=2.0)
    responses = [r async for r in call]
    assert time.monotonic() - t0 < 2.0
    assert Received(responses).status.code == pb.MESSAGE_NOT_FOUND


async def test_cancelled_receive_gives_its_messages_back(
    env: ProxyEnv, stub: Any, producer: AsyncProducer
) -> None:
    """A client that gives up during the long poll: the pop still finishes at the broker, and
    the proxy makes what it popped visible again at once (not after the 10 s invisible time)."""
    topic, group = "PxCancel", "GCancel"
    await no_backoff(env, group)
    await prime(stub, group, topic)
    pending = asyncio.ensure_future(receive(stub, group, topic, poll_s=10))
    await asyncio.sleep(0.3)
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending
    (sent,) = await send(producer, topic, 1)
    await asyncio.sleep(0.3)  # the abandoned pop takes it
    t0 = time.monotonic()
    (got,) = await receive_n(stub, group, topic, 1, invisible_s=10.0)
    assert time.monotonic() - t0 < 6
    (msg,) = got.messages
    assert msg.system_properties.message_id == sent
    assert msg.system_properties.delivery_attempt == 2
    assert (await ack(stub, group, topic, ids_handles([msg]))).status.code == pb.OK


async def test_query_assignment(env: ProxyEnv, stub: Any) -> None:
    host, port = env.endpoint.split(":")
    endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])
    req = svc.QueryAssignmentRequest(topic=res("PxBasic"), group=res("G"), endpoints=endpoints)
    resp = await stub.QueryAssignment(req, metadata=md(), timeout=5)
    assert resp.status.code == pb.OK, resp.status
    queues = sorted((a.message_queue.broker.name, a.message_queue.id) for a in resp.assignments)
    assert queues == [(b, q) for b in BROKERS for q in range(QUEUES)]
    for a in resp.assignments:
        assert a.message_queue.broker.endpoints == endpoints  # back to the proxy
        assert a.message_queue.broker.id == 0 and a.message_queue.permission == pb.READ
    missing = svc.QueryAssignmentRequest(topic=res("NoSuchTopic"), group=res("G"))
    resp = await stub.QueryAssignment(missing, metadata=md(), timeout=5)
    assert resp.status.code == pb.TOPIC_NOT_FOUND, resp.status


async def test_pull_and_offsets(stub: Any, producer: AsyncProducer) -> None:
    topic, group = "PxPull", "GPull"
    queue = mq(topic, "broker-b", 1)
    sent = [
        (await producer.send(Message(topic, f"p{i}".encode(), tags="T" + "AB"[i % 2]),
                             queue=MessageQueue(topic, "broker-b", 1))).msg_id
        for i in range(4)
    ]  # fmt: skip

    async def offset(policy: int, **kw: Any) -> int:
        req = svc.QueryOffsetRequest(message_queue=queue, query_offset_policy=policy, **kw)
        resp = await stub.QueryOffset(req, metadata=md(), timeout=5)
        assert resp.status.code == pb.OK, resp.status
        return int(resp.offset)

    begin, end = await offset(pb.BEGINNING), await offset(pb.END)
    deadline = time.monotonic() + 5
    while end - begin < 4:  # sent, and being dispatched to the queue
        assert time.monotonic() < deadline, (begin, end)
        await asyncio.sleep(0.02)
        end = await offset(pb.END)
    assert end - begin == 4
    assert await offset(pb.TIMESTAMP, timestamp={"seconds": 0}) == begin

    async def pull(at: int, expr: str = "*") -> list[svc.PullMessageResponse]:
        req = svc.PullMessageRequest(
            group=res(group), message_queue=queue, offset=at, batch_size=32,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=expr),
        )  # fmt: skip
        return [r async for r in stub.PullMessage(req, metadata=md(), timeout=5)]

    got = await pull(begin)
    kinds = [r.WhichOneof("content") for r in got]
    assert kinds == ["status"] + ["message"] * 4 + ["next_offset"], kinds
    assert [r.message.system_properties.message_id for r in got[1:5]] == sent
    assert got[-1].next_offset == end
    tagged = await pull(begin, "TB")
    assert [r.message.body for r in tagged if r.HasField("message")] == [b"p1", b"p3"]
    empty = await pull(end)
    assert empty[0].status.code == pb.MESSAGE_NOT_FOUND and empty[-1].next_offset == end
    beyond_end = await pull(end + 100)
    assert beyond_end[0].status.code == pb.ILLEGAL_OFFSET, beyond_end[0].status

    get = svc.GetOffsetRequest(group=res(group), message_queue=queue)
    none = await stub.GetOffset(get, metadata=md(), timeout=5)
    assert none.status.code == pb.OFFSET_NOT_FOUND, none.status
    upd = svc.UpdateOffsetRequest(group=res(group), message_queue=queue, offset=begin + 2)
    assert (await stub.UpdateOffset(upd, metadata=md(), timeout=5)).status.code == pb.OK
    after = await stub.GetOffset(get, metadata=md(), timeout=5)
    assert after.status.code == pb.OK and after.offset == begin + 2
    upd.offset = end + 100
    beyond = await stub.UpdateOffset(upd, metadata=md(), timeout=5)
    assert beyond.status.code == pb.ILLEGAL_OFFSET, beyond.status


async def test_disabled_group_is_refused_on_receive_and_pull(
    env: ProxyEnv, stub: Any, producer: AsyncProducer
) -> None:
    """consume_enable off (RocketMQ's consumeEnable): the proxy's ReceiveMessage and a
    PullMessage naming the group answer FORBIDDEN and hand out nothing; a message received
    before can still be acked (finishing work is never refused); on again, the rest come."""
    topic, group = "PxOff", "GOff"
    await send(producer, topic, 2)
    (first,) = await receive_n(stub, group, topic, 1, batch=1)  # a new group: from 0
    assert len(first.messages) == 1, first.responses

    async def enable(on: bool) -> None:
        async with AsyncAdminClient([env.ns]) as admin:
            await admin.update_group_config(
                SubscriptionGroupConfig(group_name=group, consume_enable=on)
            )

    await enable(False)
    try:
        off = await receive(stub, group, topic)
        assert off.status.code == pb.FORBIDDEN and not off.messages, off.responses
        req = svc.PullMessageRequest(
            group=res(group), message_queue=mq(topic), offset=0, batch_size=32,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        )  # fmt: skip
        pulled = [r async for r in stub.PullMessage(req, metadata=md(), timeout=5)]
        assert pulled[0].status.code == pb.FORBIDDEN, pulled[0].status
        assert not any(r.HasField("message") for r in pulled)
        acked = await ack(stub, group, topic, ids_handles(first.messages))
        assert acked.status.code == pb.OK, acked.status
    finally:
        await enable(True)
    rest = await receive_n(stub, group, topic, 1)
    bodies = [m.body for r in [first, *rest] for m in r.messages]
    assert sorted(bodies) == [b"m0", b"m1"]


async def test_auto_renew_keeps_a_push_message_invisible(
    env: ProxyEnv, stub: Any, producer: AsyncProducer
) -> None:
    """A push consumer sends no invisible time: the proxy pops with its own (2 s here) and renews
    it while the client holds the message; the client acks with the handle it got first."""
    topic, group = "PxRenew", "GRenew"
    await no_backoff(env, group)
    await prime(stub, group, topic)
    await send(producer, topic, 2)
    got = await receive(
        stub, group, topic, invisible_s=None, auto_renew=True, poll_s=2, client_id="push-1"
    )
    assert got.status.code == pb.OK and len(got.messages) == 1  # queue 0 only: its assignment
    renewed_before = rpcs_of(env).renewer.renewed
    await asyncio.sleep(3.5)  # past the 2 s invisible time, twice
    assert rpcs_of(env).renewer.renewed > renewed_before
    other = await receive(stub, group, topic, queue_id=0, client_id="simple-2")
    assert [m.body for m in other.messages] == [b"m1"]  # the held one stays invisible
    resp = await ack(stub, group, topic, ids_handles(got.messages + other.messages))
    assert resp.status.code == pb.OK, resp.entries
    # A client that leaves gives its held messages back after 1 s.
    await send(producer, topic, 1)
    held = await receive(
        stub, group, topic, invisible_s=None, auto_renew=True, poll_s=2, client_id="push-2"
    )
    assert len(held.messages) == 1
    env.run(rpcs_of(env).on_client_gone("push-2", group))
    back = await receive(stub, group, topic, poll_s=6, client_id="simple-2")
    assert back.messages and back.messages[0].system_properties.delivery_attempt == 2


async def test_forward_to_dlq_and_max_attempts(
    env: ProxyEnv, stub: Any, producer: AsyncProducer
) -> None:
    topic, group = "PxDlq", "GDlq"
    await no_backoff(env, group)
    await prime(stub, group, topic)
    (first_id,) = await send(producer, topic, 1)
    (msg,) = (await receive_n(stub, group, topic, 1))[0].messages
    fwd = svc.ForwardMessageToDeadLetterQueueRequest(
        group=res(group), topic=res(topic), message_id=first_id, delivery_attempt=1,
        max_delivery_attempts=1, receipt_handle=msg.system_properties.receipt_handle,
    )  # fmt: skip
    resp = await stub.ForwardMessageToDeadLetterQueue(fwd, metadata=md(), timeout=5)
    assert resp.status.code == pb.OK, resp.status
    # A push consumer told max_attempts = 1: its second delivery goes to the DLQ instead.
    told = pb.Settings(client_type=pb.PUSH_CONSUMER, backoff_policy=pb.RetryPolicy(max_attempts=1))
    env.run(rpcs_of(env).on_settings("push-dlq", told))
    (second_id,) = await send(producer, topic, 1)
    (got,) = await receive_n(stub, group, topic, 1, invisible_s=1.0, client_id="push-dlq")
    assert [m.system_properties.message_id for m in got.messages] == [second_id]
    again = await receive(stub, group, topic, poll_s=5, client_id="push-dlq")
    assert again.status.code == pb.MESSAGE_NOT_FOUND
    async with AsyncAdminClient([env.ns]) as admin:
        deadline = time.monotonic() + 5
        while True:
            dead = {d.origin_msg_id for d in await admin.dlq_messages(group)}
            if {first_id, second_id} <= dead or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert {first_id, second_id} <= dead
    assert (await receive(stub, group, topic)).status.code == pb.MESSAGE_NOT_FOUND


async def test_bad_receive_requests(stub: Any) -> None:
    no_invisible = await receive(stub, "GBad", "PxBad", invisible_s=None)
    assert no_invisible.status.code == pb.ILLEGAL_INVISIBLE_TIME
    too_long = await receive(stub, "GBad", "PxBad", invisible_s=13 * 3600)
    assert too_long.status.code == pb.ILLEGAL_INVISIBLE_TIME
    missing = await receive(stub, "GBad", "NoSuchTopic")
    assert missing.status.code == pb.TOPIC_NOT_FOUND, missing.status
    no_group = await receive(stub, "", "PxBad")
    assert no_group.status.code == pb.ILLEGAL_CONSUMER_GROUP


# Malformed receipt handles: clear codes, and the proxy stays up --------------------------------

_HANDLES = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda off, h, b: f"o1:{off}:{h}:{b}",
        st.text("0123456789abcdefxyz", max_size=20),
        st.text("ABCDEFabcdef0123456789-_:!", max_size=60),
        st.sampled_from(["broker-a", "broker-b", "nobody", ""]),
    ),
    st.just(receipt.encode("broker-a", 0, "A" * 48)),  # well formed, never issued
)


@settings(max_examples=40, deadline=None)
@given(handle=_HANDLES)
def test_malformed_receipt_handles(env: ProxyEnv, handle: str) -> None:
    with grpc.insecure_channel(env.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        req = svc.AckMessageRequest(group=res("GBad"), topic=res("PxBad"))
        req.entries.add(message_id="x", receipt_handle=handle)
        acked = stub.AckMessage(req, metadata=md(), timeout=5)
        assert acked.status.code == pb.INVALID_RECEIPT_HANDLE, acked.status
        assert acked.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE
        assert acked.status.message
        change = svc.ChangeInvisibleDurationRequest(
            group=res("GBad"), topic=res("PxBad"), receipt_handle=handle, message_id="x"
        )
        change.invisible_duration.FromSeconds(10)
        changed = stub.ChangeInvisibleDuration(change, metadata=md(), timeout=5)
        assert changed.status.code == pb.INVALID_RECEIPT_HANDLE, changed.status
        assert changed.receipt_handle == handle
        fwd = svc.ForwardMessageToDeadLetterQueueRequest(
            group=res("GBad"), topic=res("PxBad"), receipt_handle=handle, message_id="x",
            delivery_attempt=1,
        )  # fmt: skip
        forwarded = stub.ForwardMessageToDeadLetterQueue(fwd, metadata=md(), timeout=5)
        assert forwarded.status.code == pb.INVALID_RECEIPT_HANDLE, forwarded.status
        # Still serving.
        q = svc.QueryOffsetRequest(message_queue=mq("PxBad"), query_offset_policy=pb.END)
        assert stub.QueryOffset(q, metadata=md(), timeout=5).status.code == pb.OK


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=600), st.binary(max_size=64), st.none(), st.integers()))
def test_receipt_decode_refuses_garbage_clearly(text: object) -> None:
    try:
        parsed = receipt.decode(text)
    except receipt.MalformedHandleError as exc:
        assert str(exc)
        assert exc.code == ResponseCode.RECEIPT_HANDLE_INVALID
    else:
        assert isinstance(text, str) and parsed.text() == text


@given(
    broker=st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s),
    offset=st.integers(0, 2**63 - 1),
    handle=st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", min_size=48,
                   max_size=48),
)  # fmt: skip
def test_receipt_round_trip(broker: str, offset: int, handle: str) -> None:
    assert receipt.decode(receipt.encode(broker, offset, handle)) == receipt.ProxyHandle(
        broker, offset, handle
    )
