"""SIGKILL a real SYNC_FLUSH broker process while producers send, restart it, check the acks.

Producers run in this process (asyncio tasks on two AsyncProducers: sync sends, batch sends and
send_async bursts, to two topics) and keep sending through every kill and restart. Every
acknowledged SendResult is recorded (topic, queue, queue offset, message id, body digest). Each
cycle SIGKILLs the broker (by PID) at a random moment, restarts it on the same store folder and
port, and checks that every message acknowledged so far is readable at its queue and offset with
the same id and body. At the end every queue is read from its first offset: offsets are
contiguous, every message found is one that was sent (acknowledged or not: a send that got no
answer may or may not be there), nothing acknowledged is missing, and a sample of the
acknowledged messages is found by id (the index survived the crashes too). Every send is also
recorded in a checker history (orbitmq.testing.checker), and the final read-back through the
NameServer's route is checked by it: nothing acknowledged lost or misplaced, no message nobody
sent, duplicates (a retry after a kill cut the answer off) bounded by what was in flight.

The seed (kill moments, message sizes) is printed; ORBITMQ_SEED replays it. Kill cycles:
ORBITMQ_CRASH_ITERATIONS, default 5 (about 3 s each).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest

from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    Message,
    MessageQueue,
    PullStatus,
    SendResult,
    SendStatus,
)
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicRouteData, decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.testing.checker import History, check, now_ms, read_back, stamp
from tests import harness
from tests.harness import ProcessCluster, ServerProcess

cluster = harness.cluster

DEFAULT_CYCLES = 5
TOPICS = {"CrashOrders": 4, "CrashEvents": 2}  # topic -> queues
ACKS_BEFORE_KILL = 30  # each cycle sends at least this much before the random kill delay
MAX_KILL_DELAY_S = 0.8
IN_FLIGHT_PER_KILL = 200  # two producers: 2 sync sends, a batch (<= 20), an async burst (< 60)
WAIT_S = 20.0


def cycles() -> int:
    env = os.environ.get("ORBITMQ_CRASH_ITERATIONS")
    n = int(env) if env else DEFAULT_CYCLES
    if n < 1:
        raise ValueError("ORBITMQ_CRASH_ITERATIONS must be at least 1")
    return n


# About 3 s per cycle (more on a loaded machine), plus starting up.
pytestmark = [pytest.mark.crash, pytest.mark.timeout(120 + 10 * cycles())]


def digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Acked:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    digest: bytes


@dataclass(slots=True)
class Ledger:
    """Every message sent (by digest) and every acknowledgement, in order of arrival."""

    sent: set[bytes] = field(default_factory=set)
    acked: list[Acked] = field(default_factory=list)
    failures: int = 0
    not_durable: int = 0
    """Messages answered FLUSH_DISK_TIMEOUT: stored but not fsynced in time, no promise."""
    errors: dict[str, int] = field(default_factory=dict)
    history: History = field(default_factory=History)

    def add(self, result: SendResult, msgs: Sequence[Message], sent_ms: float) -> None:
        for i, m in enumerate(msgs):
            client, seq = m.properties["CHECKER_CLIENT"], int(m.properties["CHECKER_SEQ"])
            self.history.result(client, seq, result, sent_ms, index=i)
        bodies = [m.body for m in msgs]
        if result.status is not SendStatus.SEND_OK:  # stored, not known to be durable
            self.not_durable += len(bodies)
            return
        ids = result.msg_ids or (result.msg_id,)
        assert len(ids) == len(bodies)
        mq = result.message_queue
        for i, (msg_id, body) in enumerate(zip(ids, bodies, strict=True)):
            self.acked.append(
                Acked(mq.topic, mq.queue_id, result.queue_offset + i, msg_id, digest(body))
            )

    def fail(self, exc: BaseException, msgs: Sequence[Message], sent_ms: float) -> None:
        for m in msgs:
            client, seq = m.properties["CHECKER_CLIENT"], int(m.properties["CHECKER_SEQ"])
            self.history.unknown(client, seq, m.topic, sent_ms, exc)
        self.failures += 1
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


class Workers:
    """Sending tasks: they run until stopped, through kills and restarts."""

    def __init__(self, producers: list[AsyncProducer], seed: int, ledger: Ledger) -> None:
        self.producers = producers
        self.seed = seed
        self.ledger = ledger
        self._stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        kinds = [self._sync, self._sync, self._batch, self._async]
        for n, kind in enumerate(kinds):
            producer = self.producers[n % len(self.producers)]
            rng = random.Random(self.seed * 31 + n)
            self.tasks.append(asyncio.create_task(kind(n, producer, rng)))

    async def stop(self) -> None:
        """Stop the workers; the first call raises a worker's unexpected exception, if any."""
        self._stop.set()
        tasks, self.tasks = self.tasks, []
        await asyncio.gather(*tasks)

    def _message(self, worker: int, seq: int, rng: random.Random) -> Message:
        topic = rng.choice(sorted(TOPICS))
        head = f"w{worker}-{seq}-".encode()
        if rng.random() < 0.05:  # compressible, over the producer's compression threshold
            body = head + bytes(rng.randrange(64)) * rng.randrange(80, 400)
        else:
            body = head + rng.randbytes(rng.randrange(8, 1024))
        self.ledger.sent.add(digest(body))
        return stamp(Message(topic, body, keys=[head.decode()]), f"w{worker}", seq)

    async def _pause_after_failure(self) -> None:
        await asyncio.sleep(0.02)  # the broker is down: do not spin

    async def _sync(self, n: int, producer: AsyncProducer, rng: random.Random) -> None:
        seq = 0
        while not self._stop.is_set():
            msg = self._message(n, seq, rng)
            seq += 1
            sent = now_ms()
            try:
                self.ledger.add(await producer.send(msg), [msg], sent)
            except MQError as exc:
                self.ledger.fail(exc, [msg], sent)
                await self._pause_after_failure()

    async def _batch(self, n: int, producer: AsyncProducer, rng: random.Random) -> None:
        seq = 0
        while not self._stop.is_set():
            first = self._message(n, seq, rng)
            msgs = [first]
            for _ in range(rng.randrange(1, 20)):
                seq += 1
                m = self._message(n, seq, rng)
                msgs.append(Message(first.topic, m.body, keys=m.keys, properties=m.properties))
            seq += 1
            sent = now_ms()
            try:
                self.ledger.add(await producer.send_batch(msgs), msgs, sent)
            except MQError as exc:
                self.ledger.fail(exc, msgs, sent)
                await self._pause_after_failure()

    async def _async(self, n: int, producer: AsyncProducer, rng: random.Random) -> None:
        seq = 0
        while not self._stop.is_set():
            msgs = [self._message(n, seq + i, rng) for i in range(rng.randrange(1, 60))]
            seq += len(msgs)
            sent = now_ms()
            futures = [producer.send_async(m) for m in msgs]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = False
            for msg, res in zip(msgs, results, strict=True):
                if isinstance(res, SendResult):
                    self.ledger.add(res, [msg], sent)
                elif isinstance(res, MQError):
                    self.ledger.fail(res, [msg], sent)
                    failed = True
                else:
                    raise res
            if failed:
                await self._pause_after_failure()


async def route_ready(client: RemotingClient, namesrv: str) -> bool:
    """Does the NameServer route every topic to the broker (it registered again)?"""
    for topic, queues in TOPICS.items():
        resp = await client.invoke(
            namesrv, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})
        )
        if resp.code != ResponseCode.SUCCESS:
            return False
        route = decode_body(bytes(resp.body), TopicRouteData)
        if [q.write_queue_nums for q in route.queue_datas] != [queues]:
            return False
    return True


async def wait_until(
    check: Callable[[], Awaitable[bool]], what: str, broker: ServerProcess
) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}; broker log:\n{broker.log()[-3000:]}"
            )
        await asyncio.sleep(0.02)


async def read_queue(
    admin: AsyncAdminClient, mq: MessageQueue, first: int, end: int
) -> dict[int, StoredMessage]:
    """Messages at offsets [first, end) of one queue (all present: they were acknowledged)."""
    found: dict[int, StoredMessage] = {}
    offset = first
    while offset < end:
        res = await admin.pull(mq, offset, max_nums=1024, max_bytes=16 * 1024 * 1024)
        if res.status is not PullStatus.FOUND:
            raise AssertionError(
                f"{mq}: {res.status.value} at offset {offset}, below {end}: acknowledged messages "
                f"lost (queue min {res.min_offset}, max {res.max_offset})"
            )
        for m in res.messages:
            found[m.queue_offset] = m
        offset = res.next_begin_offset
    return found


async def verify(admin: AsyncAdminClient, acks: Sequence[Acked]) -> int:
    """Every ack readable at its queue and offset, same id and body digest; returns the count."""
    by_queue: dict[tuple[str, int], list[Acked]] = {}
    for a in acks:
        by_queue.setdefault((a.topic, a.queue_id), []).append(a)
    readable = 0
    for (topic, qid), queue_acks in sorted(by_queue.items()):
        mq = MessageQueue(topic, "crash-broker", qid)
        lo = min(a.queue_offset for a in queue_acks)
        hi = max(a.queue_offset for a in queue_acks) + 1
        stored = await read_queue(admin, mq, lo, hi)
        for a in queue_acks:
            m = stored.get(a.queue_offset)
            assert m is not None, f"acknowledged {a} is not readable"
            assert m.msg_id == a.msg_id, f"{a}: another message ({m.msg_id}) at its offset"
            assert digest(m.body) == a.digest, f"{a}: body differs"
            assert (m.topic, m.queue_id) == (topic, qid)
            readable += 1
    return readable


async def test_broker_sigkill_keeps_every_acknowledged_message(
    cluster: ProcessCluster, crash_seed: int
) -> None:
    rng = random.Random(crash_seed)
    n_cycles = cycles()
    started = time.monotonic()
    ns = cluster.namesrv()
    broker = cluster.broker("crash-broker", [ns.address], flush="SYNC_FLUSH")
    client = RemotingClient()
    admin = AsyncAdminClient([ns.address])
    ledger = Ledger()
    producers = [
        AsyncProducer(
            [ns.address],
            ProducerConfig(send_timeout_s=2.0, linger_ms=2, route_refresh_interval_s=1.0),
        )
        for _ in range(2)
    ]
    workers = Workers(producers, crash_seed, ledger)
    verified = 0
    kills: list[str] = []
    try:
        for topic, queues in TOPICS.items():
            await admin.create_topic(
                topic, read_queue_nums=queues, write_queue_nums=queues, broker_addr=broker.address
            )
        await wait_until(lambda: route_ready(client, ns.address), "the routes", broker)
        for p in producers:
            await p.start()
        workers.start()
        for cycle in range(n_cycles):
            floor = len(ledger.acked) + ACKS_BEFORE_KILL

            async def enough(floor: int = floor) -> bool:
                return len(ledger.acked) >= floor

            await wait_until(enough, "acks", broker)
            delay = rng.uniform(0.0, MAX_KILL_DELAY_S)
            await asyncio.sleep(delay)
            acked_at_kill = len(ledger.acked)
            ledger.history.fault(f"broker SIGKILL {cycle}")
            await asyncio.to_thread(broker.kill)
            kills.append(f"cycle {cycle}: killed {delay:.3f}s in, {acked_at_kill} acked")
            await asyncio.sleep(rng.uniform(0.0, 0.2))  # the producers see a dead broker
            await asyncio.to_thread(broker.restart)
            await wait_until(lambda: route_ready(client, ns.address), "re-registration", broker)
            snapshot = ledger.acked[verified:]
            assert await verify(admin, snapshot) == len(snapshot)
            verified += len(snapshot)
        await workers.stop()

        # Read everything once: contiguous queues, only messages that were sent, every ack.
        acked_digests = {a.digest for a in ledger.acked}
        present = 0
        unacked_present = 0
        for topic, queues in TOPICS.items():
            for qid in range(queues):
                mq = MessageQueue(topic, "crash-broker", qid)
                lo, hi = await admin.min_offset(mq), await admin.max_offset(mq)
                stored = await read_queue(admin, mq, lo, hi)
                assert sorted(stored) == list(range(lo, hi)), f"{mq}: offsets not contiguous"
                for m in stored.values():
                    d = digest(m.body)
                    assert d in ledger.sent, f"{mq}@{m.queue_offset}: a message never sent"
                    present += 1
                    unacked_present += d not in acked_digests
        readable = await verify(admin, ledger.acked)
        # The message-id index was rebuilt past each crash too (a sample: one query each).
        for a in rng.sample(ledger.acked, min(200, len(ledger.acked))):
            m = await admin.get_message_by_id(a.topic, a.msg_id)
            assert m is not None, f"acknowledged {a} not found by id"
            assert (m.queue_id, m.queue_offset, digest(m.body)) == (
                a.queue_id,
                a.queue_offset,
                a.digest,
            ), a
        # The same read again through the checker: the route clients use, every queue drained.
        report = check(ledger.history, await read_back(admin, sorted(TOPICS)))
        print(report.summary())
        report.assert_ok(max_duplicates=IN_FLIGHT_PER_KILL * n_cycles)
        assert report.acked == len(ledger.acked)
        elapsed = time.monotonic() - started
        print(
            f"seed {crash_seed}: {n_cycles} kills in {elapsed:.1f}s; acknowledged "
            f"{len(ledger.acked)}, readable {readable}; stored {present} "
            f"(of them unacknowledged {unacked_present}); failed sends {ledger.failures} "
            f"{ledger.errors}, not durable {ledger.not_durable}"
        )
        for line in kills:
            print("  " + line)
        assert readable == len(ledger.acked)
    finally:
        await workers.stop()
        for p in producers:
            await p.close()
        await admin.close()
        await client.close()
