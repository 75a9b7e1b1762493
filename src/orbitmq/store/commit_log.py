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
from orbitmq.store.appended import Appended, AppendedBatch
from orbitmq.store.segment import FileOps, Segment, SegmentQueue, io_error

SEAL_OVERHEAD = 24
"""Bytes a format-1 sealed record has more than its plaintext (orbitmq.store.sealing)."""
SYSFLAG_SEALED = 0x10000
"""SYS_FLAG bit of a sealed (encrypted) record (orbitmq.store.sealing)."""
SYSFLAG_SEALED_GROUP = 0x20000
"""With SEALED: the record belongs to a sealed group (format 2, orbitmq.store.seal_group)."""


class Sealer(Protocol):
    """What the append path needs of :class:`orbitmq.store.sealing.RecordSealer`."""

    def seal(
        self, head: BatchHeader, seg_start: int, bodies: Sequence[bytes], props: Sequence[bytes]
    ) -> bytearray:
        """The batch's records as stored (sealed), laid out from ``head``'s offsets."""
        ...

    def overhead(self, topic_len: int) -> int:
        """Bytes a sealed record has more than its plaintext."""
        ...


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


class _Prepared:
    """A batch's record sizes, worked out before the lock is taken, and its encoder: the one
    place both append paths turn a batch into record bytes."""

    __slots__ = (
        "batch", "body_lens", "born_host", "ends", "prop_lens", "sealer", "sizes", "topic_bytes",
    )  # fmt: skip

    def __init__(self, batch: MessageBatch, sealer: Sealer | None = None) -> None:
        self.batch = batch
        self.sealer = sealer
        bodies, properties = batch.bodies, batch.properties
        self.topic_bytes = batch.topic.encode()
        self.born_host = pack_host(batch.born_host)
        n = len(bodies)
        overhead = record_overhead(len(self.topic_bytes))
        if sealer is not None:  # encryption at rest: each record grows (see the sealer)
            overhead += sealer.overhead(len(self.topic_bytes))
        self.body_lens: np.ndarray | None = None
        self.prop_lens: np.ndarray | None = None
        if n >= VECTOR_MIN_BATCH:
            self.body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
            self.prop_lens = np.fromiter(map(len, properties), dtype=np.int64, count=n)
            self.sizes: list[int] = (self.body_lens + self.prop_lens + overhead).tolist()
        else:  # numpy's fixed cost outweighs a few records
            self.sizes = [
                overhead + len(b) + len(p) for b, p in zip(bodies, properties, strict=True)
            ]
        self.ends = list(itertools.accumulate(self.sizes))

    def encode(
        self,
        first_qoff: int,
        pos: int,
        store_ts: int,
        store_host: bytes,
        lo: int,
        hi: int,
        seg_start: int,
    ) -> bytearray:
        """Records ``lo..hi`` of the batch, the first at queue offset ``first_qoff`` and log
        position ``pos`` (in the segment starting at ``seg_start``: a sealed record's associated
        data names it)."""
        b = self.batch
        head = BatchHeader(
            self.topic_bytes, b.queue_id, first_qoff, pos, b.flag, b.sys_flag,
            b.born_timestamp_ms, self.born_host, store_ts, store_host, b.reconsume_times,
            b.prepared_transaction_offset,
        )  # fmt: skip
        whole = lo == 0 and hi == len(self.sizes)
        bodies = b.bodies if whole else b.bodies[lo:hi]
        props = b.properties if whole else b.properties[lo:hi]
        if self.sealer is not None:
            return self.sealer.seal(head, seg_start, bodies, props)
        return encode_batch(
            head,
            bodies,
            props,
            None if self.body_lens is None else self.body_lens[lo:hi],
            None if self.prop_lens is None else self.prop_lens[lo:hi],
        )


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
        self.on_append: Callable[[Appended], None] | None = None
        """Told each append's records, under the lock, in log order (the dispatcher builds
        their entries from it, :mod:`orbitmq.store.appended`). Sealed appends too: what it is
        told (sealed sizes and offsets, plaintext properties) is what the dispatcher would
        decode from the opened groups."""

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
        prep = _Prepared(batch, self.sealer)
        sizes, n, batch_bytes = prep.sizes, len(prep.sizes), prep.ends[-1]
        with self.lock:
            if self.fenced:
                raise StoreClosedError(f"writes fenced after an I/O failure: {self.fenced}")
            key = (batch.topic, batch.queue_id)
            first_qoff = self.queue_offsets.get(key, 0)
            store_ts = self.clock()
            start = self.max_offset
            room = self.segment_size - start % self.segment_size
            if batch_bytes == room or batch_bytes + MIN_BLANK <= room:
                plan = [(start - start % self.segment_size, 0, n, start, 0)]  # the usual case
            else:  # a record never straddles a segment: split where one would
                plan = self._plan_locked(start, sizes)
            writes: list[tuple[Segment, int, bytearray]] = []
            qoff = first_qoff
            for seg_start, lo, hi, pos, filler in plan:
                seg = self.segments.find(seg_start) or self.segments.create(seg_start)
                buf = bytearray()
                if hi > lo:
                    buf = prep.encode(qoff, pos, store_ts, store_host, lo, hi, seg.start)
                    qoff += hi - lo
                if filler:
                    buf += encode_blank(filler)
                writes.append((seg, pos - seg.start, buf))
            _last_seg_start, last_lo, _hi, last_pos, _f = plan[-1]
            end = last_pos + batch_bytes - (prep.ends[last_lo - 1] if last_lo else 0)
            self._write_locked(writes)
            self.queue_offsets[key] = qoff
            self.max_offset = end
            phys: list[int] = []
            ends = prep.ends
            for _seg_start, lo, hi, pos, _filler in plan:
                if hi > lo:
                    shift = pos - (ends[lo - 1] if lo else 0)
                    phys += [shift + e - z for e, z in zip(ends[lo:hi], sizes[lo:hi], strict=True)]
            result = AppendResult(
                batch.topic, batch.queue_id, first_qoff, phys, sizes, end, store_ts
            )
            if self.on_append is not None:
                self.on_append(Appended(start, end, store_ts, [_told(result, batch)]))
        return result

    def append_many(
        self, batches: list[MessageBatch], store_host: bytes = b"\0" * 8
    ) -> list[AppendResult] | None:
        """Append several batches (validated by the caller) as one write: one lock, one store
        timestamp, one ``pwrite``. The records are exactly those that appending the batches
        one by one would write. All or none: an I/O error fails every batch. None, with
        nothing written, when they do not all fit in the current segment: the caller appends
        them one by one (a segment roll splits them anyway)."""
        preps = [_Prepared(b, self.sealer) for b in batches]
        total = sum(p.ends[-1] for p in preps)
        with self.lock:
            if self.fenced:
                raise StoreClosedError(f"writes fenced after an I/O failure: {self.fenced}")
            start = self.max_offset
            room = self.segment_size - start % self.segment_size
            fits = total == room or total + MIN_BLANK <= room
            return self._append_many_locked(preps, start, store_host) if fits else None

    def _append_many_locked(
        self, preps: list[_Prepared], start: int, store_host: bytes
    ) -> list[AppendResult]:
        store_ts = self.clock()
        seg_start = start - start % self.segment_size
        seg = self.segments.find(seg_start) or self.segments.create(seg_start)
        next_qoff: dict[tuple[str, int], int] = {}
        buf = bytearray()
        results: list[AppendResult] = []
        pos = start
        for prep in preps:
            b = prep.batch
            key = (b.topic, b.queue_id)
            qoff = next_qoff.get(key)
            if qoff is None:
                qoff = self.queue_offsets.get(key, 0)
            buf += prep.encode(qoff, pos, store_ts, store_host, 0, len(prep.sizes), seg.start)
            next_qoff[key] = qoff + len(prep.sizes)
            phys = [pos + e - z for e, z in zip(prep.ends, prep.sizes, strict=True)]
            pos += prep.ends[-1]
            results.append(AppendResult(b.topic, b.queue_id, qoff, phys, prep.sizes, pos, store_ts))
        self._write_locked([(seg, start - seg.start, buf)])
        self.queue_offsets.update(next_qoff)
        self.max_offset = pos
        if self.on_append is not None:
            told = [_told(r, p.batch) for r, p in zip(results, preps, strict=True)]
            self.on_append(Appended(start, pos, store_ts, told))
        return results

    def _write_locked(self, writes: list[tuple[Segment, int, bytearray]]) -> None:
        for i, (seg, at, buf) in enumerate(writes):
            try:
                seg.write(at, buf)
            except OSError as exc:
                self._unwrite(writes[: i + 1])
                raise io_error(f"append to {seg.path.name} at {at}", exc) from exc

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


def _told(result: AppendResult, batch: MessageBatch) -> AppendedBatch:
    return AppendedBatch(
        result.topic, result.queue_id, result.first_queue_offset, result.physical_offsets,
        result.sizes, batch.properties,
    )  # fmt: skip
