"""Two NameServers and two brokers as real processes: every send mode, NameServer and broker
failures (SIGKILL), a graceful broker stop and a broker restart on its old store.

Every acknowledged message is checked where its SendResult says it is: a pull at
(queue, queue_offset) gives the same message id and body at the reported CommitLog offset, and
(where a NameServer is still up) a lookup by id finds it too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    FaultStrategy,
    Message,
    MessageQueue,
    Producer,
    PullStatus,
    SendResult,
    SendStatus,
    hash_selector,
)
from orbitmq.client.fault import LATENCY_MAX_MS
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicRouteData, decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.harness import ProcessCluster, ServerProcess

pytestmark = pytest.mark.integration

QUEUES = 4  # per broker
BROKERS = ("broker-a", "broker-b")
DEFAULT_QUEUES = BrokerConfig().default_queue_nums  # of a topic a broker auto-creates


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledged message: where the producer was told it went."""

    mq: MessageQueue
    queue_offset: int
    offset: int
    msg_id: str
    body: bytes


def acks_of(result: SendResult, bodies: Sequence[bytes]) -> list[Ack]:
    """One Ack per message of a send (a batch's messages follow its first offset)."""
    assert result.status is SendStatus.SEND_OK, result
    ids = result.msg_ids or (result.msg_id,)
    assert len(ids) == len(bodies), (result, len(bodies))
    return [  # a batch's result has the CommitLog offset of its first message only
        Ack(result.message_queue, result.queue_offset + i, result.offset if i == 0 else -1, m, b)
        for i, (m, b) in enumerate(zip(ids, bodies, strict=True))
    ]


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def route_brokers(client: RemotingClient, namesrv: str, topic: str) -> dict[str, int]:
    """What one NameServer routes ``topic`` to: broker name -> write queues (of live masters)."""
    resp = await client.invoke(
        namesrv, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})
    )
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return {}
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    route = decode_body(bytes(resp.body), TopicRouteData)
    masters = {bd.broker_name for bd in route.broker_datas if bd.master_addr()}
    return {
        q.broker_name: q.write_queue_nums for q in route.queue_datas if q.broker_name in masters
    }


async def wait_route(
    client: RemotingClient, namesrvs: Sequence[str], topic: str, expect: dict[str, int]
) -> None:
    """Wait until every NameServer routes ``topic`` to exactly ``expect``."""
    for ns in namesrvs:
        got: dict[str, int] = {}

        async def check(ns: str = ns) -> bool:
            nonlocal got
            got = await route_brokers(client, ns, topic)
            return got == expect

        try:
            await eventually(check, f"route of {topic} at {ns} to be {expect}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {got}") from None


def start_cluster(cluster: ProcessCluster) -> tuple[list[ServerProcess], dict[str, ServerProcess]]:
    """Two NameServers, then two brokers registered with both, each group started at once."""
    namesrvs = cluster.start_all([cluster.namesrv(start=False) for _ in range(2)])
    addrs = [ns.address for ns in namesrvs]
    brokers = cluster.start_all([cluster.broker(n, addrs, start=False) for n in BROKERS])
    return namesrvs, dict(zip(BROKERS, brokers, strict=True))


async def create_topic(
    admin: AsyncAdminClient, client: RemotingClient, brokers: dict[str, ServerProcess], topic: str
) -> None:
    """The topic on every broker (asked directly), then routed by every NameServer."""
    for proc in brokers.values():
        await admin.create_topic(
            topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES, broker_addr=proc.address
        )
    namesrvs = list(admin.routes.namesrv_addrs)
    await wait_route(client, namesrvs, topic, dict.fromkeys(brokers, QUEUES))


async def pull_range(
    admin: AsyncAdminClient, mq: MessageQueue, first: int, end: int, timeout: float = 10.0
) -> dict[int, StoredMessage]:
    """Messages of ``mq`` at offsets [first, end), waiting for the broker to dispatch them."""
    found: dict[int, StoredMessage] = {}
    offset = first
    deadline = time.monotonic() + timeout
    while offset < end:
        res = await admin.pull(mq, offset, max_nums=min(256, end - offset))
        if res.status is PullStatus.FOUND:
            for m in res.messages:
                found[m.queue_offset] = m
            offset = res.next_begin_offset
            continue
        assert res.status is PullStatus.NO_NEW_MSG, (mq, offset, res.status)
        if time.monotonic() > deadline:
            raise AssertionError(f"{mq}: nothing at offset {offset} (max {res.max_offset})")
        await asyncio.sleep(0.05)
    return found


async def verify_acks(admin: AsyncAdminClient, acks: Sequence[Ack], *, by_id: bool = True) -> None:
    """Every ack is readable at its queue and offset, same id and body; and by id."""
    by_queue: dict[MessageQueue, list[Ack]] = {}
    for ack in acks:
        by_queue.setdefault(ack.mq, []).append(ack)
    for mq, queue_acks in sorted(by_queue.items()):
        lo = min(a.queue_offset for a in queue_acks)
        hi = max(a.queue_offset for a in queue_acks) + 1
        stored = await pull_range(admin, mq, lo, hi)
        for ack in queue_acks:
            m = stored.get(ack.queue_offset)
            assert m is not None, f"{ack} not readable"
            assert (m.msg_id, m.body, m.queue_id) == (ack.msg_id, ack.body, mq.queue_id), ack
            if ack.offset >= 0:
                assert m.physical_offset == ack.offset, ack
    if by_id:
        for ack in acks:
            m = await admin.get_message_by_id(ack.mq.topic, ack.msg_id)
            assert m is not None, f"{ack} not found by id"
            assert (m.queue_id, m.queue_offset, m.body) == (
                ack.mq.queue_id,
                ack.queue_offset,
                ack.body,
            ), ack


async def read_topic(admin: AsyncAdminClient, topic: str) -> list[StoredMessage]:
    """Every message of every queue of the topic, from offset 0."""
    out: list[StoredMessage] = []
    for mq in await admin.queues(topic):
        end = await admin.max_offset(mq)
        out.extend((await pull_range(admin, mq, 0, end)).values())
    return out


async def verify_by_offset(
    admin: AsyncAdminClient, brokers: dict[str, ServerProcess], acks: Sequence[Ack]
) -> None:
    """Check acks without any NameServer: VIEW_MESSAGE_BY_ID by CommitLog offset, per broker."""
    for ack in acks:
        assert ack.offset >= 0
        m = await admin.get_message_by_offset(brokers[ack.mq.broker_name].address, ack.offset)
        assert m is not None, f"{ack} not readable by offset"
        got = (m.msg_id, m.body, m.queue_id, m.queue_offset)
        assert got == (ack.msg_id, ack.body, ack.mq.queue_id, ack.queue_offset), ack


# ---------------------------------------------------------------------- every send mode


def blocking_sends(namesrvs: list[str], topic: str) -> tuple[list[Ack], list[bytes]]:
    """The blocking Producer in each mode; returns the acks and the oneway bodies."""
    acks: list[Ack] = []
    callbacks: list[tuple[SendResult | None, BaseException | None]] = []
    with Producer(namesrvs, ProducerConfig(linger_ms=2, latency_fault_tolerance=False)) as p:
        for i in range(10):
            body = f"blocking-sync-{i}".encode()
            acks += acks_of(p.send(Message(topic, body)), [body])
        futures: list[tuple[concurrent.futures.Future[SendResult], bytes]] = []
        for i in range(40):
            body = f"blocking-async-{i}".encode()
            fut = p.send_async(Message(topic, body), lambda r, e: callbacks.append((r, e)))
            futures.append((fut, body))
        for fut, body in futures:
            acks += acks_of(fut.result(timeout=10), [body])
        bodies = [f"blocking-batch-{i}".encode() for i in range(8)]
        acks += acks_of(p.send_batch([Message(topic, b) for b in bodies]), bodies)
        oneway = [f"blocking-oneway-{i}".encode() for i in range(5)]
        for body in oneway:
            p.send_oneway(Message(topic, body))
        ordered_queue: MessageQueue | None = None
        for i in range(5):
            body = f"blocking-ordered-{i}".encode()
            res = p.send(Message(topic, body), selector=hash_selector, arg="blocking-key")
            assert ordered_queue in (None, res.message_queue)
            ordered_queue = res.message_queue
            acks += acks_of(res, [body])
    assert len(callbacks) == 40
    assert all(r is not None and e is None for r, e in callbacks), callbacks
    return acks, oneway


async def test_every_send_mode_lands_where_reported(cluster: ProcessCluster) -> None:
    namesrvs, brokers = start_cluster(cluster)
    ns_addrs = [ns.address for ns in namesrvs]
    topic = "EveryMode"
    client = RemotingClient()
    admin = AsyncAdminClient(ns_addrs)
    # Plain round robin: a slow first answer on a loaded machine must not steer every send away
    # from one broker (the latency table would), the test checks both brokers get some.
    producer = AsyncProducer(ns_addrs, ProducerConfig(linger_ms=2, latency_fault_tolerance=False))
    try:
        await create_topic(admin, client, brokers, topic)
        await producer.start()
        acks: list[Ack] = []

        # sync send, one of them large enough to be compressed on the way
        for i in range(20):
            body = f"sync-{i}".encode() * (600 if i == 7 else 1)
            acks += acks_of(await producer.send(Message(topic, body, keys=[f"k{i}"])), [body])
        assert {a.mq.broker_name for a in acks} == set(BROKERS), "round robin skipped a broker"

        # send_async: futures, half of them with callbacks too
        called: dict[int, tuple[SendResult | None, BaseException | None]] = {}
        pending: list[tuple[asyncio.Future[SendResult], bytes]] = []
        for i in range(200):
            body = f"async-{i}".encode()

            def cb(r: SendResult | None, e: BaseException | None, i: int = i) -> None:
                assert i not in called, "callback ran twice"
                called[i] = (r, e)

            fut = producer.send_async(Message(topic, body), callback=cb if i % 2 else None)
            pending.append((fut, body))
        results = await asyncio.gather(*(f for f, _ in pending))
        for (_, body), res in zip(pending, results, strict=True):
            acks += acks_of(res, [body])
        await asyncio.sleep(0)  # callbacks run after the futures' results are set
        assert sorted(called) == list(range(1, 200, 2))
        for i, (r, e) in called.items():
            assert e is None and r is results[i], (i, r, e)
        assert len({r.msg_id for r in results}) == 200

        # send_batch
        for b in range(5):
            bodies = [f"batch-{b}-{i}".encode() for i in range(10)]
            res = await producer.send_batch([Message(topic, x) for x in bodies])
            assert len(res.msg_ids) == 10 and res.msg_id == ",".join(res.msg_ids)
            acks += acks_of(res, bodies)

        # oneway: no result; found by the full scan below
        oneway = [f"oneway-{i}".encode() for i in range(20)]
        for body in oneway:
            await producer.send_oneway(Message(topic, body))

        # ordered: same key, same queue, offsets in send order (sync and async sends)
        write_queues = (await producer.routes.get(topic)).write_queues
        assert len(write_queues) == QUEUES * len(BROKERS)
        by_key: dict[str, list[SendResult]] = {}
        for i in range(60):
            key = f"order-{i % 6}"
            body = f"ordered-{i}".encode()
            if i % 2:
                res = await producer.send(Message(topic, body), selector=hash_selector, arg=key)
            else:
                res = await producer.send_async(
                    Message(topic, body, keys=[key]), selector=hash_selector
                )
            by_key.setdefault(key, []).append(res)
            acks += acks_of(res, [body])
        for key, rs in by_key.items():
            expected = hash_selector(write_queues, Message(topic, b"x"), key)
            assert {r.message_queue for r in rs} == {expected}, key
            offsets = [r.queue_offset for r in rs]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), key

        # A topic no NameServer knows: sent to every broker (queue -1, auto-created there); the
        # results name the queue each broker picked.
        auto = "AutoCreated"
        auto_acks: list[Ack] = []
        for i in range(10):
            body = f"auto-sync-{i}".encode()
            auto_acks += acks_of(await producer.send(Message(auto, body)), [body])
        auto_bodies = [f"auto-async-{i}".encode() for i in range(30)]
        auto_results = await asyncio.gather(
            *(producer.send_async(Message(auto, b)) for b in auto_bodies)
        )
        for body, res in zip(auto_bodies, auto_results, strict=True):
            auto_acks += acks_of(res, [body])
        assert {a.mq.broker_name for a in auto_acks} == set(BROKERS)
        assert all(a.mq.queue_id >= 0 for a in auto_acks)
        await wait_route(client, ns_addrs, auto, dict.fromkeys(BROKERS, DEFAULT_QUEUES))
        await verify_acks(admin, auto_acks)

        blocking_acks, blocking_oneway = await asyncio.to_thread(blocking_sends, ns_addrs, topic)
        acks += blocking_acks
        oneway += blocking_oneway
        await producer.close()

        await verify_acks(admin, acks)
        # Nothing twice, nothing missing, nothing else: oneway sends arrive too.
        expected_bodies = sorted([a.body for a in acks] + oneway)

        async def all_there() -> bool:
            return len(await read_topic(admin, topic)) >= len(expected_bodies)

        await eventually(all_there, "the oneway messages")
        stored = await read_topic(admin, topic)
        assert sorted(m.body for m in stored) == expected_bodies
        assert len({m.msg_id for m in stored}) == len(stored)
        assert {m.topic for m in stored} == {topic}
    finally:
        await producer.close()
        await admin.close()
        await client.close()


# ---------------------------------------------------------------------- NameServer failover


async def send_some(producer: AsyncProducer, topic: str, tag: str, n: int) -> list[Ack]:
    acks: list[Ack] = []
    for i in range(n):
        body = f"{tag}-{i}".encode()
        acks += acks_of(await producer.send(Message(topic, body)), [body])
    return acks


async def test_namesrv_failover_and_cached_routes(cluster: ProcessCluster) -> None:
    namesrvs, brokers = start_cluster(cluster)
    ns_addrs = [ns.address for ns in namesrvs]
    topic = "NsFailover"
    client = RemotingClient()
    admin = AsyncAdminClient(ns_addrs)
    # A short refresh interval, so the producers really ask the (dead) NameServers meanwhile.
    # Plain round robin (no latency table), so every few sends reach both brokers.
    p1 = AsyncProducer(
        ns_addrs, ProducerConfig(route_refresh_interval_s=0.2, latency_fault_tolerance=False)
    )
    p2 = AsyncProducer(
        ns_addrs, ProducerConfig(route_refresh_interval_s=0.2, latency_fault_tolerance=False)
    )
    p3 = AsyncProducer(ns_addrs, ProducerConfig(send_timeout_s=2))
    try:
        await create_topic(admin, client, brokers, topic)
        await p1.start()
        acks = await send_some(p1, topic, "before", 20)

        await asyncio.to_thread(namesrvs[0].kill)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # several refreshes against one dead NameServer
            acks += await send_some(p1, topic, f"one-ns-down-{len(acks)}", 5)
        info = await p1.routes.refresh(topic)
        assert set(info.broker_addrs) == set(BROKERS)
        assert len(info.write_queues) == QUEUES * len(BROKERS)

        # A new producer given both addresses finds the route through the live one.
        await p2.start()
        acks += await send_some(p2, topic, "new-producer", 20)
        assert {a.mq.broker_name for a in acks[-20:]} == set(BROKERS)
        # So does the admin client, and the route is still complete.
        fresh = AsyncAdminClient(ns_addrs)
        try:
            assert len(await fresh.queues(topic)) == QUEUES * len(BROKERS)
        finally:
            await fresh.close()

        await asyncio.to_thread(namesrvs[1].kill)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # refreshes fail; the cached routes carry on
            acks += await send_some(p1, topic, f"no-ns-p1-{len(acks)}", 5)
            acks += await send_some(p2, topic, f"no-ns-p2-{len(acks)}", 5)
        assert {a.mq.broker_name for a in acks[-20:]} == set(BROKERS)
        cached = p1.routes.cached(topic)
        assert cached is not None and set(cached.broker_addrs) == set(BROKERS)
        # A producer that never had the route cannot find one now.
        await p3.start()
        with pytest.raises(MQError):
            await p3.send(Message(topic, b"nowhere"))

        # A NameServer restarted on its address learns the brokers again from their heartbeats
        # (every 1 s here), and the producer without a route finds one.
        await asyncio.to_thread(namesrvs[0].restart)
        await wait_route(client, [namesrvs[0].address], topic, dict.fromkeys(BROKERS, QUEUES))
        acks += await send_some(p3, topic, "after-ns-restart", 10)

        await verify_by_offset(admin, brokers, acks)
        assert len({a.msg_id for a in acks}) == len(acks)
    finally:
        for p in (p1, p2, p3):
            await p.close()
        await admin.close()
        await client.close()


# ---------------------------------------------------------------------- broker failures


class SendLoop:
    """Tasks sending one message at a time each, recording every outcome."""

    def __init__(self, producer: AsyncProducer, topic: str, tasks: int = 4) -> None:
        self.producer = producer
        self.topic = topic
        self.tasks = tasks
        self.acks: list[tuple[float, Ack]] = []
        self.failures: list[tuple[float, BaseException]] = []
        self._stop = asyncio.Event()
        self._running: list[asyncio.Task[None]] = []

    def start(self, tag: str) -> None:
        self._stop.clear()
        self._running = [asyncio.create_task(self._run(f"{tag}-{t}")) for t in range(self.tasks)]

    async def stop(self) -> None:
        """Stop the tasks (each ends its send first); raises a task's unexpected error."""
        self._stop.set()
        running, self._running = self._running, []
        await asyncio.gather(*running)

    async def _run(self, name: str) -> None:
        i = 0
        while not self._stop.is_set():
            body = f"{name}-{i}".encode()
            i += 1
            started = time.monotonic()
            try:
                res = await self.producer.send(Message(self.topic, body))
            except MQError as exc:
                self.failures.append((started, exc))
                await asyncio.sleep(0.01)
                continue
            self.acks += [(started, a) for a in acks_of(res, [body])]

    def acked(self) -> list[Ack]:
        return [a for _, a in self.acks]

    def count_since(self, at: float) -> tuple[int, int, set[str]]:
        """Acks and failures of sends started at or after ``at``, and the brokers acked."""
        acks = [a for t, a in self.acks if t >= at]
        return (
            len(acks),
            sum(t >= at for t, _ in self.failures),
            {a.mq.broker_name for a in acks},
        )


async def acked_by(loop: SendLoop, names: set[str], since: float, n: int = 50) -> None:
    """Wait until sends started at ``since`` or later were acked ``n`` times, by ``names``."""

    async def check() -> bool:
        got, _failed, seen = loop.count_since(since)
        return seen >= names and got >= n

    await eventually(check, f"{n} acks from {sorted(names)}")


async def test_broker_sigkill_graceful_stop_and_restart(cluster: ProcessCluster) -> None:
    namesrvs, brokers = start_cluster(cluster)
    ns_addrs = [ns.address for ns in namesrvs]
    topic = "BrokerFailover"
    everyone = dict.fromkeys(BROKERS, QUEUES)
    client = RemotingClient()
    admin = AsyncAdminClient(ns_addrs)
    producers = [
        AsyncProducer(ns_addrs, ProducerConfig(route_refresh_interval_s=0.5, linger_ms=1))
        for _ in range(2)
    ]
    for p in producers:
        # Failures isolate a broker (30 s), as by default; slow answers do not, so a loaded
        # machine does not steer all sends to one broker before the test kills the other.
        p.fault = FaultStrategy(not_available_ms=(0,) * len(LATENCY_MAX_MS))
    loops = [SendLoop(p, topic) for p in producers]
    try:
        await create_topic(admin, client, brokers, topic)

        # SIGKILL broker-a while a producer sends in a loop: the sends move to broker-b.
        loop = loops[0]
        await loop.producer.start()
        loop.start("kill")
        await acked_by(loop, set(BROKERS), 0)
        killed_at = time.monotonic()
        await asyncio.to_thread(brokers["broker-a"].kill)
        dead_at = time.monotonic()  # a send started before this may still reach broker-a alive
        await wait_route(client, ns_addrs, topic, {"broker-b": QUEUES})
        dead_a = f"broker {brokers['broker-a'].address} dropped: its connection closed"
        assert all(dead_a in ns.log() for ns in namesrvs)  # at once, not after 120 s silence
        await acked_by(loop, {"broker-b"}, time.monotonic())
        await asyncio.sleep(1.2)  # the producer refreshes its route (every 0.5 s) meanwhile
        n_after, failed_after, _seen = loop.count_since(killed_at)
        assert loop.count_since(dead_at)[2] == {"broker-b"}  # nothing acked by a dead broker
        # Sends in flight to broker-a are retried on broker-b; allow one lost send per task.
        assert failed_after <= loop.tasks, loop.failures
        print(f"after SIGKILL: {n_after} acked, {failed_after} failed")
        cached = loop.producer.routes.cached(topic)
        assert cached is not None
        assert dict(cached.broker_addrs) == {"broker-b": brokers["broker-b"].address}
        assert {q.broker_name for q in cached.write_queues} == {"broker-b"}

        # broker-a comes back on its old store and port and registers again; what it had
        # acknowledged before the kill is all there.
        await asyncio.to_thread(brokers["broker-a"].restart)
        await wait_route(client, ns_addrs, topic, everyone)

        async def routed_to_both() -> bool:
            info = loop.producer.routes.cached(topic)
            return info is not None and set(info.broker_addrs) == set(BROKERS)

        await eventually(routed_to_both, "the producer to route to broker-a again")
        await loop.stop()
        await verify_acks(admin, loop.acked(), by_id=False)

        # A graceful stop of broker-b unregisters it at once and exits cleanly; sends move on.
        # (A new producer: the first one avoids broker-a for 30 s after its failures.)
        loop = loops[1]
        await loop.producer.start()
        loop.start("stop")
        await acked_by(loop, set(BROKERS), 0)
        stopped_at = time.monotonic()
        assert await asyncio.to_thread(brokers["broker-b"].stop) == 0
        await wait_route(client, ns_addrs, topic, {"broker-a": QUEUES})
        assert time.monotonic() - stopped_at < 5
        gone_b = f"broker {brokers['broker-b'].address} dropped"
        assert not any(gone_b in ns.log() for ns in namesrvs)  # it unregistered first
        await acked_by(loop, {"broker-a"}, time.monotonic())
        n_after, failed_after, _seen = loop.count_since(stopped_at)
        assert failed_after <= loop.tasks, loop.failures
        print(f"after graceful stop: {n_after} acked, {failed_after} failed")

        await asyncio.to_thread(brokers["broker-b"].restart)
        await wait_route(client, ns_addrs, topic, everyone)
        await loop.stop()
        acks = loops[0].acked() + loops[1].acked()
        print(f"acked {len(acks)} in all")
        await verify_acks(admin, acks, by_id=False)
        await verify_acks(admin, acks[:: max(1, len(acks) // 50)])  # the indexes survived
    finally:
        for lp in loops:
            await lp.stop()
        for p in producers:
            await p.close()
        await admin.close()
        await client.close()
