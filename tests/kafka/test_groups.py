"""The classic group coordinator: member ids (KIP-394), a rebalance that waits for every member,
the leader's assignment handed out, heartbeats asking for a rejoin, leave and session expiry;
and two real kafka-python consumers sharing a topic's partitions."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from orbitmq.kafka.groups import (
    COMPLETING,
    EMPTY,
    MEMBER_ID_REQUIRED,
    REBALANCE_IN_PROGRESS,
    STABLE,
    UNKNOWN_MEMBER_ID,
    Coordinator,
)
from tests.kafka.conftest import Stack


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _join(gid: str, member: str = "", session: int = 10_000) -> dict[str, Any]:
    return {"group_id": gid, "session_timeout_ms": session, "rebalance_timeout_ms": 2000,
            "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"m-" + member.encode()}]}  # fmt: skip


async def _member_id(co: Coordinator, gid: str) -> str:
    first = await co.join(_join(gid), 5, "client", "/h")
    assert first["error_code"] == MEMBER_ID_REQUIRED
    return str(first["member_id"])


async def test_two_members_rebalance_assign_and_expire() -> None:
    clock = FakeClock()
    co = Coordinator(min_session_ms=1000, max_session_ms=60_000, initial_delay_ms=50, clock=clock)
    a = await _member_id(co, "g")
    ja = asyncio.ensure_future(co.join(_join("g", a), 5, "client", "/h"))
    b = await _member_id(co, "g")
    jb = asyncio.ensure_future(co.join(_join("g", b), 5, "client", "/h"))
    ra, rb = await asyncio.wait_for(asyncio.gather(ja, jb), 5)
    assert ra["generation_id"] == rb["generation_id"] == 1
    leader = ra if ra["leader"] == a else rb
    follower = rb if leader is ra else ra
    assert len(leader["members"]) == 2 and follower["members"] == []
    assert co.groups["g"].state == COMPLETING
    # the follower's SyncGroup waits for the leader's assignment
    fsync = asyncio.ensure_future(co.sync({"group_id": "g", "generation_id": 1,
                                           "member_id": follower["member_id"], "assignments": []}))  # fmt: skip
    await asyncio.sleep(0)
    assert not fsync.done()
    assignments = [{"member_id": a, "assignment": b"A"}, {"member_id": b, "assignment": b"B"}]
    lsync = await co.sync({"group_id": "g", "generation_id": 1, "member_id": leader["member_id"],
                           "assignments": assignments})  # fmt: skip
    got = await asyncio.wait_for(fsync, 5)
    assert {lsync["assignment"], got["assignment"]} == {b"A", b"B"}
    assert co.groups["g"].state == STABLE
    assert co.heartbeat({"group_id": "g", "generation_id": 1, "member_id": a}) == 0
    # b falls silent: after its session it is removed and a must rejoin
    clock.now = 5.0
    co.heartbeat({"group_id": "g", "generation_id": 1, "member_id": a})
    clock.now = 12.0
    assert co.expire() == 1
    assert (
        co.heartbeat({"group_id": "g", "generation_id": 1, "member_id": a}) == REBALANCE_IN_PROGRESS
    )
    again = await asyncio.wait_for(co.join(_join("g", a), 5, "client", "/h"), 5)
    assert again["generation_id"] == 2 and again["leader"] == a and len(again["members"]) == 1
    assert co.leave("g", [a]) == [0]
    assert co.groups["g"].state == EMPTY
    assert co.heartbeat({"group_id": "g", "generation_id": 2, "member_id": a}) == UNKNOWN_MEMBER_ID


async def test_a_join_must_share_one_protocol_with_every_member() -> None:
    """{x,y} and {y,z} share y; {x,z} shares a protocol with each but none with both, so it is
    refused (INCONSISTENT_GROUP_PROTOCOL, 23) and the rebalance completes on y."""

    async def join(member: str, names: tuple[str, ...]) -> dict[str, Any]:
        body = {**_join("p", member), "protocols": [{"name": n, "metadata": b""} for n in names]}
        return await co.join(body, 5, "client", "/h")

    co = Coordinator(min_session_ms=1000, max_session_ms=60_000, initial_delay_ms=100)
    a = (await join("", ("x", "y")))["member_id"]
    ja = asyncio.ensure_future(join(a, ("x", "y")))
    b = (await join("", ("y", "z")))["member_id"]
    jb = asyncio.ensure_future(join(b, ("y", "z")))
    await asyncio.sleep(0)
    assert (await join("", ("x", "z")))["error_code"] == 23
    ra, rb = await asyncio.wait_for(asyncio.gather(ja, jb), 5)
    assert ra["protocol_name"] == rb["protocol_name"] == "y"
    assert (await join("", ("y",)))["error_code"] == MEMBER_ID_REQUIRED  # y alone is welcome


async def test_a_join_without_protocols_is_refused() -> None:
    """A first member with no protocol (or no protocol type) has nothing a rebalance could
    choose: INCONSISTENT_GROUP_PROTOCOL, as Kafka answers, and the coordinator keeps working
    (the rebalance used to raise StopIteration in a timer callback; found by the live fuzzer,
    seed 101582225)."""
    co = Coordinator(min_session_ms=1000, max_session_ms=60_000, initial_delay_ms=50)
    for body in ({**_join("np"), "protocols": []}, {**_join("np"), "protocol_type": ""}):
        assert (await co.join(body, 5, "client", "/h"))["error_code"] == 23
        assert (await co.join({**body, "member_id": "m-1"}, 5, "client", "/h"))["error_code"] == 23
    member = await _member_id(co, "np")
    answer = await asyncio.wait_for(co.join(_join("np", member), 5, "client", "/h"), 5)
    assert answer["error_code"] == 0 and answer["protocol_name"] == "range"


async def test_unknown_member_and_bad_session() -> None:
    co = Coordinator(min_session_ms=1000, max_session_ms=60_000, initial_delay_ms=0)
    assert (await co.join(_join("g", "nobody"), 5, "c", "/h"))["error_code"] == UNKNOWN_MEMBER_ID
    assert (await co.join(_join("g", session=10), 5, "c", "/h"))["error_code"] == 26


kafka = pytest.importorskip("kafka")


@pytest.mark.timeout(200)
async def test_two_kafka_python_consumers_share_partitions(stack: Stack) -> None:
    """Each consumer polls in its own thread, as kafka-python expects: kafka-python 3.0.12 drops
    a JoinGroup/SyncGroup round that completes while its consumer is not inside poll() (the
    next poll sees the finished task and starts a new join), so two consumers polled in turn
    from one thread keep the leader rejoining forever (docs/kafka.md, "Client notes")."""

    def produce() -> None:
        admin = kafka.KafkaAdminClient(bootstrap_servers=stack.bootstrap)
        admin.create_topics(
            [kafka.admin.NewTopic("shared", num_partitions=4, replication_factor=1)]
        )
        admin.close()
        prod = kafka.KafkaProducer(bootstrap_servers=stack.bootstrap)
        for i in range(40):
            prod.send("shared", value=b"%d" % i, partition=i % 4)
        prod.flush(30)
        prod.close()

    await asyncio.to_thread(produce)
    lock = threading.Lock()
    seen: list[set[bytes]] = [set(), set()]
    parts: list[set[int]] = [set(), set()]
    done = threading.Event()
    end = time.monotonic() + 150  # kafka-python rebalances slowly on a loaded machine

    def settled() -> bool:
        return len(seen[0] | seen[1]) == 40 and all(parts) and not parts[0] & parts[1]

    def consume(i: int) -> None:
        c = kafka.KafkaConsumer(bootstrap_servers=stack.bootstrap, group_id="shared-g",
                                auto_offset_reset="earliest", session_timeout_ms=10000,
                                heartbeat_interval_ms=500)  # fmt: skip
        try:
            c.subscribe(["shared"])
            while not done.is_set() and time.monotonic() < end:
                got = c.poll(timeout_ms=200)
                with lock:
                    for recs in got.values():
                        seen[i] |= {r.value for r in recs}
                    parts[i] = {tp.partition for tp in c.assignment()}
                    if settled():
                        done.set()
        finally:
            done.set()  # the loop ended: settled, timed out or failed; stop the other one
            c.close()

    await asyncio.gather(*(asyncio.to_thread(consume, i) for i in range(2)))
    assert len(seen[0] | seen[1]) == 40
    assert parts[0] and parts[1] and not parts[0] & parts[1] and parts[0] | parts[1] == {0, 1, 2, 3}
