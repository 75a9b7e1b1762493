"""MetadataJournal (a master's writer of the metadata log) against a fake append: what is
logged, in which order, coalesced how, and what a waiting request sees when it fails."""

from __future__ import annotations

import asyncio

import pytest

from orbitmq.broker.metadata.journal import MetadataJournal
from orbitmq.broker.metadata.records import (
    METADATA_TOPIC,
    Change,
    Offsets,
    SnapshotBegin,
    SnapshotEnd,
    TopicDel,
    TopicPut,
    decode_envelope,
)
from orbitmq.common.errors import FlushSlaveTimeoutError, SystemBusyError
from orbitmq.common.message import MessageBatch
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.store.commit_log import AppendResult


class FakeLog:
    def __init__(self) -> None:
        self.batches: list[MessageBatch] = []
        self.fail_next: list[Exception] = []
        self.replicated: list[int] = []
        self.end = 0

    async def append(self, batch: MessageBatch) -> AppendResult:
        if self.fail_next:
            raise self.fail_next.pop(0)
        self.batches.append(batch)
        self.end += 100
        return AppendResult(batch.topic, 0, 0, [self.end - 100], [100], self.end, 0)

    async def wait_replicated(self, end: int) -> None:
        self.replicated.append(end)

    def changes(self) -> list[Change]:
        return [c for b in self.batches for body in b.bodies for c in decode_envelope(body).changes]


def make(fake: FakeLog, interval_s: float = 30.0) -> MetadataJournal:
    j = MetadataJournal(7, fake.append, fake.wait_replicated, offset_interval_s=interval_s)
    j.set_snapshot_source(lambda: [TopicPut(config=TopicConfig(topic_name="Snap"))])
    return j


async def test_inactive_journal_logs_nothing() -> None:
    fake = FakeLog()
    j = make(fake)
    j.record(TopicDel(topic="T"))
    j.record_offset("G", "T", 0, 5)
    await j.sync()
    assert fake.batches == [] and j.idle


async def test_taking_office_logs_a_snapshot_then_changes_in_order() -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(4)
    [snap] = fake.batches
    assert snap.topic == METADATA_TOPIC and snap.queue_id == 0
    body = decode_envelope(snap.bodies[0])
    assert (body.writer, body.epoch) == (7, 4)
    kinds = [type(c) for c in body.changes]
    assert kinds == [SnapshotBegin, TopicPut, SnapshotEnd]
    j.record_offset("G", "T", 0, 1)
    j.record_offset("G", "T", 0, 2)  # the same queue again: only the last value
    j.record_offset("G", "T", 1, 3)
    j.record(TopicDel(topic="T"))  # pending offsets go first, then the delete
    j.record_offset("G", "U", 0, 9)
    await j.sync()
    assert j.idle
    changes = fake.changes()[3:]
    assert changes[0] == Offsets(group="G", entries=[("T", 0, 2), ("T", 1, 3)])
    assert changes[1] == TopicDel(topic="T")
    assert changes[2] == Offsets(group="G", entries=[("U", 0, 9)])
    assert fake.replicated[-1] == fake.end  # waited for the slaves
    await j.deactivate()


async def test_offsets_without_a_waiter_are_logged_on_the_interval() -> None:
    fake = FakeLog()
    j = make(fake, interval_s=0.05)
    await j.activate(1)
    for i in range(100):
        j.record_offset("G", "T", 0, i)
    async with asyncio.timeout(5):
        while not j.idle:
            await asyncio.sleep(0.01)
    assert fake.changes()[-1] == Offsets(group="G", entries=[("T", 0, 99)])
    assert len(fake.batches) == 2  # the snapshot and one coalesced record
    await j.deactivate()


async def test_concurrent_waiters_share_one_append() -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(1)
    for i in range(20):
        j.record(TopicPut(config=TopicConfig(topic_name=f"T{i}")))
    await asyncio.gather(*(j.sync() for _ in range(20)))
    assert len(fake.batches) == 2
    await j.deactivate()


@pytest.mark.parametrize("error", [SystemBusyError("full"), FlushSlaveTimeoutError("slow")])
async def test_a_failed_append_fails_the_waiter_and_is_tried_again(error: Exception) -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(1)
    fake.fail_next.append(error)
    j.record(TopicDel(topic="T"))
    with pytest.raises(type(error)):
        await j.sync()
    async with asyncio.timeout(5):  # retried after a backoff, without another request
        while TopicDel(topic="T") not in fake.changes():
            await asyncio.sleep(0.02)
    await j.sync()
    assert j.idle
    await j.deactivate()


async def test_deactivating_drops_what_is_pending_and_stops_logging() -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(1)
    j.record_offset("G", "T", 0, 5)
    await j.deactivate()
    assert not j.active and j.idle
    j.record(TopicDel(topic="T"))
    await j.sync()
    assert TopicDel(topic="T") not in fake.changes()
    assert not any(isinstance(c, Offsets) for c in fake.changes())


async def test_close_logs_what_is_pending() -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(1)
    j.record_offset("G", "T", 0, 5)
    await j.close()
    assert fake.changes()[-1] == Offsets(group="G", entries=[("T", 0, 5)])


async def test_taking_office_again_keeps_one_writer_and_logs_a_new_snapshot() -> None:
    fake = FakeLog()
    j = make(fake)
    await j.activate(1)
    await j.activate(2)
    j.record(TopicDel(topic="T"))
    await j.sync()
    epochs = [decode_envelope(b).epoch for batch in fake.batches for b in batch.bodies]
    assert epochs == [1, 2, 2]
    assert sum(isinstance(c, SnapshotBegin) for c in fake.changes()) == 2
    await j.deactivate()
    await j.activate(3)  # after a demotion: writes again
    assert decode_envelope(fake.batches[-1].bodies[0]).epoch == 3
    await j.deactivate()
