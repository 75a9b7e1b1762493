"""The history checker (orbitmq.testing.checker) on fabricated histories: a clean history passes,
and each kind of defect (lost, misplaced, duplicate, reordered, moved queue, phantom, gap) is
caught and named; recovery times follow the rule "first ack of a send issued after the fault".
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.client.route import MessageQueue
from orbitmq.common.message import Message
from orbitmq.protocol.bodies import PERM_READ_WRITE, BrokerData, QueueData, TopicRouteData
from orbitmq.testing.checker import (
    Delivered,
    History,
    Outcome,
    ReadBack,
    check,
    identify,
    percentile,
    read_back,
    stamp,
)

T = "Topic"
B = "broker-a"


def history_of(n: int, *, queue: int = 0, key: str | None = None, client: str = "p0") -> History:
    """``n`` acknowledged sends, seq i at offset i of one queue, sent at 1000 + 10 i ms."""
    h = History()
    for i in range(n):
        h.acked(client, i, T, B, queue, i, 1000.0 + 10 * i, key=key, done_ms=1005.0 + 10 * i)
    return h


def delivered_of(h: History) -> list[Delivered]:
    return [
        Delivered(r.client, r.seq, r.topic, r.broker_name, r.queue_id, r.queue_offset)
        for r in h.ok()
    ]


def test_a_clean_history_passes() -> None:
    h = history_of(20, key="k")
    report = check(h, delivered_of(h))
    assert report.problems() == []
    report.assert_ok()
    assert (report.acked, report.delivered, report.duplicate_count) == (20, 20, 0)


def test_a_lost_acknowledgement_is_caught() -> None:
    h = history_of(10)
    found = [d for d in delivered_of(h) if d.seq != 7]
    report = check(h, found)
    assert [r.seq for r in report.lost] == [7]
    with pytest.raises(AssertionError, match="1 acknowledged lost"):
        report.assert_ok()


def test_an_unknown_outcome_may_be_there_or_not() -> None:
    h = history_of(3)
    h.unknown("p0", 3, T, 1100.0, TimeoutError("no answer"))
    h.unknown("p0", 4, T, 1110.0, "FLUSH_SLAVE_TIMEOUT")
    stored = Delivered("p0", 4, T, B, 0, 3)
    report = check(h, [*delivered_of(h), stored])
    assert report.problems() == []
    assert (report.unknown, report.unknown_found) == (2, 1)


def test_a_message_at_another_offset_is_misplaced() -> None:
    h = history_of(5)
    found = delivered_of(h)
    found[2] = Delivered("p0", 2, T, B, 0, 9)  # offset reused: another message took 2
    report = check(h, found)
    assert [(r.seq, d.queue_offset) for r, d in report.misplaced] == [(2, 9)]
    assert "misplaced" in report.problems()[0]


def test_duplicates_are_counted_and_bounded() -> None:
    h = history_of(5)
    found = [*delivered_of(h), Delivered("p0", 1, T, B, 0, 5), Delivered("p0", 1, T, B, 0, 6)]
    report = check(h, found)
    assert report.duplicate_count == 2
    assert list(report.duplicates) == [("p0", 1)]
    assert report.problems(max_duplicates=2) == []
    with pytest.raises(AssertionError, match="2 duplicates"):
        report.assert_ok(max_duplicates=1)


def test_reordered_keyed_sends_are_an_order_violation() -> None:
    h = history_of(6, key="order-1")
    found = delivered_of(h)
    # seq 3 and 4 stored the other way round
    found[3] = Delivered("p0", 3, T, B, 0, 4)
    found[4] = Delivered("p0", 4, T, B, 0, 3)
    report = check(h, found)
    assert len(report.order_violations) == 1, report.order_violations
    assert "seq 4 at offset 3" in report.order_violations[0]
    assert report.problems(check_order=False) != []  # misplaced too: acked offsets differ
    assert any("order" in p for p in report.problems())


def test_a_keyed_send_moved_to_another_queue_is_an_order_violation() -> None:
    h = History()
    for i in range(4):
        h.acked("p0", i, T, B, 0 if i < 2 else 1, i, 1000.0 + i, key="k")
    report = check(h, delivered_of(h))
    assert report.lost == [] and report.misplaced == []
    assert report.order_violations == ["p0/k: seq 1 on broker-a/0, seq 2 on broker-a/1"]


def test_unkeyed_sends_have_no_order_to_keep() -> None:
    h = History()
    for i in range(4):
        h.acked("p0", i, T, B, i % 2, 3 - i, 1000.0 + i)
    assert check(h, delivered_of(h)).order_violations == []


def test_order_is_per_client_and_key() -> None:
    h = History()
    h.acked("p0", 0, T, B, 0, 1, 1000.0, key="a")
    h.acked("p1", 0, T, B, 0, 0, 1000.0, key="a")  # another client: its own order
    h.acked("p0", 1, T, B, 0, 2, 1001.0, key="a")
    assert check(h, delivered_of(h)).order_violations == []


def test_a_message_nobody_sent_is_a_phantom() -> None:
    h = history_of(3)
    report = check(h, [*delivered_of(h), Delivered("p9", 0, T, B, 0, 3)])
    assert [d.client for d in report.phantoms] == ["p9"]
    assert "never sent" in report.problems()[0]


def test_unreadable_ranges_are_reported() -> None:
    h = history_of(2)
    report = check(h, ReadBack(delivered_of(h), 0, ["Topic@broker-a/0: nothing at 1"]))
    assert report.problems() == ["unreadable ranges: ['Topic@broker-a/0: nothing at 1']"]


def test_recovery_is_the_first_ack_of_a_send_issued_after_the_fault() -> None:
    h = History()
    h.acked("p0", 0, T, B, 0, 0, sent_ms=900.0, done_ms=950.0)
    kill = h.fault("master SIGKILL", at_ms=1000.0)
    h.acked("p0", 1, T, B, 0, 1, sent_ms=990.0, done_ms=1200.0)  # on the wire before: no
    h.unknown("p0", 2, T, 1010.0, "connection lost")
    h.acked("p0", 3, T, B, 0, 2, sent_ms=1500.0, done_ms=3700.0)
    h.acked("p0", 4, T, B, 0, 3, sent_ms=3800.0, done_ms=3801.0)
    h.fault("never healed", at_ms=5000.0)
    report = check(h, delivered_of(h))
    assert report.recoveries[0].fault is kill
    assert report.recovery_ms() == [2700.0]
    assert [f.name for f in report.unrecovered] == ["never healed"]
    assert "recovery ms p50 2700" in report.summary()


def test_a_resent_sequence_counts_once_and_its_ack_speaks() -> None:
    h = History()
    h.unknown("p0", 0, T, 1000.0, "timeout")
    h.acked("p0", 0, T, B, 0, 0, 1100.0)
    report = check(h, [])
    assert (report.acked, report.unknown, len(report.lost)) == (1, 0, 1)


def test_history_from_send_results_and_jsonl_round_trip(tmp_path: Path) -> None:
    h = History()
    mq = MessageQueue(T, B, 2)
    batch = SendResult(SendStatus.SEND_OK, "a,b", mq, 10, 500, ("a", "b"))
    h.result("p0", 0, batch, 1.0, index=0)
    h.result("p0", 1, batch, 1.0, index=1, key="k")
    slow = SendResult(SendStatus.FLUSH_SLAVE_TIMEOUT, "c", mq, 12, 900, ("c",))
    h.result("p0", 2, slow, 2.0)
    h.fault("kill", at_ms=3.0)
    assert [(r.queue_offset, r.msg_id, r.outcome) for r in h.snapshot()] == [
        (10, "a", Outcome.OK),
        (11, "b", Outcome.OK),
        (12, "c", Outcome.UNKNOWN),
    ]
    path = tmp_path / "history.jsonl"
    h.dump(path)
    back = History.load(path)
    assert back.snapshot() == h.snapshot()
    assert [f.name for f in back.faults] == ["kill"]
    merged = History().merge(back)
    assert len(merged.snapshot()) == 3


def test_identity_from_properties_or_body_prefix() -> None:
    msg = stamp(Message(T, b"x"), "w3", 41)

    def stored(body: bytes, props: dict[str, str]) -> Any:
        return SimpleNamespace(body=body, properties=props)

    assert identify(stored(b"x", msg.properties)) == ("w3", 41)
    assert identify(stored(b"w1:17:payload", {})) == ("w1", 17)
    assert identify(stored(b"no identity", {})) is None
    assert identify(stored(b"a:b:c", {})) is None


class FakeAdmin:
    """Two queues; queue 1 answers nothing at one offset below its max (a gap). The route names
    no master for the first ``masterless_reads`` reads (a NameServer that has not heard from a
    new master yet)."""

    def __init__(self, masterless_reads: int = 0) -> None:
        self.masterless_reads = masterless_reads
        self.route_reads = 0

        def msg(client: str, seq: int, qid: int, off: int) -> Any:
            return SimpleNamespace(
                body=f"{client}:{seq}:".encode(), properties={}, topic=T, queue_id=qid,
                queue_offset=off, msg_id=f"id{seq}",
            )  # fmt: skip

        self.data = {
            0: [msg("p0", i, 0, i) for i in range(5)] + [SimpleNamespace(
                body=b"foreign", properties={}, topic=T, queue_id=0, queue_offset=5, msg_id="")],
            1: [msg("p0", 10, 1, 0)],
        }  # fmt: skip
        self.max = {0: 6, 1: 3}

    async def topic_route(self, topic: str) -> TopicRouteData:
        self.route_reads += 1
        slaves = {1: "10.0.0.2:10911", 2: "10.0.0.3:10911"}
        addrs = slaves if self.route_reads <= self.masterless_reads else {0: "10.0.0.1:10911"}
        return TopicRouteData(
            queue_datas=[QueueData(broker_name=B, read_queue_nums=2, write_queue_nums=2,
                                   perm=PERM_READ_WRITE)],
            broker_datas=[BrokerData(cluster="C", broker_name=B, broker_addrs=addrs)],
        )  # fmt: skip

    async def min_offset(self, mq: MessageQueue) -> int:
        return 0

    async def max_offset(self, mq: MessageQueue) -> int:
        return self.max[mq.queue_id]

    async def pull(self, mq: MessageQueue, offset: int, *, max_nums: int = 32,
                   max_bytes: int = 0) -> Any:  # fmt: skip
        got = [m for m in self.data[mq.queue_id] if m.queue_offset >= offset][:2]
        return SimpleNamespace(messages=got, next_begin_offset=offset + len(got))


async def test_read_back_drains_every_queue_and_reports_gaps() -> None:
    found = await read_back(FakeAdmin(), [T], batch=2)
    assert [(d.seq, d.queue_id, d.queue_offset) for d in found.delivered] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 0, 3), (4, 0, 4), (10, 1, 0),
    ]  # fmt: skip
    assert found.foreign == 1
    assert found.gaps == [f"{T}@{B}/1: nothing readable at 1 below max 3"]


async def test_read_back_waits_for_a_route_naming_a_master() -> None:
    # Right after a failover a NameServer may route the group with no master: reading then
    # would find no queue at all, which must never pass for "nothing was stored".
    admin = FakeAdmin(masterless_reads=3)
    found = await read_back(admin, [T], batch=2, route_wait_s=10)
    assert admin.route_reads == 4 and len(found.delivered) == 6
    assert found.gaps == [f"{T}@{B}/1: nothing readable at 1 below max 3"]


async def test_read_back_reports_a_group_that_never_gets_a_master() -> None:
    admin = FakeAdmin(masterless_reads=1000)
    found = await read_back(admin, [T], route_wait_s=0.3)
    assert found.delivered == [] and 2 <= admin.route_reads <= 4
    assert found.gaps == [f"{T}@{B}: no master in the route after 0.3 s, not read"]
    report = check(history_of(3), found)
    assert any("no master in the route" in p for p in report.problems())


def test_percentile_nearest_rank() -> None:
    assert math.isnan(percentile([], 99))
    assert percentile([5.0], 50) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
