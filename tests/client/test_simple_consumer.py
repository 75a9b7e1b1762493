"""SimpleConsumer / AsyncSimpleConsumer: the client side against fake Pop brokers (every frame
seen, answers injected), then end to end against a real NameServer + BrokerController."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.consumer import simple as simple_consumer
from orbitmq.client.consumer import subscription
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.simple import (
    AsyncSimpleConsumer,
    ExpiredReceiptHandleError,
    InvalidReceiptHandleError,
    SimpleConsumer,
)
from orbitmq.client.consumer_types import ConsumeFromWhere, ReceivedMessage
from orbitmq.client.heartbeat import InvalidSubscriptionError
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import MessageQueue, TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    FilterExpressionError,
    InvalidTopicError,
    ProtocolError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
    RemoteError,
)
from orbitmq.common.filter import MessageFilter
from orbitmq.common.message import encode_properties
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    AckResults,
    HeartbeatData,
    ReceiptHandleList,
    pop_retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.messages import encode_send_body
from tests.client.fakes import FakeBroker, FakeNamesrv, StoredRecord, full_fields
from tests.client.test_e2e import broker_config, wait_route

pytestmark = pytest.mark.timeout(60)

# ---------------------------------------------------------------------------------------- fakes


class PopBroker(FakeBroker):
    """A fake broker with a toy Pop: hands out each stored record once (no revival), issues
    handles ``<broker>-<n>``, acks/changes live handles, answers EXPIRED for spent ones and
    INVALID for others. ``pop_answers`` scripts the next POP answers as (code, fields, body)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.pops: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.batch_acks: list[ReceiptHandleList] = []
        self.changes: list[dict[str, Any]] = []
        self.heartbeats: list[HeartbeatData] = []
        self.heartbeat_answer: tuple[int, str] = (ResponseCode.SUCCESS, "")
        self.pop_answers: list[tuple[int, dict[str, Any], bytes]] = []
        self.batch_ack_answer: tuple[int, str] | None = None
        self.cursor: dict[str, int] = {}
        self.live: dict[str, StoredRecord] = {}
        self.spent: set[str] = set()
        self._ids = itertools.count(1)

    async def put(self, topic: str, *bodies: bytes, tags: str = "") -> None:
        props = [encode_properties({"TAGS": tags} if tags else {}) for _ in bodies]
        frame = Frame(
            RequestCode.SEND_BATCH_MESSAGE,
            fields={"topic": topic, "queue_id": 0, "flag": 0, "sys_flag": 0, "born_ts": 1},
            body=encode_send_body(list(bodies), props),
        )
        resp = await self._send(frame)
        assert isinstance(resp, Frame) and resp.code == ResponseCode.SUCCESS

    def _handle(self, rec: StoredRecord) -> str:
        h = f"{self.name}-{next(self._ids)}"
        self.live[h] = rec
        return h

    def _settle(self, handle: str) -> tuple[int, str]:
        if self.live.pop(handle, None) is not None:
            self.spent.add(handle)
            return ResponseCode.SUCCESS, ""
        if handle in self.spent:
            return ResponseCode.RECEIPT_HANDLE_EXPIRED, f"{handle} is spent"
        return ResponseCode.RECEIPT_HANDLE_INVALID, f"{handle} was never issued"

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        f = full_fields(frame)  # what the broker reads: defaults filled in
        if frame.code == RequestCode.HEART_BEAT:
            self.heartbeats.append(decode_body(bytes(frame.body), HeartbeatData))
            return frame.reply(*self.heartbeat_answer)
        if frame.code == RequestCode.UNREGISTER_CLIENT:
            return frame.reply(ResponseCode.SUCCESS)
        if frame.code == RequestCode.POP_MESSAGE:
            self.pops.append(dict(f))
            if self.pop_answers:
                code, fields, body = self.pop_answers.pop(0)
                return frame.reply(code, fields=fields, body=body)
            records = [r for r in self.records if r.topic == f["topic"]]
            at = self.cursor.get(f["topic"], 0)
            out = records[at : at + f["max_msg_nums"]]
            if not out:
                await asyncio.sleep(min(f["poll_time_ms"], 50) / 1000)
                return frame.reply(ResponseCode.PULL_NOT_FOUND, "none")
            self.cursor[f["topic"]] = at + len(out)
            return frame.reply(
                ResponseCode.SUCCESS,
                fields={
                    "handles": [self._handle(r) for r in out],
                    "pop_time_ms": 1_000_000,
                    "invisible_time_ms": f["invisible_time_ms"],
                },
                body=b"".join(r.raw for r in out),
            )
        if frame.code == RequestCode.ACK_MESSAGE:
            self.acks.append(dict(f))
            return frame.reply(*self._settle(f["handle"]))
        if frame.code == RequestCode.BATCH_ACK_MESSAGE:
            req = decode_body(bytes(frame.body), ReceiptHandleList)
            self.batch_acks.append(req)
            if self.batch_ack_answer is not None:
                return frame.reply(*self.batch_ack_answer)
            settled = [self._settle(h) for h in req.handles]
            body = AckResults(codes=[c for c, _ in settled], remarks=[r for _, r in settled])
            return frame.reply(ResponseCode.SUCCESS, body=encode_body(body))
        if frame.code == RequestCode.CHANGE_MESSAGE_INVISIBLETIME:
            self.changes.append(dict(f))
            rec = self.live.pop(f["handle"], None)
            if rec is None:
                return frame.reply(*self._settle(f["handle"]))
            self.spent.add(f["handle"])
            return frame.reply(
                ResponseCode.SUCCESS,
                fields={
                    "handle": self._handle(rec),
                    "pop_time_ms": 2_000_000,
                    "invisible_time_ms": f["invisible_time_ms"],
                },
            )
        return await super().handle(frame, conn)


@dataclass
class Env:
    a: PopBroker
    b: PopBroker
    namesrv: FakeNamesrv
    made: list[AsyncSimpleConsumer] = field(default_factory=list)

    def consumer(self, group: str = "G", **opts: Any) -> AsyncSimpleConsumer:
        subscriptions = opts.pop("subscriptions", {"T": "*"})
        opts.setdefault("await_duration_s", 0.2)
        opts.setdefault("request_timeout_s", 1.0)
        opts.setdefault("namesrv_timeout_s", 1.0)
        opts.setdefault("connect_timeout_s", 1.0)
        c = AsyncSimpleConsumer(
            [self.namesrv.addr], group, SimpleConfig(**opts), subscriptions=subscriptions
        )
        self.made.append(c)
        return c


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    """Topic T on broker-a and broker-b, topic U on broker-a only."""
    a, b = await PopBroker("broker-a").start(), await PopBroker("broker-b").start()
    a.add_topic("T", 2)
    b.add_topic("T", 2)
    a.add_topic("U", 1)
    ns = await FakeNamesrv().start()
    ns.register([a, b])
    e = Env(a, b, ns)
    try:
        yield e
    finally:
        for c in e.made:
            await c.close()
        for x in (a, b):
            await x.stop()
        await ns.stop()


async def receive_all(c: AsyncSimpleConsumer, n: int, **opts: Any) -> list[ReceivedMessage]:
    out: list[ReceivedMessage] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out += await c.receive(**opts)
    return out


# ---------------------------------------------------------------------------------------- fake


async def test_start_beats_and_receive_decodes(env: Env) -> None:
    await env.a.put("U", b"m0", b"m1", tags="TagA")
    c = await env.consumer(
        subscriptions={"U": "TagA || TagB"}, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    ).start()
    assert len(env.a.heartbeats) == 1 and env.b.heartbeats == []
    data = env.a.heartbeats[0].consumers[0]
    assert (data.group, data.consume_type, data.message_model) == ("G", "POP", "CLUSTERING")
    assert data.consume_from_where == "FIRST_OFFSET"
    assert [(s.topic, s.expression_type, s.expression) for s in data.subscriptions] == [
        ("U", "TAG", "TagA || TagB")
    ]
    msgs = await c.receive(max_messages=8, invisible_duration_s=1.5)
    assert [m.body for m in msgs] == [b"m0", b"m1"]
    pop = env.a.pops[0]
    assert pop == {
        "group": "G",
        "topic": "U",
        "queue_id": -1,
        "max_msg_nums": 8,
        "invisible_time_ms": 1500,
        "poll_time_ms": 200,
        "expression_type": "TAG",
        "expression": "TagA || TagB",
        "consume_from_where": "FIRST_OFFSET",
        "client_id": c.client_id,
    }
    m = msgs[0]
    assert m.queue == MessageQueue("U", "broker-a", 0)
    assert m.broker_addr == env.a.addr
    assert m.receipt_handle.startswith("broker-a-")
    assert m.invisible_until_ms == 1_000_000 + 1500
    assert m.delivery_attempt == 1 and m.tags == "TagA" and m.topic == "U"
    assert await c.receive() == []  # nothing more: one long poll, then empty


async def test_receive_walks_brokers_round_robin_with_one_long_poll(env: Env) -> None:
    c = await env.consumer(await_duration_s=0.05).start()
    assert await c.receive() == []
    assert [p["poll_time_ms"] for p in env.a.pops + env.b.pops] == [0, 50]
    assert env.b.pops[0]["poll_time_ms"] == 50  # the walk started at broker-a
    await c.receive()
    assert env.a.pops[-1]["poll_time_ms"] == 50  # and now at broker-b
    assert env.b.pops[-1]["poll_time_ms"] == 0
    await env.b.put("T", b"on-b")
    got = await c.receive()  # found on b by the quick pop or the long poll
    assert [m.body for m in got] == [b"on-b"] and got[0].broker_addr == env.b.addr


async def test_receive_skips_a_broken_broker(env: Env) -> None:
    c = await env.consumer().start()
    await env.b.put("T", b"x")
    env.a.pop_answers.append((ResponseCode.SYSTEM_ERROR, {}, b""))
    got = await receive_all(c, 1)
    assert [m.body for m in got] == [b"x"]
    await env.b.stop()
    assert await c.receive() == []  # a answered (empty): no error


async def test_receive_raises_when_no_broker_answers(env: Env) -> None:
    c = await env.consumer(subscriptions={"U": "*"}).start()
    env.a.pop_answers.append((ResponseCode.POLLING_FULL, {}, b""))
    with pytest.raises(RemoteError) as info:
        await c.receive()
    assert info.value.code == ResponseCode.POLLING_FULL
    await env.a.stop()
    with pytest.raises(RemoteError):
        await c.receive()


async def test_receive_survives_a_topic_losing_its_route(env: Env) -> None:
    c = await env.consumer(subscriptions={"T": "*", "U": "*"}).start()
    await env.b.put("T", b"t")
    del env.namesrv.routes["U"]
    c.routes.forget("U")
    got = await receive_all(c, 1)
    assert [m.body for m in got] == [b"t"]
    await c.unsubscribe("T")
    with pytest.raises(TopicRouteNotFoundError):
        await c.receive()


async def test_malformed_pop_answer(env: Env) -> None:
    c = await env.consumer(subscriptions={"U": "*"}).start()
    await env.a.put("U", b"x")
    raw = env.a.records[0].raw
    env.a.pop_answers.append((ResponseCode.SUCCESS, {"handles": []}, raw))
    with pytest.raises(ProtocolError, match="handles"):  # raised: no other broker answered
        await c.receive()
    env.a.pop_answers.append((ResponseCode.SUCCESS, {"handles": ["h"]}, raw[:-3]))
    with pytest.raises(ProtocolError):
        await c.receive()


async def test_ack_and_errors(env: Env) -> None:
    c = await env.consumer(subscriptions={"U": "*"}).start()
    await env.a.put("U", b"x")
    (m,) = await receive_all(c, 1)
    await c.ack(m)
    assert env.a.acks == [{"group": "G", "topic": "U", "handle": m.receipt_handle}]
    with pytest.raises(ExpiredReceiptHandleError) as info:
        await c.ack(m)
    assert isinstance(info.value, ReceiptHandleExpiredError)
    assert info.value.code == ResponseCode.RECEIPT_HANDLE_EXPIRED
    # A copy read from the pop retry topic is acked with the topic it was popped for.
    await env.a.put("U", b"y")
    (m2,) = await receive_all(c, 1)
    retried = dataclasses.replace(
        m2, message=dataclasses.replace(m2.message, topic=pop_retry_topic("G", "U"))
    )
    await c.ack(retried)
    assert env.a.acks[-1]["topic"] == "U"
    bogus = ReceivedMessage(m.message, m.queue, "nope", m.broker_addr, 0)
    with pytest.raises(InvalidReceiptHandleError) as info2:
        await c.ack(bogus)
    assert isinstance(info2.value, ReceiptHandleInvalidError)
    assert isinstance(info2.value, RemoteError)


async def test_change_invisible_duration(env: Env) -> None:
    c = await env.consumer(subscriptions={"U": "*"}).start()
    await env.a.put("U", b"x")
    (m,) = await receive_all(c, 1)
    m2 = await c.change_invisible_duration(m, 2.5)
    assert env.a.changes[0]["invisible_time_ms"] == 2500
    assert m2.receipt_handle != m.receipt_handle and m2.body == b"x"
    assert m2.invisible_until_ms == 2_000_000 + 2500
    with pytest.raises(ExpiredReceiptHandleError):
        await c.ack(m)
    await c.ack(m2)
    with pytest.raises(ClientError):
        await c.change_invisible_duration(m2, 0.01)


async def test_ack_many_per_broker_and_topic(env: Env) -> None:
    c = await env.consumer(subscriptions={"T": "*", "U": "*"}).start()
    await env.a.put("T", b"a1", b"a2")
    await env.b.put("T", b"b1")
    await env.a.put("U", b"u1")
    msgs = await receive_all(c, 4)
    await c.ack(msgs[0])
    results = await c.ack_many(msgs)
    assert isinstance(results[0], ExpiredReceiptHandleError)
    assert results[1:] == [None, None, None]
    assert sorted((r.topic, len(r.handles)) for r in env.a.batch_acks) == [("T", 2), ("U", 1)]
    assert [len(r.handles) for r in env.b.batch_acks] == [1]
    assert await c.ack_many([]) == []
    env.b.batch_ack_answer = (ResponseCode.SYSTEM_BUSY, "busy")
    await env.b.put("T", b"b2")
    more = await receive_all(c, 1)
    res = await c.ack_many(more)
    assert isinstance(res[0], RemoteError) and res[0].code == ResponseCode.SYSTEM_BUSY


async def test_invalid_subscriptions(env: Env) -> None:
    with pytest.raises(FilterExpressionError):
        env.consumer(subscriptions={"T": ("XPATH", "a")})
    with pytest.raises(FilterExpressionError):
        env.consumer(subscriptions={"T": " "})
    with pytest.raises(FilterExpressionError):
        env.consumer(subscriptions={"T": ("SQL92", "a" * 5000)})
    with pytest.raises(FilterExpressionError, match="ends too early"):
        env.consumer(subscriptions={"T": ("SQL92", "a >")})  # compiled by the client
    with pytest.raises(InvalidTopicError):
        env.consumer(subscriptions={"bad topic": "*"})
    env.a.heartbeat_answer = (ResponseCode.SUBSCRIPTION_PARSE_FAILED, "no")
    c = env.consumer(subscriptions={"T": ("sql92", "a > 1")})
    with pytest.raises(InvalidSubscriptionError):
        await c.start()
    with pytest.raises(ClientError):
        await c.receive()  # closed after the failed start
    with pytest.raises(ClientError):
        await c.start()


async def test_subscribe_when_running_keeps_the_old_one_on_refusal(env: Env) -> None:
    c = await env.consumer(subscriptions={"U": "*"}).start()
    with pytest.raises(FilterExpressionError):
        await c.subscribe("U", "a >", "SQL92")
    assert len(env.a.heartbeats) == 1  # refused before asking a broker
    env.a.heartbeat_answer = (ResponseCode.SUBSCRIPTION_PARSE_FAILED, "no")
    with pytest.raises(InvalidSubscriptionError):
        await c.subscribe("U", "a > 1", "SQL92")
    assert c.subscriptions["U"].expression == "*"
    with pytest.raises(InvalidSubscriptionError):
        await c.subscribe("T", "a > 1", "SQL92")
    assert "T" not in c.subscriptions
    env.a.heartbeat_answer = (ResponseCode.SUCCESS, "")
    await c.subscribe("T", "TagA")
    assert env.b.heartbeats  # T's other broker now beaten too
    assert [s.topic for s in env.b.heartbeats[-1].consumers[0].subscriptions] == ["T", "U"]
    with pytest.raises(TopicRouteNotFoundError):
        await c.subscribe("NOPE")
    await c.unsubscribe("T")
    await c.unsubscribe("T")
    assert list(c.subscriptions) == ["U"]


async def test_lifecycle_and_arguments(env: Env) -> None:
    c = env.consumer()
    with pytest.raises(ClientError):
        await c.receive()
    await c.subscribe("U")  # before start: recorded only
    assert env.a.heartbeats == []
    async with c:
        for bad in ({"max_messages": 0}, {"max_messages": 2000}, {"invisible_duration_s": 0}):
            with pytest.raises(ClientError):
                await c.receive(**bad)
        await c.unsubscribe("T")
        await c.unsubscribe("U")
        with pytest.raises(ClientError):
            await c.receive()
    with pytest.raises(ClientError):
        await c.receive()
    with pytest.raises(TopicRouteNotFoundError):
        await env.consumer(subscriptions={"NOPE": "*"}).start()
    with pytest.raises(ClientError):
        env.consumer(consume_from_where=ConsumeFromWhere.TIMESTAMP)
    with pytest.raises(ClientError):
        env.consumer("")


async def test_blocking_consumer(env: Env) -> None:
    await env.a.put("U", b"x", b"y")

    def run() -> None:
        with SimpleConsumer(
            [env.namesrv.addr], "GB", SimpleConfig(await_duration_s=0.1), subscriptions={"U": "*"}
        ) as c:
            assert c.group == "GB" and c.client_id
            c.start()
            got: list[ReceivedMessage] = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += c.receive(4, 1.0)
            assert sorted(m.body for m in got) == [b"x", b"y"]
            m = c.change_invisible_duration(got[0], 1.0)
            c.ack(m)
            assert c.ack_many(got[1:]) == [None]
            c.subscribe("T")
            c.unsubscribe("T")

    await asyncio.to_thread(run)


# ------------------------------------------------------------------------------ real broker


@dataclass
class Real:
    namesrv: NamesrvController
    broker: BrokerController
    admin: AsyncAdminClient
    producer: AsyncProducer
    made: list[AsyncSimpleConsumer] = field(default_factory=list)

    def consumer(self, group: str, topic: str, **opts: Any) -> AsyncSimpleConsumer:
        subscriptions = opts.pop("subscriptions", {topic: "*"})
        opts.setdefault("await_duration_s", 0.3)
        opts.setdefault("request_timeout_s", 2.0)
        opts.setdefault("consume_from_where", ConsumeFromWhere.FIRST_OFFSET)
        c = AsyncSimpleConsumer(
            [self.namesrv.address], group, SimpleConfig(**opts), subscriptions=subscriptions
        )
        self.made.append(c)
        return c

    async def topic(self, name: str, queues: int = 2) -> None:
        await self.admin.create_topic(
            name, read_queue_nums=queues, write_queue_nums=queues, broker_addr=self.broker.address
        )
        await wait_route(self.admin, name, queues)

    async def send(self, topic: str, n: int, prefix: str = "m") -> list[bytes]:
        """``n`` messages spread over every queue of ``topic``."""
        bodies = [f"{prefix}-{i}".encode() for i in range(n)]
        queues = await self.admin.queues(topic)
        for i, mq in enumerate(queues):
            part = bodies[i :: len(queues)]
            if part:
                await self.producer.send_batch([Message(topic, b) for b in part], queue=mq)
        return bodies


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[Real]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    broker = BrokerController(broker_config(tmp_path / "broker-a", "broker-a", ns.address))
    await broker.start()
    admin = AsyncAdminClient([ns.address], AdminConfig(timeout_s=2.0))
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=1))
    await producer.start()
    r = Real(ns, broker, admin, producer)
    try:
        yield r
    finally:
        for c in r.made:
            await c.close()
        await producer.close()
        await admin.close()
        await broker.stop()
        await ns.stop()


async def test_real_receive_and_ack(real: Real) -> None:
    await real.topic("SC_A")
    sent = await real.send("SC_A", 20)
    c = await real.consumer("G_A", "SC_A").start()
    got = await receive_all(c, 20, max_messages=8, invisible_duration_s=5.0)
    assert sorted(m.body for m in got) == sorted(sent)
    assert {m.queue.queue_id for m in got} == {0, 1}
    assert all(m.delivery_attempt == 1 and m.topic == "SC_A" for m in got)
    assert all(m.broker_addr == real.broker.address for m in got)
    await c.ack(got[0])
    assert await c.ack_many(got[1:]) == [None] * 19
    with pytest.raises(ExpiredReceiptHandleError):
        await c.ack(got[0])
    assert await c.receive(invisible_duration_s=1.0) == []


async def test_real_unacked_message_comes_back(real: Real) -> None:
    await real.topic("SC_B")
    # Back at the end of the invisible time: no Pop backoff beyond it (the default adds 10 s).
    await real.admin.update_group_config(
        SubscriptionGroupConfig(group_name="G_B", pop_retry_delays_ms=[])
    )
    await real.send("SC_B", 1)
    c = await real.consumer("G_B", "SC_B", await_duration_s=0.5).start()
    (first,) = await receive_all(c, 1, invisible_duration_s=0.5)
    assert first.delivery_attempt == 1
    again = await receive_all(c, 1, invisible_duration_s=5.0)  # not acked: back after 0.5 s
    assert [m.body for m in again] == [first.body]
    m = again[0]
    assert m.delivery_attempt == 2
    assert m.message.topic == pop_retry_topic("G_B", "SC_B") == m.queue.topic
    assert m.topic == "SC_B"  # a retried copy reports where it was sent
    with pytest.raises(ExpiredReceiptHandleError):
        await c.ack(first)  # the first delivery's handle is spent
    await c.ack(m)


async def test_real_change_invisible_duration(real: Real) -> None:
    await real.topic("SC_C")
    await real.send("SC_C", 1)
    c = await real.consumer("G_C", "SC_C").start()
    (m,) = await receive_all(c, 1, invisible_duration_s=1.0)
    m2 = await c.change_invisible_duration(m, 3.0)
    assert m2.receipt_handle != m.receipt_handle
    assert m2.invisible_until_ms >= m.invisible_until_ms + 1000
    with pytest.raises(ExpiredReceiptHandleError) as info:
        await c.ack(m)
    assert info.value.code == ResponseCode.RECEIPT_HANDLE_EXPIRED
    await asyncio.sleep(1.2)  # past the first deadline, inside the new one
    assert await c.receive(invisible_duration_s=1.0) == []
    await c.ack(m2)
    bogus = dataclasses.replace(m2, receipt_handle="not-a-handle")
    with pytest.raises(ReceiptHandleInvalidError):
        await c.ack(bogus)


async def test_real_ten_consumers_share_a_two_queue_topic(real: Real) -> None:
    await real.topic("SC_D", queues=2)
    sent = await real.send("SC_D", 300)
    consumers = [
        await real.consumer("G_D", "SC_D", await_duration_s=0.2).start() for _ in range(10)
    ]
    seen: list[list[bytes]] = [[] for _ in consumers]
    done = asyncio.Event()

    async def run(i: int, c: AsyncSimpleConsumer) -> None:
        while not done.is_set():
            msgs = await c.receive(max_messages=8, invisible_duration_s=10.0)
            if msgs:
                assert await c.ack_many(msgs) == [None] * len(msgs)
                seen[i] += [m.body for m in msgs]
            if sum(map(len, seen)) >= len(sent):
                done.set()

    async with asyncio.timeout(20):
        await asyncio.gather(*(run(i, c) for i, c in enumerate(consumers)))
    everything = [b for s in seen for b in s]
    assert sorted(everything) == sorted(sent)  # all of them, none twice
    assert sum(1 for s in seen if s) >= 2  # shared, not one consumer taking all


async def test_real_invalid_sql_refused_at_start(
    real: Real, monkeypatch: pytest.MonkeyPatch
) -> None:
    await real.topic("SC_E")
    with pytest.raises(FilterExpressionError):
        real.consumer("G_E", "SC_E", subscriptions={"SC_E": ("SQL92", "a >")})
    # Without the client's own check, the broker refuses it at the first heartbeat.
    monkeypatch.setattr(subscription, "compile_filter", _no_check)
    c = real.consumer("G_E", "SC_E", subscriptions={"SC_E": ("SQL92", "a >")})
    with pytest.raises(InvalidSubscriptionError, match="a >"):
        await c.start()
    ok = await real.consumer("G_E", "SC_E", subscriptions={"SC_E": ("SQL92", "a > 1")}).start()
    with pytest.raises(InvalidSubscriptionError):
        await ok.subscribe("SC_E", "a >", "SQL92")
    assert ok.subscriptions["SC_E"].expression == "a > 1"


def _no_check(expression_type: str, expression: str) -> MessageFilter:
    return MessageFilter(expression_type.upper(), expression, None, expression_type != "TAG")


async def test_blocking_start_failure_closes(env: Env) -> None:
    def run() -> None:
        c = SimpleConsumer([env.namesrv.addr], "GB", subscriptions={"NOPE": "*"})
        with pytest.raises(TopicRouteNotFoundError):
            c.start()
        with pytest.raises(ClientError):
            c.receive()
        c.close()

    await asyncio.to_thread(run)


_FIELD = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3)
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=300),
    handles=_FIELD,
    pop_time=_FIELD,
    invisible=_FIELD,
    real_record=st.booleans(),
)
def test_malformed_pop_answers_raise_protocol_error(
    body: bytes, handles: Any, pop_time: Any, invisible: Any, real_record: bool
) -> None:
    """Whatever a broker answers SUCCESS with: messages, or ProtocolError, nothing else."""
    if real_record:
        body = _RECORD + body[:8]
    fields = {"handles": handles, "pop_time_ms": pop_time, "invisible_time_ms": invisible}
    resp = Frame(ResponseCode.SUCCESS, fields=fields, body=body)
    try:
        out = simple_consumer._received(resp, simple_consumer._Target("T", "b", "h:1"), 1000)
    except ProtocolError:
        return
    assert len(out) == len(handles)


def _one_record() -> bytes:
    from orbitmq.common.record import BatchHeader, encode_batch, pack_host

    head = BatchHeader(
        b"T", 0, 0, 0, 0, 0, 1, pack_host(("127.0.0.1", 1)), 2, pack_host(("127.0.0.1", 2)), 0, 0
    )
    return bytes(encode_batch(head, [b"x"], [b""]))


_RECORD = _one_record()
