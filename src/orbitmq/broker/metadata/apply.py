"""Applying metadata records (records.py) to a replica's managers: pure logic, blocking.

:func:`apply_envelope` applies one envelope's changes in order to the topic table, the group
configs, the consumer offsets and the replicated service files, with the managers' journals
bypassed (a replica logs nothing). It runs on a worker thread (the topic and group files are
fsynced once per envelope, not once per change); what needs the event loop (retention, the
store's queues of a deleted topic, re-registration) is returned in :class:`ApplyOutcome` for
the caller. A change that does not validate (a bad topic or group config, a negative offset, a
file name outside :data:`~orbitmq.broker.metadata.records.REPLICATED_FILES`) is skipped and
counted in ``bad``; the others are applied: one bad change never stops the log.

Snapshots: :class:`SnapshotTracker` remembers what a snapshot named between its begin and its
end; at the end, every topic, group config and offset group it did not name is deleted. A
replica that joined after the begin (no begin seen) deletes nothing: it only had upserts.
"""

from __future__ import annotations

import logging
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


@dataclass(slots=True)
class ApplyOutcome:
    applied: int = 0
    bad: int = 0
    topics_put: list[TopicConfig] = field(default_factory=list)
    topics_deleted: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


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
                target.offsets.delete_topic(change.topic)
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
                if change.replace:
                    target.offsets.replace_group(change.group, change.entries)
                else:
                    for topic, queue_id, offset in change.entries:
                        target.offsets.set(change.group, topic, queue_id, offset, journal=False)
                if tracking:
                    snap.offset_groups.add(change.group)
            elif isinstance(change, OffsetsDelGroup):
                target.offsets.delete_group(change.group, journal=False)
            elif isinstance(change, FilePut):
                if change.name not in REPLICATED_FILES:
                    raise MessageIllegalError(f"file {change.name!r:.80} is not replicated")
                write_atomically(target.config_dir / change.name, change.data)
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
    for topic in gone_topics:
        target.offsets.delete_topic(topic)
    out.topics_deleted += gone_topics
    target.groups.replicate([(g, None) for g in sorted(set(target.groups.groups) - snap.groups)])
    for group in set(target.offsets.groups()) - snap.offset_groups:
        target.offsets.delete_group(group, journal=False)
    if gone_topics:
        log.info("metadata snapshot: %d topics only this replica had are deleted: %s",
                 len(gone_topics), ", ".join(gone_topics[:20]))  # fmt: skip
