"""Applying metadata records (records.py) to a replica's managers: pure logic, blocking.

:func:`apply_envelope` applies one envelope's changes in order to the topic table, the group
configs and the replicated service files, with the managers' journals bypassed (a replica logs
nothing). It runs on a worker thread (the topic and group files are fsynced once per envelope,
not once per change); what needs the event loop is returned in :class:`ApplyOutcome` for the
caller: the consumer offsets changes (:func:`apply_offsets`: the offsets table is only ever
touched on the loop, where its writer serializes it), retention, the store's queues of a
deleted topic, re-registration. A change that does not validate (a bad topic or group config,
a negative offset, a file name outside :data:`~orbitmq.broker.metadata.records.REPLICATED_FILES`)
is skipped and counted in ``bad``; the others are applied: one bad change never stops the log.

Snapshots: :class:`SnapshotTracker` remembers what a snapshot named between its begin and its
end; at the end, every topic, group config and offset group it did not name is deleted. A
replica that joined after the begin (no begin seen) deletes nothing: it only had upserts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from orbitmq.broker.group_config_manager import SubscriptionGroupManager
from orbitmq.broker.metadata.records import (
    REPLICATED_FILES,
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
from orbitmq.broker.topic_manager import TopicConfigManager, validate_topic_config
from orbitmq.common.errors import MessageIllegalError
from orbitmq.common.files import write_atomically
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.group_config import SubscriptionGroupConfig, validate_group_config

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ApplyTarget:
    """What a replica's records change."""

    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    config_dir: Path
    """Where the replicated service files go (``<store>/config``)."""


OffsetOp = tuple[str, str, list[tuple[str, int, int]]]
"""``(op, name, entries)``: ``set``/``replace`` a group's entries, ``del_topic``,
``del_group``, ``keep_groups`` (entries' topics are the groups a snapshot named)."""


@dataclass(slots=True)
class ApplyOutcome:
    applied: int = 0
    bad: int = 0
    topics_put: list[TopicConfig] = field(default_factory=list)
    topics_deleted: list[str] = field(default_factory=list)
    topics_unnamed: list[str] = field(default_factory=list)
    """Topics a snapshot did not name: their configs are gone, but their data (queues,
    offsets) only once the log is applied to its end and no later record put them back (a
    replay from the start meets old snapshots before the records that created later topics)."""
    files: list[str] = field(default_factory=list)
    offset_ops: list[OffsetOp] = field(default_factory=list)
    """For :func:`apply_offsets`, on the event loop: the offsets table is the loop's alone
    (its writer serializes it there), so a worker thread never touches it."""


@dataclass(slots=True)
class SnapshotTracker:
    snapshot_id: int | None = None
    topics: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    offset_groups: set[str] = field(default_factory=set)

    def begin(self, snapshot_id: int) -> None:
        self.snapshot_id = snapshot_id
        self.topics.clear()
        self.groups.clear()
        self.offset_groups.clear()


def _offsets_ok(change: Offsets) -> bool:
    return bool(change.group) and all(
        topic and queue_id >= 0 and offset >= 0 for topic, queue_id, offset in change.entries
    )


def apply_envelope(
    env: Envelope, target: ApplyTarget, snap: SnapshotTracker, out: ApplyOutcome
) -> None:
    """Apply ``env``'s changes in order (blocking). Results are added to ``out``."""
    topic_ops: list[tuple[str, TopicConfig | None]] = []
    group_ops: list[tuple[str, SubscriptionGroupConfig | None]] = []
    tracking = snap.snapshot_id is not None

    def flush() -> None:
        target.topics.replicate(topic_ops)
        target.groups.replicate(group_ops)
        topic_ops.clear()
        group_ops.clear()

    for change in env.changes:
        try:
            if isinstance(change, TopicPut):
                validate_topic_config(change.config)
                topic_ops.append((change.config.topic_name, change.config))
                out.topics_put.append(change.config)
                if tracking:
                    snap.topics.add(change.config.topic_name)
            elif isinstance(change, TopicDel):
                topic_ops.append((change.topic, None))
                out.offset_ops.append(("del_topic", change.topic, []))
                out.topics_deleted.append(change.topic)
            elif isinstance(change, GroupPut):
                validate_group_config(change.config)
                group_ops.append((change.config.group_name, change.config))
                if tracking:
                    snap.groups.add(change.config.group_name)
            elif isinstance(change, GroupDel):
                group_ops.append((change.group, None))
            elif isinstance(change, Offsets):
                if not _offsets_ok(change):
                    raise MessageIllegalError(f"bad offsets for group {change.group!r:.80}")
                op = "replace" if change.replace else "set"
                out.offset_ops.append((op, change.group, list(change.entries)))
                if tracking:
                    snap.offset_groups.add(change.group)
            elif isinstance(change, OffsetsDelGroup):
                out.offset_ops.append(("del_group", change.group, []))
            elif isinstance(change, FilePut):
                if change.name not in REPLICATED_FILES:
                    raise MessageIllegalError(f"file {change.name!r:.80} is not replicated")
                path = target.config_dir / change.name
                write_atomically(path, change.data)
                if change.name == "pop.secret":
                    os.chmod(path, 0o600)  # as the master keeps it
                out.files.append(change.name)
            elif isinstance(change, SnapshotBegin):
                flush()
                snap.begin(change.snapshot_id)
                tracking = True
            elif isinstance(change, SnapshotEnd):
                flush()
                if snap.snapshot_id == change.snapshot_id:
                    _end_snapshot(target, snap, out)
                snap.snapshot_id = None
                tracking = False
        except MessageIllegalError as exc:
            out.bad += 1
            log.warning("metadata change skipped (%s): %.200r", exc, change)
            continue
        out.applied += 1
    target.config_dir.mkdir(parents=True, exist_ok=True)
    flush()


def _end_snapshot(target: ApplyTarget, snap: SnapshotTracker, out: ApplyOutcome) -> None:
    """Delete what the snapshot did not name (the topics and groups applied before it)."""
    gone_topics = sorted(set(target.topics.topics) - snap.topics)
    target.topics.replicate([(t, None) for t in gone_topics])
    out.topics_unnamed += gone_topics
    target.groups.replicate([(g, None) for g in sorted(set(target.groups.groups) - snap.groups)])
    out.offset_ops.append(("keep_groups", "", [(g, 0, 0) for g in sorted(snap.offset_groups)]))
    if gone_topics:
        log.info("metadata snapshot: %d topics only this replica had are deleted: %s",
                 len(gone_topics), ", ".join(gone_topics[:20]))  # fmt: skip


def apply_offsets(ops: list[OffsetOp], offsets: ConsumerOffsetManager) -> None:
    """Apply the offset changes of :func:`apply_envelope`, in order, on the event loop (not
    journaled: a replica logs nothing)."""
    for op, name, entries in ops:
        if op == "set":
            for topic, queue_id, offset in entries:
                offsets.set(name, topic, queue_id, offset, journal=False)
        elif op == "replace":
            offsets.replace_group(name, entries)
        elif op == "del_topic":
            offsets.delete_topic(name)
        elif op == "del_group":
            offsets.delete_group(name, journal=False)
        elif op == "keep_groups":
            keep = {group for group, _q, _o in entries}
            for group in set(offsets.groups()) - keep:
                offsets.delete_group(group, journal=False)
