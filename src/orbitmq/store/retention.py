"""Retention: deleting old CommitLog segments, watching the disk, per-topic TTL and size limits.

Broker-wide rules, as RocketMQ's:
- a segment whose last write is older than ``file_reserved_time_hours`` is deleted at the hours
  in ``delete_when``, or at any hour once disk use passes ``disk_max_used_space_ratio``;
- above ``disk_space_clean_forcibly_ratio`` the oldest segments go even if not expired (100
  turns forced deletion off: nothing unexpired is ever deleted, writes are refused instead);
- above ``disk_space_warning_level_ratio`` appends fail with DiskFullError; the flag clears by
  itself on the next run that finds the disk below the ratio (the store asks for a run at
  most once a second while it refuses, so writes resume about a second after space returns);
- a new CommitLog segment that cannot be created (ENOSPC below the ratios, on a small disk)
  sets the same flag and forces deletion of the oldest segments (unless
  ``disk_space_clean_forcibly_ratio`` is 100: forced deletion off); it clears only once a
  whole segment fits in the free space, so the store does not flip back to accepting and
  failing every send;
- the segment being written is never deleted, nor one not yet fully dispatched, unless the
  disk is past the forced ratio while the dispatcher is failing (a full disk must not wedge
  the broker: the dispatcher then skips what was deleted); queue min offsets are moved past
  deleted data before the file goes, and consumers below the new minimum continue from it.

Per-topic retention (an OrbitMQ extension RocketMQ lacks outside tiered storage):
``TopicRetention(ttl_ms, max_bytes)``. Messages older than the TTL are not served from the
moment they expire (reads compare store timestamps), long before their segment is deleted.
``max_bytes`` bounds each queue of the topic: older messages beyond the newest ``max_bytes``
of record bytes are no longer served (evaluated on every retention run).

Each run also measures the store's real disk use, ``disk_used_bytes``: the blocks its files
occupy (``st_blocks * 512`` summed over the store directory), which is what a sparse
ConsumeQueue or IndexFile really costs, unlike its apparent size. The run is on the store's
retention thread, never the event loop, and readers (runtime info, ``orbitmq cluster list``)
get the value cached by the last run.

The service takes the parts it works on (CommitLog, ConsumeQueues, IndexFiles, the dispatcher
whose progress bounds what may go), a clock and the store root, not the store itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from orbitmq.store.commit_log import CommitLog
from orbitmq.store.config import StoreConfig
from orbitmq.store.consume_queue import ENTRY_DTYPE, ENTRY_SIZE, ConsumeQueue, ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.index_service import IndexService
from orbitmq.store.reader import offset_for_timestamp

log = logging.getLogger(__name__)


class TierGate(Protocol):
    def covers(self, seg_end: int) -> bool:
        """Every queue entry below ``seg_end`` is in the tier (or gaps are allowed)."""
        ...


@dataclass(frozen=True, slots=True)
class TopicRetention:
    ttl_ms: int | None = None
    max_bytes: int | None = None


class RetentionService:
    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService | None,
        dispatcher: Dispatcher,
        clock: Callable[[], int],
        root: Path,
        disk_usage: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self.clock = clock
        self.root = root
        self._disk_usage = disk_usage or self._fs_usage
        self.disk_ratio = 0.0
        self.disk_used_bytes = 0
        """Blocks the store's files occupy, in bytes, as of the last run."""
        self.disk_full = False
        self.topics: dict[str, TopicRetention] = {}
        self.floors: dict[tuple[str, int], int] = {}
        self.deleted_segments = 0
        self.no_space: str | None = None  # a segment could not be created: why
        self.refresh_wanted = False  # someone was refused: the next run should come soon
        self.tier: TierGate | None = None  # set by the store when a tier is on

    def _fs_usage(self) -> float:
        usage = shutil.disk_usage(self.root)
        return 100.0 * usage.used / usage.total if usage.total else 0.0

    def note_no_space(self, cause: str) -> None:
        """An append could not create its segment (ENOSPC): refuse writes and force deletion
        until a segment fits again."""
        if self.no_space is None:
            log.error("%s: refusing writes and deleting the oldest segments until one fits",
                      cause)  # fmt: skip
        self.no_space = cause
        self.disk_full = True
        self.refresh_wanted = True

    def recheck(self) -> bool:
        """Re-evaluate the refusal now, without deleting anything; True when writes may go."""
        cfg = self.config
        ratio = self.disk_ratio = self._disk_usage()
        if self.no_space is not None and self._segment_fits():
            self.no_space = None
        full = ratio >= cfg.disk_space_warning_level_ratio or self.no_space is not None
        if self.disk_full and not full:
            log.warning("disk use %.1f%%: accepting writes again", ratio)
        self.disk_full = full
        return not full

    def _segment_fits(self) -> bool:
        try:
            return shutil.disk_usage(self.root).free >= self.commit_log.segments.segment_size
        except OSError:
            return False

    # ----------------------------------------------------------- per topic

    def set_topic(self, topic: str, retention: TopicRetention | None) -> None:
        if retention is None or (retention.ttl_ms is None and retention.max_bytes is None):
            self.topics.pop(topic, None)
            for key in [k for k in self.floors if k[0] == topic]:
                del self.floors[key]
        else:
            self.topics[topic] = retention
            self._update_floors(topic)

    def ttl_cut(self, topic: str) -> int:
        """Store timestamps below this are expired for ``topic`` (0: no TTL)."""
        policy = self.topics.get(topic)
        if policy is None or policy.ttl_ms is None:
            return 0
        return self.clock() - policy.ttl_ms

    def floor(self, topic: str, queue_id: int) -> int:
        return self.floors.get((topic, queue_id), 0)

    def _update_floors(self, topic: str) -> None:
        policy = self.topics.get(topic)
        if policy is None:
            return
        for (t, qid), cq in list(self.queues.queues.items()):
            if t != topic:
                continue
            floor = cq.min_offset
            if policy.ttl_ms is not None:
                lo = max(cq.min_offset, self.floor(t, qid))
                floor = max(floor, offset_for_timestamp(self.commit_log, cq, lo, self.ttl_cut(t)))
            if policy.max_bytes is not None:
                floor = max(floor, _size_floor(cq, policy.max_bytes))
            self.floors[(t, qid)] = floor

    # ----------------------------------------------------------- the run

    def run(self, startup: bool = False) -> None:
        ratio = self._disk_usage()
        self.disk_ratio = ratio
        cfg = self.config
        hour_ok = time.localtime(self.clock() / 1000).tm_hour in cfg.delete_hours()
        self.refresh_wanted = False
        # No room for a segment forces deletion too; a forced ratio of 100 turns it off (a
        # full disk is exactly 100 %: it would force anyway).
        force = cfg.disk_space_clean_forcibly_ratio < 100 and (
            ratio >= cfg.disk_space_clean_forcibly_ratio or self.no_space is not None
        )
        tiered = self.tier is not None and cfg.tier_local_retention_ms >= 0
        if not startup and (hour_ok or ratio >= cfg.disk_max_used_space_ratio or force or tiered):
            self._delete_segments(force)
            ratio = self.disk_ratio = self._disk_usage()
        if self.no_space is not None and self._segment_fits():
            self.no_space = None
        was_full = self.disk_full
        self.disk_full = ratio >= cfg.disk_space_warning_level_ratio or self.no_space is not None
        if self.disk_full and not was_full:
            log.error("disk use %.1f%%: refusing writes until it falls below %d%%",
                      ratio, cfg.disk_space_warning_level_ratio)  # fmt: skip
        elif was_full and not self.disk_full:
            log.warning("disk use %.1f%%: accepting writes again", ratio)
        for topic in list(self.topics):
            self._update_floors(topic)
        self.disk_used_bytes = store_disk_use(self.root)

    def _delete_segments(self, force: bool) -> None:
        cl = self.commit_log
        reserved_ms = self.config.file_reserved_time_hours * 3600 * 1000
        if self.tier is not None and self.config.tier_local_retention_ms >= 0:
            reserved_ms = self.config.tier_local_retention_ms  # the tier keeps the rest
        now = self.clock()
        deleted = 0
        while deleted < self.config.delete_commit_log_files_max_per_run:
            segs = cl.segments.segments
            if len(segs) < 2:
                break  # never the segment being written
            first = segs[0]
            if first.end > self.dispatcher.reput_offset and not (
                force and self.dispatcher.failure is not None
            ):
                break  # not fully dispatched yet (a failing dispatcher cannot hold the disk)
            if self.tier is not None and not self.tier.covers(first.end):
                break  # Kafka's rule: never delete what the tier does not hold yet
            age_ms = now - os.path.getmtime(first.path) * 1000
            if age_ms < reserved_ms and not force:
                break
            new_min = segs[1].start
            for cq in list(self.queues.queues.values()):
                cq.correct_min_offset(new_min)
            path = cl.segments.drop_first()
            deleted += 1
            self.deleted_segments += 1
            log.info(
                "retention: deleted %s (%s, age %.1f h)",
                path.name, "forced by disk use" if force and age_ms < reserved_ms else "expired",
                age_ms / 3_600_000,
            )  # fmt: skip
            if (
                force
                and self._disk_usage() < self.config.disk_space_clean_forcibly_ratio
                and (self.no_space is None or self._segment_fits())
            ):
                force = False
        if deleted:
            for cq in list(self.queues.queues.values()):
                cq.correct_min_offset(cl.min_offset)
            if self.index is not None:
                self.index.delete_below(cl.min_offset)


def store_disk_use(root: Path) -> int:
    """Bytes the files under ``root`` occupy on disk (allocated blocks, so a sparse file counts
    only what was written). Files that vanish meanwhile (a segment deleted) are skipped."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    return total


def _size_floor(cq: ConsumeQueue, max_bytes: int) -> int:
    """First queue offset from which the queue's newest records total at most ``max_bytes``."""
    total = 0
    for seg in reversed(cq.files.segments):
        first = seg.start // ENTRY_SIZE
        arr = np.frombuffer(seg.view, dtype=ENTRY_DTYPE)
        n = max(0, min(len(arr), cq.max_offset - first))
        lo = max(0, cq.min_offset - first)
        if n <= lo:
            continue
        sizes = arr["size"][lo:n].astype(np.int64)[::-1]
        running = np.cumsum(sizes) + total
        over = np.nonzero(running > max_bytes)[0]
        if len(over):
            return first + n - int(over[0])
        total = int(running[-1])
    return cq.min_offset
