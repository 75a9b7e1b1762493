"""Applying metadata records to a replica's managers (orbitmq.broker.metadata.apply): every
change kind, order, snapshots, and bad changes skipped and counted while the rest apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orbitmq.broker.group_config_manager import SubscriptionGroupManager
from orbitmq.broker.metadata.apply import (
    ApplyOutcome,
    ApplyTarget,
    SnapshotTracker,
    apply_envelope,
    apply_offsets,
)
from orbitmq.broker.metadata.records import (
    FORMAT_VERSION,
    Change,
    Envelope,
    FilePut,
    GroupDel,
    GroupPut,
    Offsets,
    OffsetsDelGroup,
    SnapshotBegin,
    SnapshotEnd,
    TopicDel,
    TopicPut,
)
from orbitmq.broker.offset_manager import ConsumerOffsetManager
from orbitmq.broker.topic_manager import TopicConfigManager
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.group_config import SubscriptionGroupConfig


class RecordingJournal:
    """Fails the test if a replica's apply ever logs (only a master's own changes do)."""

    active = True

    def __init__(self) -> None:
        self.calls: list[object] = []

    def record(self, change: Change) -> None:
        self.calls.append(change)

    def record_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.calls.append((group, topic, queue_id, offset))

    async def sync(self) -> None:
        return None


@pytest.fixture
def target(tmp_path: Path) -> ApplyTarget:
    config = tmp_path / "config"
    t = ApplyTarget(
        TopicConfigManager(config / "topics.json"),
        SubscriptionGroupManager(config / "subscriptionGroup.json"),
        ConsumerOffsetManager(config / "consumerOffset.json"),
        config,
    )
    t.topics.load()
    return t


def env(*changes: Change) -> Envelope:
    return Envelope(v=FORMAT_VERSION, writer=0, epoch=1, changes=list(changes))


def topic(name: str, queues: int = 4) -> TopicPut:
    return TopicPut(
        config=TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues)
    )


def run(target: ApplyTarget, *changes: Change, snap: SnapshotTracker | None = None) -> ApplyOutcome:
    out = ApplyOutcome()
    apply_envelope(env(*changes), target, snap or SnapshotTracker(), out)
    apply_offsets(out.offset_ops, target.offsets)  # on the loop, in the service
    return out


def test_each_change_reaches_its_manager_and_file_without_being_logged(
    target: ApplyTarget,
) -> None:
    journal = RecordingJournal()
    target.topics.journal = target.groups.journal = target.offsets.journal = journal
    out = run(
        target,
        topic("A"),
        topic("B"),
        GroupPut(config=SubscriptionGroupConfig(group_name="G", retry_max_times=2)),
        Offsets(group="G", entries=[("A", 0, 5), ("A", 1, 7)]),
        FilePut(name="timer_checkpoint.json", data=b'{"x":1}'),
    )
    assert (out.applied, out.bad) == (5, 0)
    assert journal.calls == []
    assert set(target.topics.topics) == {"A", "B"}
    assert target.groups.get("G").retry_max_times == 2
    assert target.offsets.offsets("G") == {"A": {0: 5, 1: 7}}
    assert (target.config_dir / "timer_checkpoint.json").read_bytes() == b'{"x":1}'
    run(target, FilePut(name="pop.secret", data=b"s" * 32))
    assert (target.config_dir / "pop.secret").stat().st_mode & 0o777 == 0o600
    # The topic and group files hold it (a replica restarting reads them).
    again = TopicConfigManager(target.topics.path)
    again.load()
    assert set(again.topics) == {"A", "B"}
    groups = SubscriptionGroupManager(target.groups.path)
    groups.load()
    assert groups.find("G") is not None
    assert [c.topic_name for c in out.topics_put] == ["A", "B"]


def test_deletes_and_order_within_an_envelope(target: ApplyTarget) -> None:
    run(target, topic("A"), topic("B"), Offsets(group="G", entries=[("A", 0, 3), ("B", 0, 4)]))
    out = run(
        target,
        TopicDel(topic="A"),
        topic("A", queues=1),  # made again: after the delete, in order
        GroupPut(config=SubscriptionGroupConfig(group_name="H")),
        GroupDel(group="H"),
        Offsets(group="K", entries=[("B", 0, 1)]),
        OffsetsDelGroup(group="K"),
    )
    assert out.bad == 0
    assert target.topics.get("A") == TopicConfig(
        topic_name="A", read_queue_nums=1, write_queue_nums=1
    )
    assert out.topics_deleted == ["A"]
    assert target.offsets.offsets("G") == {"B": {0: 4}}  # the deleted topic's offsets went
    assert target.groups.find("H") is None
    assert "K" not in target.offsets.groups()


def test_replace_makes_a_groups_table_exactly_the_entries(target: ApplyTarget) -> None:
    run(target, topic("A"), Offsets(group="G", entries=[("A", 0, 3), ("A", 1, 4)]))
    run(target, Offsets(group="G", entries=[("A", 1, 9)], replace=True))
    assert target.offsets.offsets("G") == {"A": {1: 9}}


def test_bad_changes_are_skipped_and_counted_and_the_rest_applied(target: ApplyTarget) -> None:
    out = run(
        target,
        topic("bad topic name"),
        TopicPut(config=TopicConfig(topic_name="Q", read_queue_nums=0, write_queue_nums=1)),
        GroupPut(config=SubscriptionGroupConfig(group_name="G", retry_max_times=-5)),
        Offsets(group="G", entries=[("A", -1, 5)]),
        Offsets(group="", entries=[("A", 0, 5)]),
        FilePut(name="../../etc/passwd", data=b"x"),
        FilePut(name="topics.json", data=b"x"),
        topic("Good"),
    )
    assert (out.applied, out.bad) == (1, 7)
    assert set(target.topics.topics) == {"Good"}
    assert target.groups.find("G") is None
    assert target.offsets.groups() == []
    assert json.loads(target.topics.path.read_text())["topics"][0]["topic_name"] == "Good"
    assert not (target.config_dir.parent.parent / "etc").exists()


def test_a_snapshot_deletes_what_it_does_not_name(target: ApplyTarget) -> None:
    run(
        target,
        topic("Kept"),
        topic("OnlyHere"),
        GroupPut(config=SubscriptionGroupConfig(group_name="OnlyHereGroup")),
        Offsets(group="OnlyHereGroup", entries=[("Kept", 0, 1)]),
        Offsets(group="G", entries=[("Kept", 0, 1), ("Kept", 1, 2)]),
    )
    snap = SnapshotTracker()
    # Over two envelopes, as a large snapshot is.
    run(target, SnapshotBegin(snapshot_id=5), topic("Kept"), snap=snap)
    out = run(
        target,
        Offsets(group="G", entries=[("Kept", 1, 8)], replace=True),
        SnapshotEnd(snapshot_id=5),
        snap=snap,
    )
    assert set(target.topics.topics) == {"Kept"}
    assert out.topics_unnamed == ["OnlyHere"] and out.topics_deleted == []  # data: at the end
    assert target.groups.find("OnlyHereGroup") is None
    assert target.offsets.groups() == ["G"]
    assert target.offsets.offsets("G") == {"Kept": {1: 8}}


def test_a_snapshot_whose_begin_was_not_seen_deletes_nothing(target: ApplyTarget) -> None:
    run(target, topic("A"), topic("B"))
    run(target, topic("A"), SnapshotEnd(snapshot_id=9))  # joined after the begin
    assert set(target.topics.topics) == {"A", "B"}
    snap = SnapshotTracker()
    run(target, SnapshotBegin(snapshot_id=1), topic("A"), snap=snap)
    run(target, SnapshotEnd(snapshot_id=2), snap=snap)  # another snapshot's end
    assert set(target.topics.topics) == {"A", "B"}
