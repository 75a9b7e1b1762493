"""The broker's in-memory view of transactions: every half message from the oldest undecided
one on, and where a restart must start replaying.

Half messages have consecutive queue offsets in the half topic (only the broker appends there),
so the state is a window ``[floor_q, next_q)`` of them keyed by queue offset. Decided ones stay
in the window until every older one is decided too, then :meth:`TxState.prune` drops them (the
last few thousand decisions are kept in :attr:`TxState.recent` so a late duplicate still gets
the right answer). A restart replays the half topic from ``floor_q`` and the op topic from
:meth:`TxState.op_floor`, the first op record about any half message in the window, which
rebuilds exactly this state.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import logging
from collections import OrderedDict
from dataclasses import dataclass

from orbitmq.broker.transaction.records import (
    PROPERTY_CHECK_IMMUNITY_S,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_ID,
    Checked,
    CommitBegin,
    Committed,
    Discarded,
    Op,
    RolledBack,
)
from orbitmq.common.record import StoredMessage

log = logging.getLogger(__name__)

RECENT_DECISIONS = 65_536
"""Decisions of pruned half messages remembered, to answer late duplicates exactly."""


class TxStatus(enum.Enum):
    PENDING = "PENDING"
    COMMITTING = "COMMITTING"
    """A CommitBegin op is stored; the copy and the Committed op may or may not be."""
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"

    @property
    def decided(self) -> bool:
        return self in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK, TxStatus.DISCARDED)


@dataclass(slots=True, eq=False)
class Half:
    """One half message."""

    phys: int
    """CommitLog offset of the half record: the transaction's handle on the wire."""
    qoffset: int
    """Queue offset in the half topic."""
    store_ms: int
    group: str
    msg_id: str
    transaction_id: str
    topic: str
    queue_id: int
    immunity_ms: int = 0
    batch_size: int = 0
    size: int = 0
    """Bytes of the half record (bounds what one check pass reads)."""
    """Messages packed in a half batch (0: a single half message)."""
    checks: int = 0
    status: TxStatus = TxStatus.PENDING
    first_op: int = -1
    """Queue offset of the first op record about it (-1: none yet)."""
    commit_floor: int = 0
    busy: asyncio.Future[None] | None = None
    """Set while a decision is being applied: other decisions wait for it."""


class TxState:
    def __init__(self, start_q: int = 0) -> None:
        self.by_q: dict[int, Half] = {}
        self.by_phys: dict[int, Half] = {}
        self.by_id: dict[tuple[str, str], Half] = {}
        """(group, transaction id) -> its half batch: a retried send finds the first one."""
        self.floor_q = start_q
        self.next_q = start_q
        self.recent: OrderedDict[int, TxStatus] = OrderedDict()
        self._op_heap: list[tuple[int, int]] = []
        self.halves_in_flight = 0
        """Half appends under way: a gap in the window may be one of them (prune stops)."""

    def reset(self, start_q: int) -> None:
        """Empty the window, to start at ``start_q`` (a restart's replay); halves being
        appended stay counted."""
        in_flight = self.halves_in_flight
        self.__init__(start_q)  # type: ignore[misc]  # the one place that lists the fields
        self.halves_in_flight = in_flight

    def add(self, half: Half) -> None:
        if half.qoffset < self.floor_q:
            return  # replayed from before the window: decided long ago
        self.by_q[half.qoffset] = half
        self.by_phys[half.phys] = half
        if half.msg_id and half.batch_size:
            self.by_id.setdefault((half.group, half.msg_id), half)
        self.next_q = max(self.next_q, half.qoffset + 1)

    def note_op(self, half: Half, op_q: int) -> None:
        if half.first_op < 0 or op_q < half.first_op:
            half.first_op = op_q
            heapq.heappush(self._op_heap, (op_q, half.qoffset))

    def prune(self, halves_in_flight: bool) -> int:
        """Drop decided half messages at the window's start; returns how many. A missing queue
        offset is a half append still under way (stop there) unless none is."""
        dropped = 0
        while self.floor_q < self.next_q:
            half = self.by_q.get(self.floor_q)
            if half is None:
                if halves_in_flight:
                    break
            elif not half.status.decided or half.busy is not None:
                break
            else:
                del self.by_q[half.qoffset]
                self.by_phys.pop(half.phys, None)
                key = (half.group, half.msg_id)
                if self.by_id.get(key) is half:
                    del self.by_id[key]
                self.recent[half.phys] = half.status
                if len(self.recent) > RECENT_DECISIONS:
                    self.recent.popitem(last=False)
                dropped += 1
            self.floor_q += 1
        return dropped

    def op_floor(self) -> int | None:
        """The first op record a restart must replay (None: no half in the window has one)."""
        heap = self._op_heap
        while heap and (
            heap[0][1] < self.floor_q
            or (half := self.by_q.get(heap[0][1])) is None
            or half.first_op != heap[0][0]
        ):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def apply(self, op: Op, op_q: int) -> None:
        """Replay one op record's operation (at op-topic offset ``op_q``) onto the window."""
        state = self
        if isinstance(op, Checked):
            for phys in op.halves:
                half = state.by_phys.get(phys)
                if half is not None:
                    half.checks += 1
                    state.note_op(half, op_q)
            return
        half = state.by_phys.get(op.half)
        if half is None:
            return  # about a half message before the window: decided long ago
        state.note_op(half, op_q)
        if isinstance(op, CommitBegin):
            if half.status is TxStatus.PENDING:
                half.status = TxStatus.COMMITTING
                half.commit_floor = op.floor
        elif isinstance(op, Committed):
            half.status = TxStatus.COMMITTED
        elif isinstance(op, RolledBack):
            half.status = TxStatus.ROLLED_BACK
        elif isinstance(op, Discarded):
            half.status = TxStatus.DISCARDED

    def pending(self) -> int:
        return sum(not h.status.decided for h in self.by_q.values())

    def pending_by_topic(self) -> dict[str, int]:
        """Undecided half messages per real topic (``rocketmq_half_messages``; called from
        the metrics thread, so it reads a copy of the window)."""
        out: dict[str, int] = {}
        for h in list(self.by_q.values()):
            if not h.status.decided:
                out[h.topic] = out.get(h.topic, 0) + 1
        return out


def half_from_record(msg: StoredMessage) -> Half | None:
    props = msg.properties
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, ""))
    except ValueError:
        queue_id = -1
    topic = props.get(PROPERTY_REAL_TOPIC, "")
    if not topic or queue_id < 0:
        log.warning("half message at %d has no real topic/queue; ignored", msg.physical_offset)
        return None
    immunity_ms = 0
    with contextlib.suppress(ValueError):
        immunity_ms = max(0, int(props.get(PROPERTY_CHECK_IMMUNITY_S, "0")) * 1000)
    msg_id = msg.msg_id or ""
    batch_size = 0
    with contextlib.suppress(ValueError):
        batch_size = max(0, int(props.get(PROPERTY_TRANSACTION_BATCH, "0")))
    return Half(
        phys=msg.physical_offset,
        qoffset=msg.queue_offset,
        size=msg.total_size,
        store_ms=msg.store_timestamp_ms,
        group=props.get(PROPERTY_PRODUCER_GROUP, ""),
        msg_id=msg_id,
        transaction_id=props.get(PROPERTY_TRANSACTION_ID) or msg_id,
        topic=topic,
        queue_id=queue_id,
        immunity_ms=immunity_ms,
        batch_size=batch_size,
    )
