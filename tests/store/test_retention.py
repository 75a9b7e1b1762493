"""Retention: segment deletion by age and disk watermark, disk-full refusal, per-topic limits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orbitmq.common.errors import DiskFullError
from orbitmq.common.message import MessageBatch
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.store.retention import TopicRetention
from tests.store.conftest import small_config

HOUR_MS = 3_600_000
SEG = 64 * 1024 + 8 * 1024


class Env:
    """A store with a settable clock and disk-usage reading."""

    def __init__(self, path: Path, **overrides: object) -> None:
        self.now = int(time.time() * 1000)
        self.disk = 10.0
        self.store = MessageStore(
            small_config(path, mapped_file_size_commit_log=SEG, max_message_size=4096, **overrides),  # type: ignore[arg-type]
            clock=lambda: self.now,
            disk_usage=lambda: self.disk,
        )
        self.store.open()

    def fill(self, topic: str, n_batches: int, qid: int = 0) -> None:
        for i in range(n_batches):
            self.store.put(
                MessageBatch.of(topic, qid, [f"{topic}-{i}-{j}".encode() * 60 for j in range(8)])
            )
        assert self.store.wait_for_dispatch()

    def age_segments(self, hours: float) -> None:
        past = self.now / 1000 - hours * 3600
        for seg in self.store.commit_log.segments.segments:
            os.utime(seg.path, (past, past))


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = Env(
        tmp_path / "s", delete_when="0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16;17;18;19;20;21;22;23"
    )
    yield e
    e.store.close()


def test_expired_segments_are_deleted_but_never_the_active_one(env: Env) -> None:
    env.fill("T", 60)
    segs = len(env.store.commit_log.segments.segments)
    assert segs >= 3
    env.age_segments(73)
    env.store.retention.run()
    remaining = env.store.commit_log.segments.segments
    assert len(remaining) == 1  # only the segment being written survives
    lo = env.store.min_offset("T", 0)
    res = env.store.get_messages("T", 0, lo, max_count=1000)
    assert res.status is GetStatus.FOUND and not res.skipped
    assert env.store.get_messages("T", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
    env.fill("T", 1)  # writing goes on
    assert env.store.max_offset("T", 0) == 61 * 8


def test_unexpired_segments_stay_until_disk_forces(env: Env) -> None:
    env.fill("T", 40)
    n = len(env.store.commit_log.segments.segments)
    env.store.retention.run()
    assert len(env.store.commit_log.segments.segments) == n
    env.disk = 80.0  # above 75 %: only expired files may go, none is expired
    env.store.retention.run()
    assert len(env.store.commit_log.segments.segments) == n
    env.disk = 86.0  # above 85 %: the oldest go even unexpired
    env.store.retention.run()
    assert len(env.store.commit_log.segments.segments) < n


def test_deletion_waits_for_delete_when_hour(tmp_path: Path) -> None:
    e = Env(tmp_path / "s", delete_when="4")
    try:
        e.now = int(time.mktime((2026, 1, 1, 10, 0, 0, 0, 0, -1)) * 1000)
        e.fill("T", 40)
        n = len(e.store.commit_log.segments.segments)
        e.age_segments(100)
        e.store.retention.run()
        assert len(e.store.commit_log.segments.segments) == n  # 10:00 is not 04
        e.now = int(time.mktime((2026, 1, 2, 4, 30, 0, 0, 0, -1)) * 1000)
        e.store.retention.run()
        assert len(e.store.commit_log.segments.segments) == 1
    finally:
        e.store.close()


def test_disk_full_refuses_writes_and_recovers_by_itself(env: Env) -> None:
    env.fill("T", 2)
    env.disk = 91.0
    env.store.retention.run()
    with pytest.raises(DiskFullError) as info:
        env.store.append(MessageBatch.of("T", 0, [b"x"]))
    assert info.value.code == 14  # SERVICE_NOT_AVAILABLE, as RocketMQ answers
    env.disk = 50.0
    env.store.retention.run()
    assert env.store.put(MessageBatch.of("T", 0, [b"x"])).first_queue_offset == 16


def test_topic_ttl_hides_expired_messages_before_deletion(env: Env) -> None:
    env.fill("T", 3)
    env.fill("U", 3)
    env.now += 2 * HOUR_MS
    env.fill("T", 1)
    env.store.set_topic_retention("T", TopicRetention(ttl_ms=HOUR_MS))
    res = env.store.get_messages("T", 0, 0, max_count=1000)
    assert res.status is GetStatus.OFFSET_TOO_SMALL
    assert res.next_begin_offset == 24
    res = env.store.get_messages("T", 0, 24, max_count=1000)
    assert len(res.messages) == 8
    # Other topics keep everything.
    assert len(env.store.get_messages("U", 0, 0, max_count=1000).messages) == 24
    # Even without the floor refreshed, a read never serves an expired message.
    env.now += 2 * HOUR_MS
    res = env.store.get_messages("T", 0, 24, max_count=1000)
    assert res.messages == []
    env.store.set_topic_retention("T", None)
    assert len(env.store.get_messages("T", 0, 0, max_count=1000).messages) == 32


def test_topic_size_limit_keeps_newest_bytes(env: Env) -> None:
    env.fill("T", 10)
    size = len(env.store.get_messages("T", 0, 0, max_count=1).messages[0])
    env.store.set_topic_retention("T", TopicRetention(max_bytes=size * 20 + 5))
    assert env.store.min_offset("T", 0) == 80 - 20
    assert env.store.get_messages("T", 0, 59).status is GetStatus.OFFSET_TOO_SMALL
    assert len(env.store.get_messages("T", 0, 60, max_count=1000).messages) == 20


def test_retention_survives_reopen(tmp_path: Path) -> None:
    e = Env(
        tmp_path / "s", delete_when="0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16;17;18;19;20;21;22;23"
    )
    e.fill("T", 60)
    e.age_segments(100)
    e.store.retention.run()
    lo = e.store.min_offset("T", 0)
    assert lo > 0
    e.store.close()
    again = MessageStore(e.store.config)
    rep = again.open()
    try:
        assert rep.clean
        assert again.min_offset("T", 0) == lo
        res = again.get_messages("T", 0, lo, max_count=10_000)
        assert len(res.messages) == 480 - lo and not res.skipped
    finally:
        again.close()
