"""ConsumeQueue: the per-(topic, queue) index into the CommitLog.

Each entry is 20 bytes, big-endian, and entry n describes the message with queue offset n::

    0  8  commitlog physical offset   i64
    8  4  record size                 i32
   12  8  tag hash                    i64  (CRC32C of the tag, 0 for none)

Files hold ``entries_per_file`` entries (RocketMQ: 300,000 = 6,000,000 bytes) and are named by
their 20-digit start *byte* offset, as RocketMQ names them. They are sparse (sized, not
preallocated): disk use grows with the entries written, not with the number of queues. Lookup by queue offset is O(1):
file = offset // entries_per_file, position = offset % entries_per_file * 20.

ConsumeQueues are derived data: the dispatcher writes them from the CommitLog, recovery cuts
their tail and lets the dispatcher write it again. A zero entry (size 0) is "no entry".
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from pathlib import Path

import numpy as np

from orbitmq.store.layout import fsync_dir, offset_name, parse_offset_name, topic_dir
from orbitmq.store.segment import FileOps, OpenFiles, Segment, SegmentQueue

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20
ENTRY_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tag", ">i8")])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE


class ConsumeQueue:
    """Entries of one (topic, queue_id). Written by the dispatcher thread only."""

    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        entries_per_file: int,
        fs: FileOps,
        dir_syncs: set[Path] | None = None,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_file = entries_per_file
        self.file_size = entries_per_file * ENTRY_SIZE
        # Sparse: a queue with one entry takes one block, not 5.7 MiB (pwrite, never the map,
        # writes it, so a hole on a full disk is an ENOSPC error, not a SIGBUS).
        self.files = SegmentQueue(
            topic_dir(root, topic) / str(queue_id),
            self.file_size,
            fs,
            reserve=False,
            dir_syncs=dir_syncs,
            open_files=open_files,
        )
        self.max_offset = 0  # next queue offset to be written
        self.min_offset = 0  # first queue offset still served
        self.dirty: set[Segment] = set()
        self._dirty_lock = threading.Lock()

    # ------------------------------------------------------------- loading

    def load(self) -> list[str]:
        problems = self._fill_gaps()
        problems += self.files.load()
        self.min_offset = self.files.min_offset // ENTRY_SIZE
        self.max_offset = self._scan_end(limit_phy=None)
        return problems

    def _fill_gaps(self) -> list[str]:
        """Recreate, empty, a file missing between others (lost in a power cut or deleted).

        Without it the files before the gap would be set aside and their entries lost. An
        empty file's entries read as damaged (skipped, reported) unless recovery rewrites them.
        """
        directory = self.files.directory
        if not directory.is_dir():
            return []
        names = os.listdir(directory)
        starts = {s for s in map(parse_offset_name, names) if s is not None}
        starts = {s for s in starts if s % self.file_size == 0}
        problems: list[str] = []
        if not starts:
            return problems
        for start in range(min(starts), max(starts), self.file_size):
            if start not in starts:
                fd = os.open(directory / offset_name(start), os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    os.ftruncate(fd, self.file_size)
                finally:
                    os.close(fd)
                problems.append(f"{offset_name(start)} was missing: recreated empty")
        if problems:
            fsync_dir(directory)
        return problems

    def _entries(self, seg: Segment) -> np.ndarray:
        return np.frombuffer(seg.view, dtype=ENTRY_DTYPE)

    def _scan_end(self, limit_phy: int | None) -> int:
        """The queue offset after the last entry that is not all zeros (and, with
        ``limit_phy``, points below it).

        Entries are written in order, so unwritten ones are a zero tail. A damaged entry before
        the end (zeroed, or garbage) stays inside the queue: reads skip and report it, and the
        offsets after it are neither lost nor handed out again.
        """
        for seg in reversed(self.files.segments):
            arr = self._entries(seg)
            present = (arr["size"] != 0) | (arr["phy"] != 0) | (arr["tag"] != 0)
            if limit_phy is not None:
                present &= arr["phy"] < limit_phy
            hits = np.flatnonzero(present)
            n = int(hits[-1]) + 1 if len(hits) else 0
            if n > 0 or seg is self.files.segments[0]:
                return seg.start // ENTRY_SIZE + n
        return self.min_offset

    def truncate_from_phy(self, phy_offset: int) -> int:
        """Drop entries pointing at or past ``phy_offset``; zero them on disk. Returns count."""
        old = self.max_offset
        segs = self.files.segments
        if phy_offset <= 0 and segs and segs[0].start > 0:
            # Nothing of the CommitLog survived, so nothing of this queue did either; its first
            # file was lost too (a power cut before its name was durable) and a later one says
            # the queue starts above 0. It never held a durable message: start over at 0, as
            # the CommitLog does, instead of serving from a phantom first offset.
            for path in self.files.drop_after(-1):
                log.info("recovery: removed %s", path)
            with self._dirty_lock:
                self.dirty.clear()
            self.min_offset = self.max_offset = 0
            return old
        end = self._scan_end(limit_phy=phy_offset)
        self._cut_at(end)
        return max(0, old - end)

    def _cut_at(self, queue_offset: int) -> None:
        byte_at = queue_offset * ENTRY_SIZE
        for path in self.files.drop_after(byte_at):
            log.info("recovery: removed %s", path)
        with self._dirty_lock:
            self.dirty &= set(self.files.segments)
        seg = self.files.find(byte_at)
        if seg is not None:
            seg.zero_from(byte_at - seg.start)
            with self._dirty_lock:  # the next checkpoint must make the cut durable
                self.dirty.add(seg)
        self.max_offset = max(queue_offset, self.min_offset)

    # ------------------------------------------------------------- writes

    def put(self, first_queue_offset: int, entries: bytes) -> None:
        """Write packed entries starting at ``first_queue_offset`` (one pwrite per file)."""
        if first_queue_offset != self.max_offset:
            if first_queue_offset > self.max_offset:
                log.warning(
                    "%s/%d: gap in queue offsets, %d..%d written as empty",
                    self.topic, self.queue_id, self.max_offset, first_queue_offset,
                )  # fmt: skip
            segs = self.files.segments
            if segs and first_queue_offset * ENTRY_SIZE < segs[0].start:
                # Earlier files were lost in a crash that kept later ones: those hold only
                # entries after this one, which this (recovery) dispatch rewrites. Start over.
                log.warning(
                    "%s/%d: rewriting from %d, below the first file: dropping the files",
                    self.topic, self.queue_id, first_queue_offset,
                )  # fmt: skip
                self.files.drop_after(-1)
                self.max_offset = first_queue_offset
                with self._dirty_lock:
                    self.dirty.clear()
            if not self.files.segments or (
                first_queue_offset > self.max_offset and self.min_offset >= self.max_offset
            ):
                # Nothing served below: start there (retention deleted the records of the
                # offsets between, before they were dispatched), not at a run of empty entries.
                self.min_offset = first_queue_offset
        byte_at = first_queue_offset * ENTRY_SIZE
        view = memoryview(entries)
        while view:
            seg_start = byte_at - byte_at % self.file_size
            seg = self.files.find(seg_start)
            if seg is None:
                seg = self.files.create(seg_start)
            n = min(len(view), seg.end - byte_at)
            seg.write(byte_at - seg.start, view[:n])
            with self._dirty_lock:
                self.dirty.add(seg)
            view = view[n:]
            byte_at += n
        self.max_offset = max(self.max_offset, byte_at // ENTRY_SIZE)

    def flush(self) -> None:
        with self._dirty_lock:
            dirty, self.dirty = self.dirty, set()
        for seg in dirty:
            seg.flush()

    # ------------------------------------------------------------- reads

    def entries(self, queue_offset: int, max_count: int) -> memoryview:
        """Up to ``max_count`` packed entries from ``queue_offset``, within one file, no copy."""
        end = min(queue_offset + max_count, self.max_offset)
        if queue_offset < self.min_offset or queue_offset >= end:
            return memoryview(b"")
        byte_at = queue_offset * ENTRY_SIZE
        seg = self.files.find(byte_at - byte_at % self.file_size)
        if seg is None:
            return memoryview(b"")
        lo = byte_at - seg.start
        hi = min(end * ENTRY_SIZE - seg.start, seg.size)
        return seg.view[lo:hi]

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        raw = self.entries(queue_offset, 1)
        if len(raw) < ENTRY_SIZE:
            return None
        phy, size, tag = ENTRY.unpack(raw)
        return (phy, size, tag) if size > 0 else None

    # ------------------------------------------------------------- retention

    def correct_min_offset(self, min_phy_offset: int) -> int:
        """Drop files wholly below ``min_phy_offset`` and move ``min_offset`` to the first entry
        whose message still exists. Returns the new min offset."""
        while len(self.files.segments) > 1:
            arr = self._entries(self.files.segments[0])
            sane = (arr["size"] > 0) & (arr["phy"] >= 0)  # a damaged entry proves nothing
            ends = arr["phy"][sane].astype(np.int64) + arr["size"][sane]
            if not len(ends) or int(ends.max()) > min_phy_offset:
                break
            with self._dirty_lock:
                self.dirty.discard(self.files.segments[0])
            log.info("retention: removed %s", self.files.drop_first())
        if not self.files.segments:
            return self.min_offset
        seg = self.files.segments[0]
        arr = self._entries(seg)
        first = seg.start // ENTRY_SIZE
        stop = min(len(arr), max(0, self.max_offset - first))
        phy = arr["phy"][:stop].astype(np.int64)
        # The leading run of entries whose message is gone (a damaged entry ends the run).
        gone = (phy >= 0) & (phy < min_phy_offset) & (arr["size"][:stop] > 0)
        idx = int(np.argmin(gone)) if not gone.all() else len(gone)
        self.min_offset = max(self.min_offset, first + idx)
        return self.min_offset

    def destroy(self) -> None:
        segs, self.files.segments = self.files.segments, []
        for seg in segs:
            seg.destroy()
        with contextlib.suppress(OSError):
            os.rmdir(self.files.directory)

    def close(self) -> None:
        self.files.close()

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic}/{self.queue_id} [{self.min_offset}, {self.max_offset}))"


def file_name_for(queue_offset: int, entries_per_file: int) -> str:
    start = queue_offset - queue_offset % entries_per_file
    return offset_name(start * ENTRY_SIZE)


class ConsumeQueueTable:
    """Every ConsumeQueue of a store, created on first use."""

    def __init__(
        self, root: Path, entries_per_file: int, fs: FileOps, max_open_files: int = 4096
    ) -> None:
        self.root = root
        self.entries_per_file = entries_per_file
        self.fs = fs
        self.open_files = OpenFiles(max_open_files)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Directories whose new entries (queue directories, files) ``flush`` makes durable:
        # three directory fsyncs per new queue made spreading messages over 80,000 queues
        # 25 times slower to dispatch, and nothing needs them before the checkpoint does.
        self._dir_syncs: set[Path] = set()
        self._dir_lock = threading.Lock()

    def load(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        problems: list[str] = []
        for topic in sorted(os.listdir(self.root)):
            tdir = self.root / topic
            if not tdir.is_dir():
                continue
            for qdir in sorted(os.listdir(tdir)):
                if not qdir.isdigit():
                    continue
                cq = ConsumeQueue(
                    self.root, topic, int(qdir), self.entries_per_file, self.fs, self._dir_syncs,
                    self.open_files,
                )  # fmt: skip
                problems += [f"{topic}/{qdir}: {p}" for p in cq.load()]
                self.queues[(topic, int(qdir))] = cq
        return problems

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(
                self.root, topic, queue_id, self.entries_per_file, self.fs, self._dir_syncs,
                self.open_files,
            )  # fmt: skip
            qdir = cq.files.directory
            if not qdir.is_dir():
                qdir.mkdir(parents=True, exist_ok=True)
                # the new directories' names are made durable by the next flush
                with self._dir_lock:
                    self._dir_syncs.update((qdir.parent, self.root))
            self.queues[(topic, queue_id)] = cq
        return cq

    def last_record_offset(self, log_end: int) -> int:
        """Start of the newest record (the one ending at ``log_end`` if a queue holds it), from
        the queues' last entries; -1 if they are empty."""
        best = -1
        for cq in self.queues.values():
            if cq.max_offset > cq.min_offset:
                entry = cq.entry(cq.max_offset - 1)
                if entry is not None and entry[0] + entry[1] == log_end:
                    return entry[0]
                if entry is not None:
                    best = max(best, entry[0])
        return best

    def flush(self) -> None:
        """fsync every changed file, then the directories that gained entries (files first:
        a name made durable before its data would show an empty file after a power cut,
        which recovery repairs anyway, but never the other way round)."""
        for cq in list(self.queues.values()):
            cq.flush()
        with self._dir_lock:  # the dispatcher adds while the checkpoint thread drains
            todo = sorted(self._dir_syncs, key=lambda p: -len(p.parts))
            self._dir_syncs.difference_update(todo)
        # deepest first: a queue directory's name lives in its topic directory
        for i, directory in enumerate(todo):
            try:
                if directory.is_dir():
                    fsync_dir(directory)
            except BaseException:
                with self._dir_lock:
                    self._dir_syncs.update(todo[i:])
                raise

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.queues.clear()
