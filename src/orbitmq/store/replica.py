"""Replica appends: a slave's CommitLog grows by the master's bytes, verbatim.

A slave does not re-encode what it receives: the master's records (queue offsets, store
timestamps, physical offsets, end-of-segment fillers) are written at the same offsets, so the
two logs are byte-identical and any offset means the same record on every replica. The
slave's own dispatcher then builds its ConsumeQueues, IndexFiles and timer index from them, as
it would from its own appends.

Nothing is written before the whole chunk has been checked, record by record: each lies in
one segment, has the right magic, consistent lengths and a matching CRC, and names its own
position as its physical offset; a filler ends its segment exactly. A chunk holds whole
records only (the master's :func:`read_chunk` cuts them so), and starts exactly at the
slave's end. The master side, :func:`read_chunk`, hands out such chunks zero-copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.errors import StoreClosedError, StoreError
from orbitmq.common.record import (
    BLANK,
    BLANK_MAGIC,
    HEADER,
    HEADER_SIZE,
    MIN_BLANK,
    U16,
    RecordError,
    check_record,
)
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.segment import io_error

Buffer = bytes | bytearray | memoryview


class ReplicaOffsetError(StoreError):
    """A replicated chunk does not start at the slave's end: the link must resynchronise."""


class ReplicaDataError(StoreError):
    """A replicated chunk failed validation: nothing of it was written."""


@dataclass(frozen=True, slots=True)
class Checked:
    """A validated chunk: where it ends and the next queue offset of each queue in it."""

    end: int
    queue_offsets: dict[tuple[str, int], int]
    records: int


def check_chunk(data: Buffer, offset: int, segment_size: int) -> Checked:
    """Validate ``data`` as whole records starting at CommitLog ``offset`` (see the module)."""
    view = memoryview(data)
    size = len(view)
    at = 0
    offsets: dict[tuple[str, int], int] = {}
    records = 0
    while at < size:
        pos = offset + at
        seg_left = segment_size - pos % segment_size
        if size - at < MIN_BLANK:
            raise ReplicaDataError(f"chunk ends inside a record header at {pos}")
        total, _magic = BLANK.unpack_from(view, at)
        if total <= 0 or at + total > size:
            raise ReplicaDataError(f"record at {pos} of {total} bytes runs past the chunk")
        try:
            n = check_record(view, at, at + seg_left)
        except RecordError as exc:
            raise ReplicaDataError(f"record at {pos}: {exc}") from None
        if n < 0:
            at += -n
            continue
        (_t, _m, _c, qid, _f, qoff, phy, *_rest, body_len) = HEADER.unpack_from(view, at)
        if phy != pos:
            raise ReplicaDataError(f"record at {pos} says it is at {phy}")
        t_at = at + HEADER_SIZE + body_len
        tlen = U16.unpack_from(view, t_at)[0]
        try:
            topic = str(view[t_at + 2 : t_at + 2 + tlen], "utf-8")
        except UnicodeDecodeError:
            raise ReplicaDataError(f"record at {pos}: topic is not UTF-8") from None
        offsets[(topic, qid)] = qoff + 1
        records += 1
        at += n
    return Checked(offset + size, offsets, records)


def _check_offset(cl: CommitLog, offset: int) -> bool:
    """Raise ReplicaOffsetError unless ``offset`` is where the log takes its next bytes;
    True if the log is empty and starts there."""
    empty = not cl.segments.segments and cl.max_offset == 0
    if offset != cl.max_offset and not (empty and offset % cl.segment_size == 0):
        raise ReplicaOffsetError(
            f"replicated data starts at {offset}, but this log ends at {cl.max_offset}"
        )
    return empty


def append_chunk(cl: CommitLog, offset: int, data: Buffer) -> Checked:
    """Write a validated chunk at the log's end through the segment code; publish the new end
    and queue offsets. A store with no data yet may start at any segment boundary (a new slave
    of a master whose first segments were already deleted)."""
    _check_offset(cl, offset)  # before the work of validating: the usual mistake, said clearly
    checked = check_chunk(data, offset, cl.segment_size)
    view = memoryview(data)
    with cl.lock:
        if cl.fenced:
            raise StoreClosedError(f"writes fenced after an I/O failure: {cl.fenced}")
        if _check_offset(cl, offset):
            cl.max_offset = cl.flushed_offset = offset
        pos = offset
        while pos < checked.end:
            seg_start = pos - pos % cl.segment_size
            seg = cl.segments.find(seg_start) or cl.segments.create(seg_start)
            n = min(checked.end, seg.end) - pos
            try:
                seg.write(pos - seg.start, view[pos - offset : pos - offset + n])
            except OSError as exc:
                # Zero what may have landed, as a failed append does, so a restart cannot
                # resurrect part of a chunk the master will send again.
                try:
                    seg.write(pos - seg.start, bytes(n))
                except OSError as undo:
                    cl.fenced = f"could not undo a failed replica write: {undo}"
                raise io_error(f"replica write to {seg.path.name}", exc) from exc
            pos += n
        cl.queue_offsets.update(checked.queue_offsets)
        cl.max_offset = checked.end
    return checked


def read_chunk(cl: CommitLog, offset: int, max_bytes: int, limit: int | None = None) -> memoryview:
    """Whole records from ``offset`` (a record boundary), zero-copy: at most ``max_bytes``
    unless the first record alone is bigger, never past ``limit`` (the next epoch's start) or
    the log's end, and within one segment (a filler ends a chunk). Empty when nothing is new."""
    end = cl.max_offset if limit is None else min(limit, cl.max_offset)
    if offset >= end:
        return memoryview(b"")
    loc = cl.view_at(offset)
    if loc is None:
        raise StoreError(f"offset {offset} is not held (the log holds [{cl.min_offset}, {end}))")
    view, at, size = loc
    stop = min(size, end - (offset - at))
    pos = at
    while pos < stop:
        total, magic = BLANK.unpack_from(view, pos)
        if total <= 0:
            raise StoreError(f"no record at {offset - at + pos}")
        if pos > at and pos + total - at > max_bytes:
            break
        pos += total
        if magic == BLANK_MAGIC:
            break
    return view[at : min(pos, stop)]
