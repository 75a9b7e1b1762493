"""The in-memory Pop state: open checkpoints, which of their entries are acked, and the indexes
the broker needs (deadlines for revive, revive-log positions for the restart checkpoint,
in-flight counts for stats and for the per-group bound), and the FIFO windows
(:mod:`orbitmq.broker.pop.fifo`): a FIFO CK is kept out of revive's deadline heap (its
un-acked entries become visible again in place, see :meth:`PopState.fifo_due`) and updates the
window of its queue.

Everything here is rebuilt from the revive log at start (:meth:`PopState.apply`), so it holds
nothing that is not also on disk; it runs on the event loop only (no locks).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from orbitmq.broker.pop.fifo import FifoWindow, WindowKey
from orbitmq.broker.pop.records import AckRecord, CkRecord, DoneRecord, Op

CLOSED_MEMORY = 65_536
"""How many closed checkpoints are remembered (for a precise remark on a late ack)."""


@dataclass(slots=True, eq=False)
class PopCheckpoint:
    record: CkRecord
    log_offset: int
    """Queue offset in the revive log of the entry that holds the CK."""
    acked: bytearray
    """1 per entry acked (or replaced by change_invisible_duration)."""
    open: int
    """Entries neither acked nor revived."""
    pending: int = 0
    """Appends in flight that touch this CK (an ack or a change): revive waits for them."""

    @property
    def ck_id(self) -> int:
        return self.record.ck_id

    def unacked(self) -> list[int]:
        return [i for i, done in enumerate(self.acked) if not done]

    @property
    def fifo(self) -> bool:
        return self.record.fifo_attempts is not None


@dataclass(slots=True)
class PopState:
    cks: dict[int, PopCheckpoint] = field(default_factory=dict)
    closed: OrderedDict[int, str] = field(default_factory=OrderedDict)
    """Recently closed CK ids -> why ("acked", "revived")."""
    _deadlines: list[tuple[int, int]] = field(default_factory=list)
    _log_heap: list[tuple[int, int]] = field(default_factory=list)
    _inflight: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    _group_open: Counter[str] = field(default_factory=Counter)
    fifo: dict[WindowKey, FifoWindow] = field(default_factory=dict)
    """FIFO windows per (group, topic, queue)."""
    _fifo_deadlines: list[tuple[int, int]] = field(default_factory=list)

    # ------------------------------------------------------------------ queries

    def open_entries(self, group: str) -> int:
        """Handed-out, un-acked messages of a group (bounded by pop_max_inflight_per_group)."""
        return self._group_open.get(group, 0)

    def inflight(self, group: str, topic: str, queue_id: int) -> int:
        return self._inflight.get((group, topic, queue_id), 0)

    def revive_gauges(self, now_ms: int) -> dict[str, int]:
        """Pop's ``rocketmq_pop_*`` gauges: checkpoints past their deadline and not yet
        revived, the oldest one's delay, open entries and open checkpoints. Called from the
        metrics thread: reads copies (a stale heap entry is skipped as :meth:`due` skips it)."""
        cks = self.cks
        overdue = [
            d for d, ck_id in list(self._deadlines)
            if d <= now_ms and (ck := cks.get(ck_id)) is not None and ck.record.deadline_ms == d
        ]  # fmt: skip
        return {
            "revive_lag": len(overdue),
            "revive_latency_ms": now_ms - min(overdue) if overdue else 0,
            "offset_buffer": sum(list(self._group_open.values())),
            "checkpoint_buffer": len(cks),
        }

    def revive_floor(self) -> int | None:
        """The lowest revive-log offset of an open CK (None: none is open)."""
        heap = self._log_heap
        while heap:
            offset, ck_id = heap[0]
            ck = self.cks.get(ck_id)
            if ck is not None and ck.log_offset == offset:
                return offset
            heapq.heappop(heap)
        return None

    def stale(self, below: int, limit: int) -> list[PopCheckpoint]:
        """Open ordinary CKs whose revive-log entry lies below ``below``, oldest first, that no
        append is touching, at most ``limit``: taken off the floor heap until :meth:`moved`
        (or :meth:`unmoved`) puts them back. Stops at the first FIFO CK (its window needs the
        log from there on anyway: ``FifoWindow.pins``)."""
        out: list[PopCheckpoint] = []
        later: list[tuple[int, int]] = []
        heap = self._log_heap
        while heap and heap[0][0] < below and len(out) < limit:
            offset, ck_id = heap[0]
            ck = self.cks.get(ck_id)
            if ck is None or ck.log_offset != offset:
                heapq.heappop(heap)
                continue
            if ck.fifo:
                break
            heapq.heappop(heap)
            if ck.pending:
                later.append((offset, ck_id))
                continue
            out.append(ck)
        for item in later:
            heapq.heappush(heap, item)
        return out

    def moved(self, ck: PopCheckpoint, log_offset: int) -> None:
        """The CK was written again at ``log_offset`` (compaction): replay may start past
        its first entry."""
        ck.log_offset = log_offset
        heapq.heappush(self._log_heap, (log_offset, ck.ck_id))

    def unmoved(self, cks: list[PopCheckpoint]) -> None:
        """Undo :meth:`stale` (the compaction append failed)."""
        for ck in cks:
            heapq.heappush(self._log_heap, (ck.log_offset, ck.ck_id))

    def due(self, now_ms: int, limit: int) -> list[PopCheckpoint]:
        """Open CKs whose deadline has passed and that no append is touching, at most
        ``limit``; they stay in the state until :meth:`close` (a failed revive is retried)."""
        out: list[PopCheckpoint] = []
        later: list[tuple[int, int]] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            deadline, ck_id = heapq.heappop(heap)
            ck = self.cks.get(ck_id)
            if ck is None or ck.record.deadline_ms != deadline:
                continue
            if ck.pending:
                later.append((deadline, ck_id))
                continue
            out.append(ck)
        for item in later:
            heapq.heappush(heap, item)
        return out

    def requeue(self, ck: PopCheckpoint) -> None:
        """Put a CK whose revive failed back in line."""
        if ck.ck_id in self.cks and not ck.fifo:
            heapq.heappush(self._deadlines, (ck.record.deadline_ms, ck.ck_id))

    # ------------------------------------------------------------------ FIFO

    def window(self, key: WindowKey) -> FifoWindow:
        win = self.fifo.get(key)
        if win is None:
            win = self.fifo[key] = FifoWindow()
        return win

    def fifo_due(self, now_ms: int, limit: int) -> list[PopCheckpoint]:
        """Open FIFO CKs past their deadline (or their retry time, see :meth:`fifo_requeue`)
        that no append is touching, at most ``limit``; the caller releases or dead-letters
        their entries and closes them."""
        out: list[PopCheckpoint] = []
        later: list[tuple[int, int]] = []
        heap = self._fifo_deadlines
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            due, ck_id = heapq.heappop(heap)
            ck = self.cks.get(ck_id)
            if ck is None:
                continue
            if ck.pending:
                later.append((due, ck_id))
                continue
            out.append(ck)
        for item in later:
            heapq.heappush(heap, item)
        return out

    def fifo_requeue(self, ck: PopCheckpoint, at_ms: int) -> None:
        """Look at a FIFO CK again at ``at_ms`` (its dead-lettering failed)."""
        if ck.ck_id in self.cks:
            heapq.heappush(self._fifo_deadlines, (at_ms, ck.ck_id))

    def fifo_ack(self, ck: PopCheckpoint, index: int) -> FifoWindow | None:
        """The ACK of a FIFO entry is stored: finish its offset in the window (None: not a
        FIFO CK, or the entry no longer holds the offset)."""
        rec = ck.record
        if rec.fifo_attempts is None:
            return None
        win = self.fifo.get((rec.group, rec.topic, rec.queue_id))
        if win is None or not win.ack(rec.offsets[index], rec.ck_id, index):
            return None
        return win

    def fifo_floor(self) -> int | None:
        """The lowest revive-log offset replay needs for the FIFO windows (None: none)."""
        floors = [f for w in self.fifo.values() if (f := w.floor()) is not None]
        return min(floors, default=None)

    # ------------------------------------------------------------------ changes

    def add(self, record: CkRecord, log_offset: int) -> PopCheckpoint:
        n = len(record.offsets)
        ck = PopCheckpoint(record, log_offset, bytearray(n), n)
        self.cks[record.ck_id] = ck
        if record.fifo_attempts is None:
            heapq.heappush(self._deadlines, (record.deadline_ms, record.ck_id))
        else:
            heapq.heappush(self._fifo_deadlines, (record.deadline_ms, record.ck_id))
            win = self.window((record.group, record.topic, record.queue_id))
            for i, (offset, attempt) in enumerate(
                zip(record.offsets, record.fifo_attempts, strict=True)
            ):
                win.deliver(offset, record.ck_id, i, attempt)
            win.pins.append((max(record.offsets), log_offset))
        heapq.heappush(self._log_heap, (log_offset, record.ck_id))
        self._inflight[(record.group, record.topic, record.queue_id)] += n
        self._group_open[record.group] += n
        return ck

    def mark(self, ck: PopCheckpoint, index: int) -> bool:
        """Mark one entry acked; False if it already was."""
        if ck.acked[index]:
            return False
        ck.acked[index] = 1
        ck.open -= 1
        self._count(ck.record, -1)
        return True

    def unmark(self, ck: PopCheckpoint, index: int) -> None:
        """Undo :meth:`mark` (its append failed)."""
        if ck.acked[index] and ck.ck_id in self.cks:
            ck.acked[index] = 0
            ck.open += 1
            self._count(ck.record, 1)

    def close_if_done(self, ck: PopCheckpoint) -> None:
        if ck.open <= 0 and ck.pending <= 0 and ck.ck_id in self.cks:
            self.close(ck, "acked")

    def close(self, ck: PopCheckpoint, why: str) -> None:
        if self.cks.pop(ck.ck_id, None) is None:
            return
        if ck.open:
            self._count(ck.record, -ck.open)
            ck.open = 0
        self.closed[ck.ck_id] = why
        while len(self.closed) > CLOSED_MEMORY:
            self.closed.popitem(last=False)

    def _count(self, record: CkRecord, delta: int) -> None:
        key = (record.group, record.topic, record.queue_id)
        left = self._inflight[key] + delta
        if left > 0:
            self._inflight[key] = left
        else:
            del self._inflight[key]
        left = self._group_open[record.group] + delta
        if left > 0:
            self._group_open[record.group] = left
        else:
            del self._group_open[record.group]

    # ------------------------------------------------------------------ replay

    def apply(self, op: Op, log_offset: int) -> None:
        """Replay one operation read back from the revive log."""
        if isinstance(op, CkRecord):
            if op.ck_id not in self.cks and op.ck_id not in self.closed:
                self.add(op, log_offset)
        elif isinstance(op, AckRecord):
            ck = self.cks.get(op.ck_id)
            if ck is not None:
                for i in op.indexes:
                    if i < len(ck.acked):
                        self.mark(ck, i)
                        self.fifo_ack(ck, i)
                self.close_if_done(ck)
        elif isinstance(op, DoneRecord):
            ck = self.cks.get(op.ck_id)
            if ck is not None:
                self.close(ck, "revived")
