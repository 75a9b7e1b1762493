"""PushConsumer against a real NameServer and two real brokers on loopback: concurrent, orderly
and broadcasting listeners, RECONSUME_LATER through the retry topic, handovers between members,
offset resets, and the blocking facade."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    AsyncPushConsumer,
    ConsumedMessage,
    ConsumeFromWhere,
    ConsumeResult,
    Message,
    MessageModel,
    MessageQueue,
    Producer,
    PushConsumer,
    hash_selector,
)
from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.allocate import resolve_strategy
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.consumer.member import State
from orbitmq.client.offset_store import BrokerRequester, RemoteOffsetStore
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.rebalance import RebalanceService
from orbitmq.client.route import TopicPublishInfo, TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, FilterExpressionError, RemoteError
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    ConsumerIdList,
    LockBatchBody,
    OffsetsBody,
    SubscriptionData,
    retry_topic,
)
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from orbitmq.protocol.header import Header
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster, wait_route
from tests.client.test_process_queue import msg as stored

pytestmark = pytest.mark.timeout(60)

FAST: dict[str, Any] = {
    "consume_from_where": ConsumeFromWhere.FIRST_OFFSET,
    "heartbeat_interval_s": 1.0,
    "rebalance_interval_s": 1.0,
    "auto_commit_interval_s": 0.5,
    "suspend_timeout_ms": 2000,
    "handover_delay_s": 0.3,
    "removal_timeout_s": 3.0,
    "request_timeout_s": 2.0,
}


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def create_topic(addr: str, topic: str, queues: int = 2) -> list[MessageQueue]:
    async with AsyncAdminClient([addr]) as admin:
        await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        return await wait_route(admin, topic, 2 * queues)


class Collector:
    """Thread-safe record of what a listener saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[ConsumedMessage] = []

    def add(self, msgs: list[ConsumedMessage]) -> None:
        with self.lock:
            self.seen += msgs

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.seen]

    async def wait(self, pred: Callable[[], bool], timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; saw {len(self.seen)} messages")
            await asyncio.sleep(0.02)

    async def wait_count(self, n: int, timeout_s: float = 15.0) -> None:
        await self.wait(lambda: len(set(self.bodies())) >= n, timeout_s)


async def send(addr: str, topic: str, bodies: list[bytes], **kw: Any) -> None:
    async with AsyncProducer([addr]) as p:
        for b in bodies:
            await p.send(Message(topic, b, **kw))


async def test_concurrent_listener_filters_by_tag_and_commits(real: RealCluster) -> None:
    await create_topic(real.addr, "PC")
    tags = ["A", "B", "C"]
    async with AsyncProducer([real.addr]) as p:
        for i in range(90):
            await p.send(Message("PC", f"m{i}".encode(), tags=tags[i % 3]))
    wanted = {f"m{i}".encode() for i in range(90) if i % 3 != 2}
    got = Collector()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        assert threading.current_thread().name.startswith("orbitmq-consume")
        got.add(msgs)
        return ConsumeResult.SUCCESS

    c = AsyncPushConsumer([real.addr], "G-PC", PushConfig(consume_batch_size=4, **FAST))
    c.subscribe("PC", "A || B")
    c.register_listener(listener)
    await c.start()
    try:
        assert len(c.assignment()) == 4
        await got.wait_count(len(wanted))
        await asyncio.sleep(0.2)
        assert set(got.bodies()) == wanted
        assert len(got.bodies()) == len(wanted)  # nothing twice
        assert {m.tags for m in got.seen} == {"A", "B"}
    finally:
        await c.close()

    # Offsets were committed at close: a new member of the group starts after them.
    again = Collector()
    c2 = AsyncPushConsumer([real.addr], "G-PC", PushConfig(**FAST))
    c2.subscribe("PC", "A || B")
    c2.register_listener(lambda msgs: (again.add(msgs), ConsumeResult.SUCCESS)[1])
    await c2.start()
    try:
        await send(real.addr, "PC", [b"late"], tags="A")
        await again.wait_count(1)
        await asyncio.sleep(0.3)
        assert again.bodies() == [b"late"]
    finally:
        await c2.close()


async def test_async_listener_calls_run_concurrently_up_to_consume_threads(
    real: RealCluster,
) -> None:
    await create_topic(real.addr, "AC")
    await send(real.addr, "AC", [f"a{i}".encode() for i in range(40)])
    got = Collector()
    running = peak = 0

    async def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)  # awaits: other batches run meanwhile
        running -= 1
        got.add(msgs)
        return ConsumeResult.SUCCESS

    c = AsyncPushConsumer([real.addr], "G-AC", PushConfig(consume_threads=3, **FAST))
    c.subscribe("AC")
    c.register_listener(listener)
    await c.start()
    try:
        await got.wait_count(40)
        assert len(got.bodies()) == 40  # nothing twice
        assert 2 <= peak <= 3
    finally:
        await c.close()


async def test_reconsume_later_goes_through_the_retry_topic(real: RealCluster) -> None:
    await create_topic(real.addr, "RL", queues=1)
    bodies = [f"r{i}".encode() for i in range(10)]
    await send(real.addr, "RL", bodies)
    got = Collector()

    async def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        got.add(msgs)
        if msgs[0].reconsume_times == 0 and msgs[0].body != b"r0":
            raise RuntimeError("not yet")  # an exception counts as RECONSUME_LATER
        return ConsumeResult.SUCCESS if msgs[0].reconsume_times else ConsumeResult.RECONSUME_LATER

    async with AsyncAdminClient([real.addr]) as admin:  # retried after 0.2 s, not the default 10 s
        await admin.update_group_config(
            SubscriptionGroupConfig(group_name="G-RL", retry_delays_ms=[200])
        )
    c = AsyncPushConsumer([real.addr], "G-RL", PushConfig(**FAST))
    c.subscribe("RL")
    c.register_listener(listener)
    await c.start()
    try:
        await got.wait(lambda: sum(m.reconsume_times == 1 for m in got.seen) >= 10)
        retried = [m for m in got.seen if m.reconsume_times == 1]
        assert sorted(m.body for m in retried) == sorted(bodies)
        for m in retried:
            assert m.topic == "RL"  # the original topic
            assert m.queue.topic == retry_topic("G-RL")
        assert c.sent_back == 10
        assert any(mq.topic == retry_topic("G-RL") for mq in c.assignment())
    finally:
        await c.close()


async def test_orderly_listener_keeps_queue_order(real: RealCluster) -> None:
    await create_topic(real.addr, "OR")
    keys = ["k0", "k1", "k2", "k3", "k4"]
    async with AsyncProducer([real.addr]) as p:
        for i in range(100):
            key = keys[i % len(keys)]
            await p.send(
                Message("OR", f"{key}:{i // len(keys)}".encode(), keys=[key]),
                selector=hash_selector,
            )
    got = Collector()
    failed_once: set[bytes] = set()
    running: Counter[MessageQueue] = Counter()
    overlap: list[MessageQueue] = []

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        mq = msgs[0].queue
        with got.lock:
            running[mq] += 1
            if running[mq] > 1:
                overlap.append(mq)
        try:
            time.sleep(0.001)
            if msgs[0].body.endswith(b":7") and msgs[0].body not in failed_once:
                failed_once.add(msgs[0].body)
                return ConsumeResult.RECONSUME_LATER  # retried in place, order kept
            got.add(msgs)
            return ConsumeResult.SUCCESS
        finally:
            with got.lock:
                running[mq] -= 1

    c = AsyncPushConsumer([real.addr], "G-OR", PushConfig(orderly_retry_interval_s=0.05, **FAST))
    c.subscribe("OR")
    c.register_orderly_listener(listener)
    await c.start()
    try:
        await got.wait_count(100)
        assert not overlap
        per_key: dict[str, list[int]] = {}
        for m in got.seen:
            key, seq = m.body.decode().split(":")
            per_key.setdefault(key, []).append(int(seq))
        for key, seqs in per_key.items():
            assert seqs == list(range(20)), key
        assert failed_once
        assert all(pq.locked for pq in c.rebalance.process_queues.values())
    finally:
        await c.close()


async def test_broadcasting_gives_every_member_everything(
    real: RealCluster, tmp_path: Path
) -> None:
    await create_topic(real.addr, "BC")
    got = [Collector(), Collector()]
    consumers = []
    for i in range(2):
        c = AsyncPushConsumer(
            [real.addr],
            "G-BC",
            PushConfig(
                message_model=MessageModel.BROADCASTING,
                instance_name=f"member{i}",
                offset_store_dir=tmp_path / "offsets",
                **FAST,
            ),
        )
        c.subscribe("BC")
        collector = got[i]
        c.register_listener(lambda msgs, col=collector: (col.add(msgs), ConsumeResult.SUCCESS)[1])
        consumers.append(await c.start())
    try:
        for c in consumers:
            assert len(c.assignment()) == 4  # every queue, no retry topic
        bodies = [f"b{i}".encode() for i in range(20)]
        await send(real.addr, "BC", bodies)
        for col in got:
            await col.wait_count(20)
            assert sorted(col.bodies()) == sorted(bodies)
    finally:
        for c in consumers:
            await c.close()
    for i in range(2):
        assert (tmp_path / "offsets" / f"member{i}" / "G-BC" / "offsets.json").exists()


async def test_members_hand_queues_over_without_loss_or_duplicates(real: RealCluster) -> None:
    await create_topic(real.addr, "HO", queues=4)
    got = Collector()
    owners: dict[bytes, list[str]] = {}

    def listener_for(name: str) -> Callable[[list[ConsumedMessage]], ConsumeResult]:
        def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
            time.sleep(0.002)
            with got.lock:
                for m in msgs:
                    owners.setdefault(m.body, []).append(name)
            got.add(msgs)
            return ConsumeResult.SUCCESS

        return listener

    def member(name: str) -> AsyncPushConsumer:
        c = AsyncPushConsumer([real.addr], "G-HO", PushConfig(consume_threads=4, **FAST))
        c.subscribe("HO")
        c.register_listener(listener_for(name))
        return c

    total = 400
    c1 = await member("c1").start()
    c2 = member("c2")
    async with AsyncProducer([real.addr]) as p:

        async def produce() -> None:
            for i in range(total):
                await p.send(Message("HO", f"h{i}".encode()))
                if i % 20 == 0:
                    await asyncio.sleep(0.02)

        producing = asyncio.create_task(produce())
        try:
            await got.wait_count(60)
            await c2.start()  # c1 hands half of its queues over
            for _ in range(300):
                if len(c1.assignment()) == 4 and len(c2.assignment()) == 4:
                    break
                await asyncio.sleep(0.02)
            assert len(c1.assignment()) == 4 and len(c2.assignment()) == 4
            await got.wait_count(250)
            await c1.close()  # everything goes to c2
            await producing
            await got.wait_count(total)
            assert len(c2.assignment()) == 8
        finally:
            producing.cancel()
            await c1.close()
            await c2.close()
    await asyncio.sleep(0.2)
    assert len(set(got.bodies())) == total
    dups = {b: o for b, o in owners.items() if len(o) > 1}
    assert not dups, f"{len(dups)} duplicates, e.g. {list(dups.items())[:5]}"
    assert {o[0] for o in owners.values()} == {"c1", "c2"}


async def test_offset_reset_restarts_the_queues(real: RealCluster) -> None:
    await create_topic(real.addr, "RS", queues=1)
    bodies = [f"s{i}".encode() for i in range(10)]
    await send(real.addr, "RS", bodies)
    got = Collector()
    c = AsyncPushConsumer([real.addr], "G-RS", PushConfig(**FAST))
    c.subscribe("RS")
    c.register_listener(lambda msgs: (got.add(msgs), ConsumeResult.SUCCESS)[1])
    await c.start()
    client = RemotingClient()
    try:
        await got.wait_count(10)
        await asyncio.sleep(0.6)  # committed
        for b in real.brokers:
            resp = await client.invoke(
                b.address,
                Frame(
                    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                    fields={"group": "G-RS", "topic": "RS", "position": "earliest"},
                ),
            )
            assert resp.code == 0, resp.remark
        await got.wait(lambda: len(got.bodies()) >= 20)
        assert Counter(got.bodies()) == Counter(bodies * 2)
    finally:
        await client.close()
        await c.close()


async def test_start_errors(real: RealCluster) -> None:
    c = AsyncPushConsumer([real.addr], "G-ERR", PushConfig(**FAST))
    with pytest.raises(ClientError, match="listener"):
        await c.start()
    c.register_listener(lambda msgs: ConsumeResult.SUCCESS)
    with pytest.raises(ClientError, match="subscribe"):
        await c.start()
    with pytest.raises(FilterExpressionError):
        c.subscribe("T", "a >", "SQL92")
    with pytest.raises(FilterExpressionError):
        c.subscribe("T", "||")
    with pytest.raises(ClientError):
        AsyncPushConsumer([real.addr], "G", PushConfig(consume_threads=0))
    await c.close()


@pytest.fixture
def real_on_thread(tmp_path: Path) -> Iterator[tuple[LoopThread, RealCluster]]:
    thread = LoopThread("servers")
    cluster = thread.run(start_cluster(tmp_path), timeout=30)
    try:
        yield thread, cluster
    finally:
        thread.run(stop_cluster(cluster), timeout=30)
        thread.stop()


def test_blocking_push_consumer(real_on_thread: tuple[LoopThread, RealCluster]) -> None:
    thread, real = real_on_thread
    thread.run(create_topic(real.addr, "BL"), timeout=10)
    got = Collector()
    with Producer([real.addr]) as p:
        for i in range(20):
            p.send(Message("BL", f"x{i}".encode()))
    with PushConsumer([real.addr], "G-BL", PushConfig(**FAST)) as c:
        c.subscribe("BL")
        c.register_listener(lambda msgs: (got.add(msgs), ConsumeResult.SUCCESS)[1])
        c.start()
        assert c.client_id and len(c.assignment()) == 4
        deadline = time.monotonic() + 15
        while len(set(got.bodies())) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(got.bodies()) == sorted(f"x{i}".encode() for i in range(20))
        c.shutdown()
    assert c.assignment() == []


# ---------------------------------------------------------------------- rebalance, with fakes


class FakeRoutes(TopicRouteCache):
    def __init__(self, queues: list[MessageQueue]) -> None:
        super().__init__("127.0.0.1:1", RemotingClient())
        self.info = TopicPublishInfo(
            "T", tuple(queues), tuple(queues), {"broker-a": "broker-a"}, 0.0
        )

    async def get(self, topic: str) -> TopicPublishInfo:
        return self.info


class FakeGroupBroker(BrokerRequester):
    """Members, offsets and locks of one broker; logs the requests in order."""

    def __init__(self, routes: FakeRoutes) -> None:
        super().__init__(routes, RemotingClient())
        self.members = ["me"]
        self.offsets: dict[int, int] = {}
        self.locked: set[int] = set()
        self.log: list[str] = []

    async def addr(self, broker_name: str, topic: str) -> str:
        return broker_name

    async def call(
        self,
        addr: str,
        header: Header,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
        timeout_s: float | None = None,
    ) -> Frame:
        code, fields = header.code, header.to_header()
        out_fields: dict[str, Any] = {}
        out_body = b""
        code_out: int = ResponseCode.SUCCESS
        if code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
            out_body = encode_body(ConsumerIdList(client_ids=self.members))
        elif code == RequestCode.QUERY_CONSUMER_OFFSET:
            if fields["queue_id"] in self.offsets:
                out_fields["offset"] = self.offsets[fields["queue_id"]]
            else:
                code_out = ResponseCode.QUERY_NOT_FOUND
        elif code == RequestCode.GET_MAX_OFFSET:
            out_fields["offset"] = 100
        elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
            if body:
                items = [
                    (o.queue_id, o.offset) for o in decode_body(bytes(body), OffsetsBody).offsets
                ]
            else:
                items = [(fields["queue_id"], fields["offset"])]
            for qid, off in items:
                self.offsets[qid] = off
            self.log.append("commit " + ",".join(f"{q}={o}" for q, o in items))
        elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            req = decode_body(bytes(body), LockBatchBody)
            ids = {r.queue_id for r in req.queues}
            if code == RequestCode.LOCK_BATCH_MQ:
                self.locked |= ids
                out_body = encode_body(req)
            else:
                self.locked -= ids
                self.log.append(f"unlock {sorted(ids)}")
        resp = Frame(code, fields=out_fields, body=out_body)
        resp.code = code_out
        if code_out not in ok:
            raise RemoteError(code_out, "fake")
        return resp


class Hooks:
    def __init__(self) -> None:
        self.added: list[ProcessQueue] = []
        self.removed: list[ProcessQueue] = []

    async def queue_added(self, pq: ProcessQueue) -> None:
        self.added.append(pq)

    async def queue_removed(self, pq: ProcessQueue) -> None:
        self.removed.append(pq)

    def queue_relocked(self, pq: ProcessQueue) -> None:
        pass


async def test_handover_waits_for_the_listener_then_commits_then_unlocks() -> None:
    queues = [MessageQueue("T", "broker-a", i) for i in range(4)]
    routes = FakeRoutes(queues)
    broker = FakeGroupBroker(routes)
    hooks = Hooks()
    rb = RebalanceService(
        group="G",
        client_id="me",
        routes=routes,
        requester=broker,
        offset_store=RemoteOffsetStore("G", broker),
        listener=hooks,
        strategy=resolve_strategy("AVG"),
        orderly=True,
        handover_delay_s=0.0,
    )
    rb.subscriptions["T"] = SubscriptionData(topic="T")
    await rb.rebalance()
    assert rb.assignment() == queues and broker.locked == {0, 1, 2, 3}
    assert all(pq.next_offset == 100 and pq.locked for pq in hooks.added)  # LAST_OFFSET

    pq3 = rb.process_queues[queues[3]]
    pq3.put([], 105)  # say messages 100..104 were filtered out: committable is 105
    assert pq3.try_begin()  # a listener call is running on queue 3
    broker.members = ["me", "zz-other"]
    round_task = asyncio.create_task(rb.rebalance())
    await asyncio.sleep(0.1)
    assert not round_task.done()
    # Queue 2 was idle: committed and unlocked at once; queue 3 waits for its listener.
    assert broker.log == ["commit 2=100", "unlock [2]"]
    assert 3 in broker.locked
    broker.log.clear()
    pq3.end()
    await asyncio.wait_for(round_task, 2.0)
    assert broker.log == ["commit 3=105", "unlock [3]"]
    assert rb.assignment() == queues[:2]
    assert broker.locked == {0, 1}
    assert broker.offsets == {2: 100, 3: 105}
    assert {pq.mq for pq in hooks.removed} == set(queues[2:])
    broker.log.clear()
    await rb.close()
    assert broker.locked == set() and rb.assignment() == []
    assert broker.log == ["commit 0=100,1=100", "unlock [0, 1]"]  # one request each


async def test_batch_submitted_as_the_last_async_worker_ends_is_still_consumed() -> None:
    """Regression: an async listener's worker used to leave its slot in a done callback, a loop
    turn after it found no batch waiting. A batch submitted in that gap saw the one slot
    (consume_threads=1) still taken, and nobody ever consumed it (``orbitmq consume`` hung)."""
    c = AsyncPushConsumer(["127.0.0.1:1"], "G", PushConfig(consume_threads=1))
    loop = asyncio.get_running_loop()
    mq = MessageQueue("T", "broker-a", 0)
    pq = ProcessQueue(mq, 0)
    first, second = pq.put([stored(0)], 1), pq.put([stored(1)], 2)
    seen: list[int] = []

    async def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        seen.extend(m.message.queue_offset for m in msgs)
        if len(seen) == 1:
            # Runs after this step of the worker (which then finds nothing waiting and ends)
            # and before the worker task's done callbacks: exactly the gap.
            loop.call_soon(c.concurrently.submit, pq, second, pq.generation)
        return ConsumeResult.SUCCESS  # returns without awaiting: same step as the worker's end

    c.register_listener(listener)
    c.concurrently.submit(pq, first, pq.generation)
    for _ in range(50):
        if seen == [0, 1] and c.concurrently.workers == 0:
            break
        await asyncio.sleep(0.01)
    assert seen == [0, 1]
    assert c.concurrently.workers == 0 and pq.committable() == 2


async def test_orderly_messages_pulled_as_its_task_ends_are_still_consumed() -> None:
    """Regression, the orderly twin of the one above: the queue's task was unregistered in a
    done callback, so messages pulled between its last step and that callback started no task."""
    c = AsyncPushConsumer(
        ["127.0.0.1:1"], "G", PushConfig(message_model=MessageModel.BROADCASTING, consume_threads=1)
    )
    seen: list[int] = []
    mq = MessageQueue("T", "broker-a", 0)
    pq = ProcessQueue(mq, 0)

    def pulled_more() -> None:
        c._on_pulled(pq, pq.put([stored(1)], 2))

    async def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        seen.extend(m.message.queue_offset for m in msgs)
        if len(seen) == 1:
            asyncio.get_running_loop().call_soon(pulled_more)  # lands in the gap
        return ConsumeResult.SUCCESS

    c.register_orderly_listener(listener)
    c.subscribe("T")
    c._make_clients()
    c.runner.start(1)
    c._state = State.RUNNING
    try:
        c._on_pulled(pq, pq.put([stored(0)], 1))
        for _ in range(50):
            if seen == [0, 1] and not c.orderly_service.tasks:
                break
            await asyncio.sleep(0.01)
        assert seen == [0, 1] and pq.committable() == 2
    finally:
        c._state = State.CLOSED
        await c.remoting.close()


@settings(max_examples=60, deadline=None)
@given(
    code=st.sampled_from(
        [
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
            RequestCode.SEND_MESSAGE,
        ]
    ),
    fields=st.dictionaries(st.sampled_from(["group", "topic", "x"]), st.integers() | st.text()),
    body=st.binary(max_size=64)
    | st.builds(
        lambda g: encode_body(OffsetsBody(group=g, offsets=[])), st.sampled_from(["G", "H"])
    ),
)
def test_broker_requests_with_bad_input_get_a_clear_answer(
    code: int, fields: dict[str, Any], body: bytes
) -> None:
    c = AsyncPushConsumer(["127.0.0.1:1"], "G")
    reply = asyncio.run(c._on_server_request(Frame(code, fields=fields, body=body), None))  # type: ignore[arg-type]
    if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
        assert reply is None  # oneway: nothing to answer
    elif code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
        assert isinstance(reply, Frame)
        assert reply.code in (ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL)
    else:
        assert isinstance(reply, Frame) and reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
