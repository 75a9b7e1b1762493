"""Cutting a live store's log back to an offset, crash-safely (a former master rejoining).

When a broker that was master comes back as a slave, the bytes it wrote past the point where
its log and the new master's diverge (:func:`orbitmq.store.epoch.divergence_offset`) must go,
and with them every ConsumeQueue, IndexFile and timer entry derived from them. The steps, in
an order where a crash at any point leaves a store that recovery turns into either the old log
or the cut one -- and once step 2 is durable, always the cut one:

1. Write a checkpoint whose safe point is at or below the cut, so recovery scans from there
   (a checkpoint from before the cut would let it start past the cut, inside data to remove).
2. Zero the cut segment from the cut to the old end through :class:`FileOps` and fdatasync it.
   Recovery's scan now stops at the cut (a zero size is "end of data") and removes every later
   segment by itself. This is the fix for RocketMQ #10666, where a cut tail came back valid.
3. Remove whole later segments.
4. Cut ConsumeQueue entries pointing at or past the cut (the timer topic's queue included: the
   timer index is rebuilt from it), then IndexFile entries; their own cuts become durable at
   the next checkpoint, and recovery redoes them from the checkpoint of step 1 meanwhile.
5. Recompute the per-queue next offsets from what is left (RocketMQ #7689: without it, new
   messages would reuse or skip queue offsets), move the dispatcher and flush marks back.
6. Drop epochs starting at or past the cut from the epoch file (after the log: an epoch left
   over by a crash here is dropped at the next open, as it starts past the log's end).

Like recovery, :func:`truncate` takes the store's parts, not the store; the caller stops the
store's threads and holds the append lock around it. Readers must be quiesced (a slave serves
no reads while it rejoins): cut files are shrunk under their read-only mappings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import StoreError
from orbitmq.common.record import RecordError, check_record
from orbitmq.store.checkpoint import Checkpoint
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.epoch import EpochFile
from orbitmq.store.recovery import StoreParts, queue_offsets_in

log = logging.getLogger(__name__)
_ZERO_CHUNK = bytes(1 << 20)

STEPS = ("checkpoint", "zeroed", "segments", "queues", "index", "offsets", "epochs")
"""The points :func:`truncate` reports to its ``step`` hook, in order (crash tests stop there)."""


@dataclass(slots=True)
class TruncateReport:
    offset: int
    old_end: int
    segments_removed: int = 0
    consume_queue_entries_dropped: int = 0
    index_entries_dropped: int = 0
    epochs_dropped: int = 0

    @property
    def bytes_cut(self) -> int:
        return self.old_end - self.offset


def check_cut(cl: CommitLog, offset: int) -> None:
    """Raise StoreError unless ``offset`` is a place the log can end: within it, and where a
    record (or an end-of-segment filler) starts."""
    if not cl.min_offset <= offset <= cl.max_offset:
        raise StoreError(
            f"cannot cut at {offset}: the log holds [{cl.min_offset}, {cl.max_offset})"
        )
    if offset == cl.max_offset:
        return
    loc = cl.view_at(offset)
    if loc is None:
        raise StoreError(f"cannot cut at {offset}: no segment holds it")
    view, at, size = loc
    try:
        check_record(view, at, size, verify_crc=False)
    except RecordError as exc:
        raise StoreError(f"cannot cut at {offset}: not the start of a record ({exc})") from None


def truncate(
    parts: StoreParts,
    epochs: EpochFile,
    checkpoint_path: Path,
    offset: int,
    *,
    step: Callable[[str], None] | None = None,
) -> TruncateReport:
    """Cut the log at ``offset`` (see the module docstring for the steps and their order)."""
    cl, queues, index, dispatcher = parts.commit_log, parts.queues, parts.index, parts.dispatcher
    check_cut(cl, offset)
    report = TruncateReport(offset, cl.max_offset)
    mark = step or (lambda _name: None)
    # 1. Recovery must scan from at or below the cut.
    cp = Checkpoint.load(checkpoint_path)
    safe = min(cp.dispatch_safe_offset if cp is not None else 0, offset)
    Checkpoint(
        dispatch_safe_offset=safe,
        commit_log_flushed=min(cl.flushed_offset, safe),
        written_at_ms=now_ms(),
    ).save(checkpoint_path)
    mark("checkpoint")
    # 2. The cut, durable: zeros from the cut to the old end of its segment.
    seg = cl.segments.find(offset)
    if seg is not None and offset < report.old_end:
        pos, stop = offset - seg.start, min(seg.size, report.old_end - seg.start)
        while pos < stop:
            n = min(len(_ZERO_CHUNK), stop - pos)
            seg.write(pos, _ZERO_CHUNK[:n])
            pos += n
        seg.flush()
    mark("zeroed")
    # 3. Later segments.
    removed = cl.segments.drop_after(offset)
    report.segments_removed = len(removed)
    for path in removed:
        log.warning("truncate: removed %s (after the cut at %d)", path.name, offset)
    mark("segments")
    # 4. Derived data.
    for cq in list(queues.queues.values()):
        report.consume_queue_entries_dropped += cq.truncate_from_phy(offset)
    mark("queues")
    if index is not None:
        report.index_entries_dropped = index.truncate_from(offset)
    mark("index")
    # 5. Offsets: dispatched queues from their ConsumeQueues, the undispatched rest from the log.
    dispatcher.reput_offset = min(dispatcher.reput_offset, offset)
    cl.max_offset = offset
    cl.flushed_offset = min(cl.flushed_offset, offset)
    if cl.confirmed is not None:
        cl.confirmed = min(cl.confirmed, offset)
    offsets = {key: cq.max_offset for key, cq in queues.queues.items()}
    offsets.update(queue_offsets_in(cl, dispatcher.reput_offset, offset))
    cl.queue_offsets = offsets
    mark("offsets")
    # 6. The epoch file.
    report.epochs_dropped = epochs.truncate_from(offset)
    mark("epochs")
    log.warning(
        "truncated the log from %d to %d: %d segment(s), %d queue entries, %d index entries, "
        "%d epoch(s) removed",
        report.old_end, offset, report.segments_removed, report.consume_queue_entries_dropped,
        report.index_entries_dropped, report.epochs_dropped,
    )  # fmt: skip
    return report
