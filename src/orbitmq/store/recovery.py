"""Opening a store after a clean or an unclean stop, in numbered passes.

1. Load the CommitLog segments, ConsumeQueues and IndexFiles; stray ``.tmp`` files go, files
   of the wrong size are resized and the start counts as unclean.
2. Decide: a clean start needs no ``abort`` marker, a valid checkpoint written by a clean
   shutdown, and a last record that still verifies where the checkpoint says it ends.
   A clean start reads no data beyond that one record.
3. Unclean: scan forward from the checkpoint's safe point (everything before it, CommitLog and
   derived files alike, was fsynced), verifying each record's framing and CRC. The scan stops
   at the first record that fails (for encryption at rest, at the first record of a sealed
   group that is not complete: ``seal_group.check_group``).
4. Cut: zero the CommitLog from there, remove later segments, cut ConsumeQueue and IndexFile
   entries at or past the safe point. The IndexFiles are cut by the routine
   ``MessageStore.truncate_to`` uses (``IndexService.truncate_from``, ``index_cut.py``): it
   finds the survivors from the bottom, so pages torn by a power cut inside an earlier cut
   (or inside appends) cannot make it keep stale entries or hide a surviving key.
5. Re-dispatch the scanned tail with the live dispatcher's code.
6. Rebuild the queue-offset table and correct queue min offsets.

``recover`` takes the store's parts (CommitLog, ConsumeQueues, IndexFiles, dispatcher) and the
paths of the checkpoint and the abort marker, not the store, as Kafka's ``LogLoader`` does: it
runs before the store is open for business and touches nothing else.

Recovery time therefore depends on the tail written since the last checkpoint (about one
second of traffic), not on how much data the store holds. Loss is reported, never silent:
every cut is logged and returned in a RecoveryReport.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from orbitmq.common.record import HEADER, HEADER_SIZE, U16, RecordError, check_record
from orbitmq.store.checkpoint import Checkpoint
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.index_service import IndexService
from orbitmq.store.seal_group import check_group

log = logging.getLogger(__name__)
_ZERO_PAGE = bytes(4096)


@dataclass(frozen=True, slots=True)
class StoreParts:
    """What recovery loads, checks and repairs: the log and the data derived from it."""

    commit_log: CommitLog
    queues: ConsumeQueueTable
    index: IndexService | None
    dispatcher: Dispatcher


@dataclass(frozen=True, slots=True)
class Cut:
    """Bytes recovery removed: ``file`` from ``offset`` (in the file), ``length`` bytes."""

    file: str
    offset: int
    length: int
    reason: str


@dataclass(slots=True)
class RecoveryReport:
    clean: bool = True
    scanned_from: int = 0
    end_offset: int = 0
    records_scanned: int = 0
    redispatched: int = 0
    consume_queue_entries_dropped: int = 0
    index_entries_dropped: int = 0
    cuts: list[Cut] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def bytes_cut(self) -> int:
        return sum(c.length for c in self.cuts)


def _dirty_extent(view: memoryview, start: int) -> int:
    """Bytes from ``start`` up to the first all-zero 4 KiB page: how much garbage was cut.

    A zero rest of ``start``'s own page ends the garbage only if the next page is zero too: a
    record that begins just before a page boundary may be zero on this side of it (a page
    that never reached the disk) and garbage on the other.
    """
    size = len(view)
    pos = min(size, (start // 4096 + 1) * 4096)
    if not any(view[start:pos]) and (pos >= size or not any(view[pos : pos + 4096])):
        return 0
    while pos < size and view[pos : pos + 4096] != _ZERO_PAGE[: min(4096, size - pos)]:
        pos += 4096
    return min(pos, size) - start


def _clean_start_ok(
    parts: StoreParts, abort_path: Path, cp: Checkpoint | None, report: RecoveryReport
) -> bool:
    if abort_path.exists():
        report.problems.append("abort marker present: the last run did not close cleanly")
        return False
    if cp is None and not parts.commit_log.segments.segments and not parts.queues.queues:
        return True  # a new, empty store
    if cp is None or not cp.clean:
        report.problems.append("no checkpoint from a clean shutdown")
        return False
    if report.problems:
        return False
    cl = parts.commit_log
    if cp.clean_end_offset == 0 and not cl.segments.segments:
        return True
    if cp.last_record_offset < 0:
        return cp.clean_end_offset == cl.min_offset
    loc = cl.view_at(cp.last_record_offset)
    if loc is None:
        report.problems.append("checkpoint's last record is not in any segment")
        return False
    view, at, size = loc
    try:
        n = check_record(view, at, size)
    except RecordError as exc:
        report.problems.append(f"last record before clean shutdown fails: {exc}")
        return False
    if cp.last_record_offset + n != cp.clean_end_offset:
        report.problems.append("last record does not end where the checkpoint says")
        return False
    return True


def _scan(cl: CommitLog, start: int, report: RecoveryReport) -> int:
    """Verify records from ``start``; return the end of the valid prefix; cut what follows."""
    pos = start
    while True:
        loc = cl.view_at(pos)
        if loc is None:
            return pos  # ran off the last segment: everything verified
        view, at, size = loc
        seg = cl.segments.find(pos)
        assert seg is not None
        while at < size:
            try:
                n = check_record(view, at, size)
                if n > 0:  # encryption at rest: a torn group is cut at its first record
                    check_group(view, at, size)
            except RecordError as exc:
                extent = _dirty_extent(view, at)
                if extent or cl.segments.last() is not seg:
                    report.cuts.append(Cut(seg.path.name, at, extent, str(exc)))
                    log.warning(
                        "recovery: cut %s at %d (%d bytes): %s", seg.path.name, at, extent, exc
                    )
                seg.zero_from(at)
                for gone in cl.segments.drop_after(seg.start + at):
                    report.cuts.append(Cut(gone.name, 0, cl.segment_size, "after the cut"))
                    log.warning("recovery: removed %s (after the cut)", gone.name)
                return seg.start + at
            if n < 0:  # end-of-segment filler
                at = size
                break
            report.records_scanned += 1
            at += n
        pos = seg.start + size


def _key(view: memoryview, at: int) -> tuple[str, int, int]:
    """(topic, queue id, queue offset) from the framing of the record at ``at``."""
    (_t, _m, _c, qid, _f, qoff, *_rest, body_len) = HEADER.unpack_from(view, at)
    t_at = at + HEADER_SIZE + body_len
    tlen = U16.unpack_from(view, t_at)[0]
    topic = bytes(view[t_at + 2 : t_at + 2 + tlen]).decode("utf-8", "replace")
    return topic, qid, qoff


def queue_offsets_in(cl: CommitLog, start: int, end: int) -> dict[tuple[str, int], int]:
    """The next queue offset of every queue with a record in [start, end), from the records."""
    found: dict[tuple[str, int], int] = {}
    pos = start
    while pos < end:
        loc = cl.view_at(pos)
        if loc is None:
            break
        view, at, size = loc
        n = check_record(view, at, size, verify_crc=False)
        if n < 0:  # filler: the rest of the segment
            pos += -n
            continue
        topic, qid, qoff = _key(view, at)
        found[(topic, qid)] = qoff + 1
        pos += n
    return found


def record_key(cl: CommitLog, pos: int) -> tuple[str, int, int] | None:
    """(topic, queue id, queue offset) of the record starting at CommitLog offset ``pos``,
    dispatched or not (above the confirm offset too); None when no record starts there.

    The framing is checked, not the CRC (a sealed record's bytes are the cipher's): a caller
    compares the answer with the key it expects, so a position inside a record never passes."""
    if not 0 <= pos < cl.max_offset:
        return None
    loc = cl.view_at(pos)
    if loc is None:
        return None
    view, at, size = loc
    try:
        n = check_record(view, at, size, verify_crc=False)
    except RecordError:
        return None
    return None if n < 0 else _key(view, at)


def recover(parts: StoreParts, checkpoint_path: Path, abort_path: Path) -> RecoveryReport:
    """Load the parts and bring them back to a consistent state (the passes above)."""
    began = time.monotonic()
    report = RecoveryReport()
    cl, queues, index, dispatcher = parts.commit_log, parts.queues, parts.index, parts.dispatcher
    # Pass 1: load.
    report.problems += cl.segments.load()
    report.problems += queues.load()
    if index is not None:
        index.load()
    cp = Checkpoint.load(checkpoint_path)
    # Pass 2: decide.
    if _clean_start_ok(parts, abort_path, cp, report):
        end = cp.clean_end_offset if cp is not None else 0
        report.scanned_from = end
    else:
        report.clean = False
        safe = cp.dispatch_safe_offset if cp is not None else 0
        last = cl.segments.last()
        lo = cl.min_offset
        hi = last.end if last is not None else safe
        start = min(max(safe, lo), hi) if last is not None else safe
        report.scanned_from = start
        # Passes 3-4: scan and cut the CommitLog, then cut the derived files.
        end = _scan(cl, start, report) if last is not None else start
        for cq in queues.queues.values():
            report.consume_queue_entries_dropped += cq.truncate_from_phy(start)
        if index is not None:
            report.index_entries_dropped = index.truncate_from(start)
    cl.max_offset = end
    cl.flushed_offset = end if report.clean else min(end, report.scanned_from)
    # A clean close dispatched up to the confirm offset only (store/confirm.py): start there.
    clean_from = end if cp is None else min(end, max(cp.dispatch_safe_offset, cl.min_offset))
    dispatcher.reput_offset = report.scanned_from if not report.clean else clean_from
    # Pass 5: re-dispatch the tail, up to the confirm offset read back before recovery.
    if not report.clean:
        report.redispatched = dispatcher.dispatch_until(cl.confirm_offset)
    # Pass 6: offsets, from the queues and from the records not dispatched (above the confirm
    # offset), so a broker appending after its promotion continues every queue after them.
    cl.queue_offsets = {key: cq.max_offset for key, cq in queues.queues.items()}
    if dispatcher.reput_offset < end:
        cl.queue_offsets.update(queue_offsets_in(cl, dispatcher.reput_offset, end))
    for cq in queues.queues.values():
        cq.correct_min_offset(cl.min_offset)
    report.end_offset = end
    report.duration_s = time.monotonic() - began
    if not report.clean:
        log.warning(
            "recovered unclean store: scanned %d records from %d, end %d, cut %d bytes in %.3fs",
            report.records_scanned, report.scanned_from, end, report.bytes_cut,
            report.duration_s,
        )  # fmt: skip
    return report
