"""Consumers as real processes against a real NameServer and broker (issue #4's acceptance).

Each consumer is a ``tests.integration.consumer_child`` process that appends every message it
is handed to its own file *before* acknowledging it, so the files tell what was consumed, by
whom, when and how often, even for a consumer killed with SIGKILL. The test process produces
(AsyncProducer) and reads the files. Scenarios:

1. three push consumers of one clustering group share a topic's eight queues: every message
   consumed exactly once, every queue read by the one member it is assigned to;
2. the same, with one member SIGKILLed mid-stream: nothing lost, and the only duplicates are
   messages the killed member consumed within its last commit window;
3. orderly consumers, one joining and one leaving mid-stream: per key, first-time consumptions
   follow the send order with nothing skipped (redeliveries only repeat a suffix);
4. broadcasting: every member gets every message;
5. Pop: ten simple consumers (processes) share a two-queue topic; all acked once; messages left
   unacked come back after their invisible time, with delivery attempt 2;
6. a SYNC_FLUSH broker SIGKILLed and restarted keeps (a) the committed offsets of a push group
   and (b) its Pop state: unacked messages come back, acked ones do not, outstanding receipt
   handles still ack.

The seed (kill moments) is printed; ORBITMQ_SEED replays it. Every wait is bounded; every process
is stopped by PID when the test ends (the ``cluster`` fixture).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, SendStatus, hash_selector
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.simple import AsyncSimpleConsumer
from orbitmq.client.consumer_types import ConsumeFromWhere, ReceivedMessage
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    MQError,
    ReceiptHandleExpiredError,
    ReceiptHandleInvalidError,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.harness import ProcessCluster, ServerProcess
from tests.integration.consumer_child import (
    MODULE,
    ChildLog,
    Consumed,
    child_args,
    latest_assignment,
    read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BROKER = "broker-a"
WAIT_S = 30.0
COMMIT_INTERVAL_S = 0.2
SLACK_S = 1.5
"""How late a due commit may be on a loaded machine (scheduling, a slow fsync)."""


@pytest.fixture
def seed() -> int:
    """ORBITMQ_SEED replays a run; otherwise a fresh seed, printed for the failure report."""
    env = os.environ.get("ORBITMQ_SEED")
    value = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"consumer test seed: ORBITMQ_SEED={value}")
    return value


# ----------------------------------------------------------------------------- helpers


class Group:
    """The consumer processes of one group, each writing ``<name>.out`` in the test's folder."""

    def __init__(
        self,
        cluster: ProcessCluster,
        base: Path,
        namesrv: str,
        group: str,
        topic: str,
        mode: str,
        **options: object,
    ) -> None:
        self.cluster = cluster
        self.base = base
        self.namesrv = namesrv
        self.group = group
        self.topic = topic
        self.mode = mode
        self.options = options
        self.procs: dict[str, ServerProcess] = {}
        self.paths: dict[str, Path] = {}

    def start(self, *names: str, **per_name: dict[str, object]) -> list[ServerProcess]:
        """Start consumers (at once, then wait for each); ``per_name[name]`` adds options."""
        procs = []
        for name in names:
            out = self.base / f"{name}.out"
            opts = {**self.options, **per_name.get(name, {})}
            args = child_args(self.namesrv, self.group, self.topic, self.mode, out, **opts)
            proc = self.cluster.child("consumer", MODULE, args, name=name, start=False)
            self.procs[name] = proc
            self.paths[name] = out
            procs.append(proc)
        return self.cluster.start_all(procs, timeout=60)

    def stop(self, *names: str) -> None:
        """SIGTERM them all first (they shut down in parallel), then wait for each."""
        procs = [self.procs[n] for n in names or self.procs]
        for proc in procs:
            if proc.running and proc.proc is not None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.stop()

    def client_id(self, name: str) -> str:
        return self.procs[name].address

    def logs(self) -> dict[str, ChildLog]:
        return read_all(self.paths)

    def consumed(self) -> list[Consumed]:
        return [r for log in self.logs().values() for r in log.consumed]

    def bodies(self) -> set[str]:
        return {r.body for r in self.consumed()}

    def diagnose(self) -> str:
        lines = []
        for name, proc in self.procs.items():
            log = read_all({name: self.paths[name]})[name]
            lines.append(
                f"{name} ({proc.address}, running={proc.running}): {len(log.consumed)} consumed, "
                f"assignment {sorted(latest_assignment(log, self.topic) or [])}"
            )
            if not proc.running:
                lines.append(proc.log()[-1500:])
        return "\n".join(lines)

    def balanced(self, names: Sequence[str], queues: frozenset[str]) -> bool:
        """Do ``names`` report disjoint, non-empty assignments covering ``queues``?"""
        logs = read_all({n: self.paths[n] for n in names})
        got = [latest_assignment(logs[n], self.topic) for n in names]
        if any(not a for a in got):
            return False
        seen: set[str] = set()
        for a in got:
            assert a is not None
            if seen & a:
                return False
            seen |= a
        return seen == queues

    async def wait_balanced(self, names: Sequence[str], queues: frozenset[str]) -> None:
        await wait_for(lambda: self.balanced(names, queues), "a balanced assignment", self)

    async def wait_consumed(self, expected: Iterable[str], timeout: float = WAIT_S) -> None:
        want = set(expected)

        def done() -> bool:
            return want <= self.bodies()

        try:
            await wait_for(done, "every message consumed", self, timeout)
        except AssertionError as exc:
            missing = sorted(want - self.bodies())
            raise AssertionError(f"{exc}; {len(missing)} missing, e.g. {missing[:10]}") from None


async def wait_for(
    check: Callable[[], bool], what: str, group: Group | None = None, timeout: float = WAIT_S
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            state = f"\n{group.diagnose()}" if group is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{state}")
        await asyncio.sleep(0.1)


async def create_topic(
    admin: AsyncAdminClient, broker: ServerProcess, topic: str, queues: int
) -> frozenset[str]:
    """The topic on the broker, routed by the NameServer; its queues as the children name them."""
    await admin.create_topic(
        topic, read_queue_nums=queues, write_queue_nums=queues, broker_addr=broker.address
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if len(await admin.queues(topic)) == queues:
                break
        except (TopicRouteNotFoundError, MQError):
            pass
        assert time.monotonic() < deadline, f"no route of {topic}"
        await asyncio.sleep(0.1)
    return frozenset(f"{topic}@{BROKER}@{q}" for q in range(queues))


async def send_all(
    producer: AsyncProducer, topic: str, bodies: Sequence[str], *, ordered: bool = False
) -> list[str]:
    """Send every body, hashed to a queue by its key: the body itself (spread over every
    queue; plain send_async would put a whole automatic batch into one queue), or with
    ``ordered`` its prefix before the last "-" (a key's messages in one queue, in order).
    Every send must be acknowledged SEND_OK."""
    futures = []
    for body in bodies:
        key = body.rsplit("-", 1)[0] if ordered else body
        msg = Message(topic, body.encode(), keys=[key])
        futures.append(producer.send_async(msg, selector=hash_selector))
    results = await asyncio.gather(*futures)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    return list(bodies)


def duplicates(records: Iterable[Consumed]) -> dict[str, list[Consumed]]:
    """Bodies consumed more than once -> their records in time order."""
    by_body: dict[str, list[Consumed]] = defaultdict(list)
    for r in records:
        by_body[r.body].append(r)
    return {b: sorted(rs, key=lambda r: r.time_ns) for b, rs in by_body.items() if len(rs) > 1}


async def committed_offsets(
    client: RemotingClient, broker: str, group: str, topic: str, queues: int
) -> list[int | None]:
    """QUERY_CONSUMER_OFFSET of each queue (None: never committed)."""
    out: list[int | None] = []
    for q in range(queues):
        resp = await client.invoke(
            broker,
            Frame(
                RequestCode.QUERY_CONSUMER_OFFSET,
                fields={
                    "group": group,
                    "topic": topic,
                    "queue_id": q,
                    "set_zero_if_not_found": False,  # the stored offset only
                },
            ),
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            out.append(None)
        else:
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            out.append(int(resp.fields["offset"]))
    return out


async def max_offsets(admin: AsyncAdminClient, topic: str) -> list[int]:
    return [await admin.max_offset(mq) for mq in sorted(await admin.queues(topic))]


# ----------------------------------------------------------------------------- 1. exactly once


async def test_push_group_consumes_every_message_once(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, n = "PushOnce", 3000
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2))
    try:
        queues = await create_topic(admin, broker, topic, 8)
        group = Group(
            cluster, tmp_path, ns.address, "GOnce", topic, "push",
            commit_interval_s=COMMIT_INTERVAL_S,
        )  # fmt: skip
        names = ["c0", "c1", "c2"]
        await asyncio.to_thread(group.start, *names)
        await group.wait_balanced(names, queues)
        await producer.start()
        started = time.monotonic()
        sent = await send_all(producer, topic, [f"once-{i:05d}" for i in range(n)])
        await group.wait_consumed(sent)
        took = time.monotonic() - started
        await asyncio.sleep(0.5)  # a late duplicate would show up now
        logs = group.logs()
        assignment = {name: latest_assignment(logs[name], topic) or frozenset() for name in names}
        await asyncio.to_thread(group.stop)

        records = [r for log in logs.values() for r in log.consumed]
        counts = Counter(r.body for r in records)
        print(
            f"{n} messages consumed by {len(names)} push consumers in {took:.2f}s: "
            + ", ".join(f"{name} {len(logs[name].consumed)}" for name in names)
        )
        assert set(counts) == set(sent), "something consumed that was not sent"
        assert not [b for b, c in counts.items() if c > 1], "duplicates without a failure"
        assert set().union(*assignment.values()) == queues
        assert sum(len(a) for a in assignment.values()) == len(queues), assignment
        owners: dict[str, set[str]] = defaultdict(set)
        for r in records:
            assert r.topic == topic and r.reconsume_times == 0, r
            owners[f"{r.read_topic}@{r.broker}@{r.queue_id}"].add(r.consumer)
        assert set(owners) == queues, "a queue got no message"
        for q, who in owners.items():
            assert len(who) == 1, f"{q} read by {who}"
            (name,) = who
            assert q in assignment[name], f"{q} read by {name}, assigned {assignment[name]}"
    finally:
        await producer.close()
        await admin.close()


# ----------------------------------------------------------------------------- 2. a member killed


async def test_push_member_sigkilled_mid_stream(
    cluster: ProcessCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, n = "PushKill", 2400
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2))
    try:
        queues = await create_topic(admin, broker, topic, 8)
        # Paced (2 threads x 10 ms a message, about 200 a second per member), so the kill
        # comes well after the first commit window and the duplicate bound below means much.
        group = Group(
            cluster, tmp_path, ns.address, "GKill", topic, "push",
            commit_interval_s=COMMIT_INTERVAL_S, pull_batch=16, threads=2, ack_delay_ms=10,
        )  # fmt: skip
        names = ["c0", "c1", "c2"]
        await asyncio.to_thread(group.start, *names)
        await group.wait_balanced(names, queues)
        # The middle member (in client-id order, as AVG allocates): when it leaves, AVG moves
        # only its queues, so the survivors hand nothing over among themselves.
        victim = sorted(names, key=group.client_id)[1]
        await producer.start()
        sent = await send_all(producer, topic, [f"kill-{i:05d}" for i in range(n)])
        at = int(n * rng.uniform(0.5, 0.7))

        def enough() -> bool:
            return len(group.consumed()) >= at

        await wait_for(enough, f"{at} consumed", group)
        kill_ns = time.time_ns()
        await asyncio.to_thread(group.procs[victim].kill)
        consumed_at_kill = len(group.consumed())
        await group.wait_consumed(sent)
        await asyncio.sleep(1.0)  # a late duplicate would show up now
        await asyncio.to_thread(group.stop)

        logs = group.logs()
        records = [r for log in logs.values() for r in log.consumed]
        assert {r.body for r in records} == set(sent)
        dups = duplicates(records)
        window_ns = kill_ns - int((COMMIT_INTERVAL_S + SLACK_S) * 1e9)
        by_victim = logs[victim].consumed
        recent = [r for r in by_victim if r.time_ns >= window_ns]
        span = (kill_ns - min(r.time_ns for r in by_victim)) / 1e9 if by_victim else 0.0
        print(
            f"killed {victim} ({group.client_id(victim)}) after {consumed_at_kill} of {n} "
            f"consumed; it had consumed {len(by_victim)} in {span:.2f}s, {len(recent)} of them "
            f"in its last {COMMIT_INTERVAL_S + SLACK_S:.1f}s; duplicates {len(dups)}"
        )
        assert by_victim and consumed_at_kill < n, "the kill was not mid-stream"
        for body, rs in dups.items():
            who = [r.consumer for r in rs]
            assert len(rs) == 2, f"{body} consumed {len(rs)} times: {who}"
            first, again = rs
            assert first.consumer == victim and again.consumer != victim, (
                f"{body}: a duplicate not caused by the kill: {rs}"
            )
            assert first.time_ns >= window_ns, (
                f"{body}: consumed by {victim} {(kill_ns - first.time_ns) / 1e9:.2f}s before the "
                f"kill, yet delivered again: its commit was lost"
            )
        assert len(dups) <= len(recent)
    finally:
        await producer.close()
        await admin.close()


# ----------------------------------------------------------------------------- 3. orderly


def check_order(records: Sequence[Consumed], keys: int, per_key: int) -> int:
    """Per key, the first consumptions of its messages (all consumers, by time) are its
    sequence numbers 0, 1, 2, ... in order: nothing out of order, nothing skipped. A
    redelivery (after a rebalance) may only repeat messages already consumed. Returns the
    number of redeliveries."""
    seen: dict[str, int] = defaultdict(lambda: -1)
    queue_of: dict[str, tuple[str, str, int]] = {}
    redelivered = 0
    for r in sorted(records, key=lambda r: r.time_ns):
        key, _, seq_text = r.body.rpartition("-")
        seq = int(seq_text)
        assert queue_of.setdefault(key, r.queue) == r.queue, f"{key} in two queues"
        if seq <= seen[key]:
            redelivered += 1
            continue
        assert seq == seen[key] + 1, (
            f"{key}: {r.consumer} consumed #{seq} first, after #{seen[key]} (skipped ahead)"
        )
        seen[key] = seq
    assert len(seen) == keys and all(v == per_key - 1 for v in seen.values()), dict(seen)
    return redelivered


async def test_orderly_group_keeps_key_order_through_rebalances(
    cluster: ProcessCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, keys, per_key = "Orderly", 24, 50
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=1))
    try:
        queues = await create_topic(admin, broker, topic, 8)
        group = Group(
            cluster, tmp_path, ns.address, "GOrder", topic, "orderly",
            commit_interval_s=COMMIT_INTERVAL_S, ack_delay_ms=1,
        )  # fmt: skip
        await asyncio.to_thread(group.start, "c0", "c1")
        await group.wait_balanced(["c0", "c1"], queues)
        await producer.start()
        join_at, leave_at = rng.randrange(8, 16), rng.randrange(26, 34)
        joining: asyncio.Future[list[ServerProcess]] | None = None
        leaving: asyncio.Future[None] | None = None
        sent: list[str] = []
        for seq in range(per_key):  # one round: the next message of every key
            sent += await send_all(
                producer, topic, [f"k{k:02d}-{seq:03d}" for k in range(keys)], ordered=True
            )
            if seq == join_at:
                joining = asyncio.ensure_future(asyncio.to_thread(group.start, "c2"))
            if seq == leave_at:
                leaving = asyncio.ensure_future(asyncio.to_thread(group.stop, "c0"))
            await asyncio.sleep(0.05)
        assert joining is not None and leaving is not None
        await joining
        await leaving
        await group.wait_consumed(sent)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(group.stop)

        logs = group.logs()
        records = [r for log in logs.values() for r in log.consumed]
        assert {r.body for r in records} == set(sent)
        redelivered = check_order(records, keys, per_key)
        print(
            f"orderly: {len(sent)} messages, c2 joined after round {join_at}, c0 left after "
            f"round {leave_at}; consumed "
            + ", ".join(f"{n} {len(log.consumed)}" for n, log in logs.items())
            + f"; redelivered {redelivered}"
        )
        assert logs["c0"].closed, "c0 did not shut down cleanly"
        assert logs["c2"].consumed, "the member that joined got nothing"
    finally:
        await producer.close()
        await admin.close()


# ----------------------------------------------------------------------------- 4. broadcasting


async def test_broadcast_members_each_get_every_message(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, n = "Broadcast", 600
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2))
    try:
        queues = await create_topic(admin, broker, topic, 4)
        group = Group(
            cluster, tmp_path, ns.address, "GCast", topic, "broadcast",
            commit_interval_s=COMMIT_INTERVAL_S,
        )  # fmt: skip
        names = ["c0", "c1", "c2"]
        per_name: dict[str, dict[str, object]] = {
            name: {"offset_dir": tmp_path / f"offsets-{name}"} for name in names
        }
        await asyncio.to_thread(group.start, *names, **per_name)

        def all_assigned() -> bool:
            logs = group.logs()
            return all(latest_assignment(logs[name], topic) == queues for name in names)

        await wait_for(all_assigned, "every member to own every queue", group)
        await producer.start()
        sent = await send_all(producer, topic, [f"cast-{i:04d}" for i in range(n)])

        def everyone_has_all() -> bool:
            logs = group.logs()
            return all({r.body for r in logs[name].consumed} >= set(sent) for name in names)

        await wait_for(everyone_has_all, "every member to get every message", group)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(group.stop)
        for name, log in group.logs().items():
            counts = Counter(r.body for r in log.consumed)
            assert set(counts) == set(sent), name
            assert max(counts.values()) == 1, f"{name} got duplicates"
    finally:
        await producer.close()
        await admin.close()


# ----------------------------------------------------------------------------- 5. pop


async def test_pop_consumers_share_and_unacked_come_back(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address])
    topic, rounds, per_round, invisible_s = "PopShare", 20, 20, 3.0
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=1))
    try:
        await create_topic(admin, broker, topic, 2)
        group = Group(
            cluster, tmp_path, ns.address, "GPop", topic, "pop",
            max_messages=4, ack_delay_ms=20, invisible_s=invisible_s, await_s=1.0,
            no_ack_prefix="na-", heartbeat_interval_s=1.0,
        )  # fmt: skip
        names = [f"p{i}" for i in range(10)]
        await asyncio.to_thread(group.start, *names)
        await producer.start()
        acked_bodies: list[str] = []
        unacked_bodies: list[str] = []
        for rnd in range(rounds):  # paced: the consumers take turns as messages arrive
            batch = [f"pp-{rnd:02d}-{i:02d}" for i in range(per_round)]
            acked_bodies += await send_all(producer, topic, batch)
            unacked_bodies += await send_all(producer, topic, [f"na-{rnd:02d}"])
            await asyncio.sleep(0.05)

        def all_acked() -> bool:
            oks = {b for log in group.logs().values() for _, b, o in log.acks if o == "ok"}
            return oks >= set(acked_bodies) | set(unacked_bodies)

        await wait_for(all_acked, "every message acked", group, timeout=WAIT_S)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(group.stop)

        logs = group.logs()
        records = [r for log in logs.values() for r in log.consumed]
        acks = [(b, o) for log in logs.values() for _, b, o in log.acks]
        by_body: dict[str, list[Consumed]] = defaultdict(list)
        for r in sorted(records, key=lambda r: r.time_ns):
            by_body[r.body].append(r)
        share = {name: len(log.consumed) for name, log in logs.items()}
        print(f"pop share: {share}")
        assert all(share.values()), f"a consumer got nothing: {share}"
        assert set(by_body) == set(acked_bodies) | set(unacked_bodies)
        for body in acked_bodies:
            rs = by_body[body]
            assert len(rs) == 1, f"{body} delivered {len(rs)} times though acked"
            assert rs[0].delivery_attempt == 1 and rs[0].topic == topic, rs[0]
        ack_outcomes = Counter(acks)
        for body in unacked_bodies:
            rs = by_body[body]
            assert [r.delivery_attempt for r in rs] == [1, 2], rs
            assert all(r.topic == topic for r in rs), rs
            deadline_ms = rs[0].invisible_until_ms
            assert deadline_ms is not None
            early_ms = deadline_ms - rs[1].time_ns // 1_000_000
            assert early_ms <= 20, f"{body} came back {early_ms} ms before its invisible time"
            assert ack_outcomes[(body, "skip")] == 1 and ack_outcomes[(body, "ok")] == 1
        bad = [(b, o) for b, o in acks if o not in ("ok", "skip")]
        assert not bad, f"acks failed: {bad[:10]}"
        assert len(acks) == len(acked_bodies) + 2 * len(unacked_bodies)
    finally:
        await producer.close()
        await admin.close()


# ----------------------------------------------------------------------------- 6. broker restart


async def test_broker_restart_keeps_committed_offsets(
    cluster: ProcessCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address], flush="SYNC_FLUSH")
    topic, queues, group_name = "OffsetsKept", 4, "GKept"
    admin = AsyncAdminClient([ns.address])
    client = RemotingClient()
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2, send_timeout_s=5.0))
    try:
        await create_topic(admin, broker, topic, queues)
        group = Group(
            cluster, tmp_path, ns.address, group_name, topic, "push",
            commit_interval_s=COMMIT_INTERVAL_S, threads=2, ack_delay_ms=2,
        )  # fmt: skip
        await asyncio.to_thread(group.start, "c0")
        await producer.start()
        first = await send_all(producer, topic, [f"r1-{i:04d}" for i in range(400)])
        await group.wait_consumed(first)
        ends: list[int] = []
        committed: list[int | None] = []

        async def caught_up() -> None:
            nonlocal committed
            deadline = time.monotonic() + WAIT_S
            while True:
                ends[:] = await max_offsets(admin, topic)
                committed = await committed_offsets(
                    client, broker.address, group_name, topic, queues
                )
                if committed == ends:
                    return
                assert time.monotonic() < deadline, f"commits {committed}, queue ends {ends}"
                await asyncio.sleep(0.1)

        # (1) Idle group, all committed: a broker crash keeps the offsets exactly.
        await caught_up()
        await asyncio.sleep(COMMIT_INTERVAL_S + SLACK_S)  # a durable commit of that, surely
        before = list(committed)
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.restart)
        after = await committed_offsets(client, broker.address, group_name, topic, queues)
        print(f"committed before the broker's SIGKILL {before}, after the restart {after}")
        assert after == before, "committed offsets lost in the crash"

        # (2) The running member goes on through the restart: nothing lost, nothing repeated,
        # and its commits reach the restarted broker.
        second = await send_all(producer, topic, [f"r2-{i:04d}" for i in range(400)])
        await group.wait_consumed(second)
        await caught_up()

        # (3) Broker and member crash together mid-stream; a new member after the restart
        # resumes at what was durably committed: it repeats only what the old one consumed
        # in its last commit window, and misses nothing.
        third = await send_all(producer, topic, [f"r3-{i:04d}" for i in range(1000)])
        at = rng.randrange(150, 500)

        def enough() -> bool:
            return len(set(third) & group.bodies()) >= at

        await wait_for(enough, f"{at} of the third round consumed", group)
        kill_ns = time.time_ns()
        await asyncio.to_thread(group.procs["c0"].kill)
        await asyncio.to_thread(broker.kill)
        consumed_at_kill = len(set(third) & group.bodies())
        await asyncio.to_thread(broker.restart)
        await asyncio.to_thread(group.start, "c1")
        await group.wait_consumed(third)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(group.stop)

        logs = group.logs()
        c0 = Counter(r.body for r in logs["c0"].consumed)
        c1 = Counter(r.body for r in logs["c1"].consumed)
        assert set(c0) - set(third) == set(first) | set(second) and max(c0.values()) == 1, (
            f"c0 repeated {[b for b, c in c0.items() if c > 1][:10]}"
        )
        assert max(c1.values()) == 1 and set(c1) <= set(third), (
            f"c1 consumed {sorted(set(c1) - set(third))[:10]} (committed before) again"
        )
        window_ns = kill_ns - int((COMMIT_INTERVAL_S + SLACK_S) * 1e9)
        again = [r for r in logs["c0"].consumed if r.body in c1]
        recent = [r for r in logs["c0"].consumed if r.time_ns >= window_ns]
        print(
            f"broker and member killed after {consumed_at_kill} of {len(third)} consumed; "
            f"the new member repeated {len(again)} (the old one consumed {len(recent)} in its "
            f"last {COMMIT_INTERVAL_S + SLACK_S:.1f}s)"
        )
        assert consumed_at_kill < len(third), "the kill was not mid-stream"
        late = [r.body for r in again if r.time_ns < window_ns]
        assert not late, f"committed long before the crash, consumed again: {late[:10]}"
    finally:
        await producer.close()
        await admin.close()
        await client.close()


async def receive_bodies(
    consumer: AsyncSimpleConsumer, want: set[str], invisible_s: float, timeout: float = WAIT_S
) -> dict[str, ReceivedMessage]:
    """Receive until every body in ``want`` came (anything else is a failure)."""
    got: dict[str, ReceivedMessage] = {}
    deadline = time.monotonic() + timeout
    while set(got) != want:
        assert time.monotonic() < deadline, f"still missing {sorted(want - set(got))[:10]}"
        for m in await consumer.receive(max_messages=16, invisible_duration_s=invisible_s):
            body = m.body.decode()
            assert body in want and body not in got, f"unexpected delivery of {body}"
            got[body] = m
    return got


async def test_broker_restart_keeps_pop_state(cluster: ProcessCluster, tmp_path: Path) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(BROKER, [ns.address], flush="SYNC_FLUSH")
    topic, group_name, short_s = "PopKept", "GPopKept", 3.0
    admin = AsyncAdminClient([ns.address])
    producer = AsyncProducer([ns.address], ProducerConfig(linger_ms=2, send_timeout_s=5.0))
    consumer = AsyncSimpleConsumer(
        [ns.address],
        group_name,
        SimpleConfig(
            await_duration_s=0.5,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            heartbeat_interval_s=1.0,
        ),
        subscriptions={topic: "*"},
    )
    try:
        await create_topic(admin, broker, topic, 2)
        await producer.start()
        await consumer.start()
        # long: invisible 60 s; half acked before the crash, half after (old handles).
        long_bodies = await send_all(producer, topic, [f"long-{i:02d}" for i in range(20)])
        long_msgs = await receive_bodies(consumer, set(long_bodies), 60.0)
        # short: invisible 3 s; half acked before the crash, half never (they must come back).
        short_bodies = await send_all(producer, topic, [f"short-{i:02d}" for i in range(20)])
        popped = time.time()
        short_msgs = await receive_bodies(consumer, set(short_bodies), short_s)
        acked_before = long_bodies[:10] + short_bodies[:10]
        for body in acked_before:
            await consumer.ack(long_msgs.get(body) or short_msgs[body])
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.restart)
        restarted = time.time()

        for body in long_bodies[10:]:  # outstanding handles still ack after the restart
            deadline = time.monotonic() + 10
            while True:
                try:
                    await consumer.ack(long_msgs[body])
                    break
                except (ReceiptHandleExpiredError, ReceiptHandleInvalidError) as exc:
                    raise AssertionError(
                        f"{body}: handle refused after the restart: {exc}"
                    ) from None
                except MQError as exc:  # the broker not answering yet
                    assert time.monotonic() < deadline, f"{body}: {exc}"
                    await asyncio.sleep(0.2)

        back = await receive_bodies(consumer, set(short_bodies[10:]), 30.0)
        came_back = time.time()
        for m in back.values():
            assert m.delivery_attempt == 2, m
            assert m.topic == topic
            await consumer.ack(m)
        # Nothing else comes back: not the acked ones (their invisible time of the short ones
        # has passed), not those just acked.
        deadline = time.monotonic() + short_s + 1.0
        extra: list[str] = []
        while time.monotonic() < deadline:
            extra += [m.body.decode() for m in await consumer.receive(16, 30.0)]
        print(
            f"pop restart: popped at 0, broker restarted at {restarted - popped:.2f}s, "
            f"unacked ones back at {came_back - popped:.2f}s; also came back: {extra}"
        )
        assert came_back - popped >= short_s - 0.5
        assert not extra, f"acked messages delivered again: {extra}"
    finally:
        await consumer.close()
        await producer.close()
        await admin.close()
