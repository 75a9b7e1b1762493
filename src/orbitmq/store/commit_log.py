"""The CommitLog: one append-only log for every topic, the store's only source of truth.

Appends are per batch: one lock, one encode pass, one ``pwrite`` per segment touched. Queue
offsets are assigned here, under the same lock, from the topic-queue table (RocketMQ keeps it
in the CommitLog for the same reason: the offset must be in the record before it is written).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import StoreClosedError, StoreIOError
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import (
    MIN_BLANK,
    VECTOR_MIN_BATCH,
    BatchHeader,
    encode_batch,
    encode_blank,
    pack_host,
    record_overhead,
)
from orbitmq.store.segment import FileOps, Segment, SegmentQueue, io_error

SEAL_OVERHEAD = 24
"""Bytes a sealed record has more than its plaintext (orbitmq.store.sealing)."""
SYSFLAG_SEALED = 0x10000
"""SYS_FLAG bit of a sealed (encrypted) record (orbitmq.store.sealing)."""


class Sealer(Protocol):
    """What the append path needs of :class:`orbitmq.store.sealing.RecordSealer`."""

    def seal(
        self, head: BatchHeader, seg_start: int, bodies: Sequence[bytes], props: Sequence[bytes]
    ) -> tuple[list[bytes], list[bytes]]: ...


@dataclass(slots=True)
class AppendResult:
    """Where a batch landed. Record i is at ``physical_offsets[i]`` with queue offset
    ``first_queue_offset + i``; ``end_offset`` is the log's end after the batch."""

    topic: str
    queue_id: int
    first_queue_offset: int
    physical_offsets: list[int]
    sizes: list[int]
    end_offset: int
    store_timestamp_ms: int

    @property
    def count(self) -> int:
        return len(self.sizes)


class CommitLog:
    """Segments of ``segment_size`` bytes under ``directory``.

    ``max_offset`` is the end of the last complete record (published after the write, so a
    reader never sees half a batch); ``flushed_offset`` is how far fsync has reached.
    Thread-safety: ``append`` is serialised by an internal lock; everything else may be called
    from any thread.
    """

    def __init__(
        self, directory: Path, segment_size: int, fs: FileOps, clock: Callable[[], int] = now_ms
    ) -> None:
        self.segments = SegmentQueue(directory, segment_size, fs)
        self.segment_size = segment_size
        self.clock = clock
        self.lock = threading.Lock()
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.max_offset = 0
        self.flushed_offset = 0
        self.fenced: str | None = None
        self.confirmed: int | None = None
        """Replication's confirm offset; None (a broker without replicas): the max offset."""
        self._flush_lock = threading.Lock()
        self.sealer: Sealer | None = None
        """Encryption at rest (:mod:`orbitmq.store.sealing`); set by the store, None: off."""

    @property
    def confirm_offset(self) -> int:
        """How far records may be served and dispatched: the confirm offset, never past the
        end (Kafka's high watermark)."""
        confirmed, end = self.confirmed, self.max_offset
        return end if confirmed is None or confirmed > end else confirmed

    # ---------------------------------------------------------------- append

    def append(self, batch: MessageBatch, store_host: bytes = b"\0" * 8) -> AppendResult:
        """Append ``batch`` (validated by the caller): its records share one
        :class:`BatchHeader`, completed here under the lock with the queue offset, the position
        and the store timestamp."""
        topic, queue_id = batch.topic, batch.queue_id
        bodies, properties = batch.bodies, batch.properties
        topic_bytes = topic.encode()
        born_host = pack_host(batch.born_host)
        n = len(bodies)
        overhead = record_overhead(len(topic_bytes))
        sealer = self.sealer
        if sealer is not None:
            overhead += SEAL_OVERHEAD
        body_lens: np.ndarray | None = None
        prop_lens: np.ndarray | None = None
        if n >= VECTOR_MIN_BATCH:
            body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
            prop_lens = np.fromiter(map(len, properties), dtype=np.int64, count=n)
            sizes: list[int] = (body_lens + prop_lens + overhead).tolist()
        else:  # numpy's fixed cost outweighs a few records
            sizes = [overhead + len(b) + len(p) for b, p in zip(bodies, properties, strict=True)]
        ends = list(itertools.accumulate(sizes))
        batch_bytes = ends[-1]
        with self.lock:
            if self.fenced:
                raise StoreClosedError(f"writes fenced after an I/O failure: {self.fenced}")
            key = (topic, queue_id)
            first_qoff = self.queue_offsets.get(key, 0)
            store_ts = self.clock()
            start = self.max_offset
            room = self.segment_size - start % self.segment_size
            if batch_bytes == room or batch_bytes + MIN_BLANK <= room:
                plan = [(start - start % self.segment_size, 0, n, start, 0)]  # the usual case
            else:  # a record never straddles a segment: split where one would
                plan = self._plan_locked(start, sizes)
            writes: list[tuple[Segment, int, bytearray]] = []
            head = BatchHeader(
                topic_bytes, queue_id, first_qoff, start, batch.flag, batch.sys_flag,
                batch.born_timestamp_ms, born_host, store_ts, store_host, batch.reconsume_times,
                batch.prepared_transaction_offset,
            )  # fmt: skip
            qoff = first_qoff
            for seg_start, lo, hi, pos, filler in plan:
                seg = self.segments.find(seg_start) or self.segments.create(seg_start)
                buf = bytearray()
                if hi > lo:
                    head.first_queue_offset = qoff
                    head.first_physical_offset = pos
                    part_b, part_p = bodies[lo:hi], properties[lo:hi]
                    if sealer is not None:
                        part_b, part_p = sealer.seal(head, seg.start, part_b, part_p)
                    buf = encode_batch(
                        head,
                        part_b,
                        part_p,
                        None if body_lens is None or sealer else body_lens[lo:hi],
                        None if prop_lens is None or sealer else prop_lens[lo:hi],
                    )
                    qoff += hi - lo
                if filler:
                    buf += encode_blank(filler)
                writes.append((seg, pos - seg.start, buf))
            _last_seg_start, last_lo, _hi, last_pos, _f = plan[-1]
            end = last_pos + batch_bytes - (ends[last_lo - 1] if last_lo else 0)
            for i, (seg, at, buf) in enumerate(writes):
                try:
                    seg.write(at, buf)
                except OSError as exc:
                    self._unwrite(writes[: i + 1])
                    raise io_error(f"append to {seg.path.name} at {at}", exc) from exc
            self.queue_offsets[key] = qoff
            self.max_offset = end
        phys: list[int] = []
        for _seg_start, lo, hi, pos, _filler in plan:
            if hi > lo:
                shift = pos - (ends[lo - 1] if lo else 0)
                phys += [shift + e - z for e, z in zip(ends[lo:hi], sizes[lo:hi], strict=True)]
        return AppendResult(topic, queue_id, first_qoff, phys, sizes, end, store_ts)

    def _unwrite(self, writes: list[tuple[Segment, int, bytearray]]) -> None:
        """Zero what a failed append may have written: complete records of it left past the
        end would otherwise come back in the recovery scan after a crash."""
        for seg, at, buf in writes:
            try:
                seg.write(at, bytes(len(buf)))
            except OSError as exc:
                self.fenced = f"could not undo a failed append in {seg.path.name}: {exc}"

    def _plan_locked(self, start: int, sizes: list[int]) -> list[tuple[int, int, int, int, int]]:
        """Split a batch at segment ends: (segment start, lo, hi, position, filler bytes)."""
        plan = []
        size = self.segment_size
        pos = start
        lo = 0
        n = len(sizes)
        while lo < n:
            seg_start = pos - pos % size
            room = seg_start + size - pos
            hi = lo
            used = 0
            while hi < n:
                nxt = used + sizes[hi]
                # Fit exactly, or leave room for an end-of-segment filler.
                if nxt == room or nxt + MIN_BLANK <= room:
                    used = nxt
                    hi += 1
                else:
                    break
            if hi == n:
                plan.append((seg_start, lo, hi, pos, 0))
                break
            if hi == lo and pos == seg_start:
                raise StoreIOError(f"record of {sizes[lo]} bytes cannot fit in a segment")
            plan.append((seg_start, lo, hi, pos, room - used))
            pos = seg_start + size
            lo = hi
        return plan

    # ---------------------------------------------------------------- flush

    def flush(self, upto: int | None = None) -> int:
        """fsync segments holding data in [flushed_offset, upto). Returns the new flushed offset.

        Runs without the append lock: appends continue while the kernel writes back.
        """
        with self._flush_lock:
            target = self.max_offset if upto is None else min(upto, self.max_offset)
            if target <= self.flushed_offset:
                return self.flushed_offset
            if self.fenced:  # after a failed fsync a retry "succeeds" without the lost pages:
                return self.flushed_offset  # never vouch for anything past the failure
            pos = self.flushed_offset
            while pos < target:
                seg = self.segments.find(pos)
                if seg is None:
                    break
                try:
                    seg.flush()
                except OSError as exc:
                    self.fenced = f"fsync of {seg.path.name} failed: {exc}"
                    raise io_error(f"fsync {seg.path.name}", exc) from exc
                pos = seg.end
            self.flushed_offset = target
            return target

    # ---------------------------------------------------------------- reads

    def view_at(self, offset: int) -> tuple[memoryview, int, int] | None:
        """(segment view, position of ``offset`` in it, segment size), or None if not held."""
        seg = self.segments.find(offset)
        if seg is None:
            return None
        return seg.view, offset - seg.start, seg.size

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def close(self) -> None:
        self.segments.close()
