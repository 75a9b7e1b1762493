"""The timer index: pending delayed and timer messages, in numpy arrays, in due order.

A delayed message is stored once, as a copy in the system topic :data:`TIMER_TOPIC` (one queue),
and the ConsumeQueue entry of that copy carries the due time (epoch ms) in its tag field, the
way RocketMQ's schedule topic keeps the delivery time in the tag slot. The dispatcher fills the
tag from the copy's ``TIMER_OUT_MS`` property, or from ``TIMER_ROLL_MS`` when the broker set one
(:func:`timer_tag`): a long timer is *rolled* -- stored again before retention can delete its
copy -- and its entry comes due at the roll time, not at the real due time. The ConsumeQueue alone is
then enough to rebuild the pending set after a restart: 20 bytes per timer, read with numpy,
without reading a single record. A recall appends a *cancel marker* to the same topic whose tag
is ``-1 - target queue offset`` (negative, so it can never be mistaken for a due time).

:class:`TimerIndex` holds what is pending as a handful of sorted runs of a structured array
(due, queue offset, CommitLog offset, size: 28 bytes a timer, no Python object per timer).
New timers arrive in ranges of the ConsumeQueue and become a run; runs are merged when a newer
one grows to half the size of the one before it (a binary-counter merge: O(log n) runs,
amortised O(log n) work per timer). Taking the due timers reads the head of every run.
Timers are ordered by (due, queue offset): equal due times fire in the order they were sent.

The index is not thread-safe: its owner (the broker's timer service) calls it from one thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orbitmq.store.consume_queue import ENTRY_DTYPE, ENTRY_SIZE, ConsumeQueue

TIMER_TOPIC = "rmq_sys_wheel_timer"
"""System topic holding delayed messages until they are due (RocketMQ 5's name; one queue)."""
TIMER_QUEUE_ID = 0
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_CANCEL = "TIMER_CANCEL_QOFF"
"""On a cancel marker: the timer-topic queue offset of the timer it cancels."""
PROPERTY_TIMER_ROLL_MS = "TIMER_ROLL_MS"
"""On a long timer's copy: when the broker stores the copy again (before retention may delete
it); the copy's ConsumeQueue entry comes due then, at min(TIMER_ROLL_MS, TIMER_OUT_MS)."""
_OUT_NEEDLE = b"TIMER_OUT_MS\x01"
_ROLL_NEEDLE = b"TIMER_ROLL_MS\x01"
_CANCEL_NEEDLE = b"TIMER_CANCEL_QOFF\x01"

TIMER_DTYPE = np.dtype([("due", "<i8"), ("qoff", "<i8"), ("phy", "<i8"), ("size", "<i4")])
"""One pending timer: due epoch ms, queue offset in the timer topic, CommitLog offset, size."""


def _value(props: bytes, needle: bytes) -> bytes | None:
    at = props.find(needle)
    while at > 0 and props[at - 1] != 0x02:
        at = props.find(needle, at + 1)
    if at < 0:
        return None
    begin = at + len(needle)
    end = props.find(b"\x02", begin)
    return props[begin : end if end >= 0 else len(props)]


def timer_tag(props: bytes) -> int:
    """The ConsumeQueue tag of a timer-topic record: its due ms (the roll time when the copy has
    a ``TIMER_ROLL_MS`` earlier than ``TIMER_OUT_MS``), or ``-1 - target`` for a cancel marker.
    A record the broker did not write well (no or a bad value) gets 0: due at once, which is
    never later than it should have been."""
    raw = _value(props, _CANCEL_NEEDLE)
    if raw is not None:
        try:
            return -1 - max(0, int(raw))
        except ValueError:
            return 0
    raw = _value(props, _OUT_NEEDLE)
    if raw is None:
        return 0
    roll = _value(props, _ROLL_NEEDLE)
    try:
        due = int(raw)
        if roll is not None:
            due = min(due, int(roll))
    except ValueError:
        return 0
    return max(0, min(due, 2**62))


def index_due(props: Mapping[str, str]) -> int | None:
    """The due time a timer copy's ConsumeQueue entry (and so the index) carries, from its
    decoded properties: :func:`timer_tag` for a dict. None when the copy has no valid value."""
    try:
        due = int(props[PROPERTY_TIMER_OUT_MS])
        roll = props.get(PROPERTY_TIMER_ROLL_MS)
        if roll is not None:
            due = min(due, int(roll))
    except (KeyError, ValueError):
        return None
    return max(0, min(due, 2**62))


@dataclass(slots=True)
class TimerEntries:
    """Timer-topic ConsumeQueue entries [start, end): timers (as TIMER_DTYPE, in queue order)
    and the queue offsets cancel markers point at."""

    start: int
    end: int
    timers: np.ndarray
    cancelled: np.ndarray


def read_entries(cq: ConsumeQueue | None, start: int, end: int) -> TimerEntries:
    """Read the timer topic's ConsumeQueue from ``start`` (raised to the queue's min offset) to
    ``end`` (lowered to its max offset). Zero (damaged or lost) entries are skipped."""
    if cq is None:
        return TimerEntries(start, start, np.empty(0, TIMER_DTYPE), np.empty(0, np.int64))
    start = max(start, cq.min_offset)
    end = min(end, cq.max_offset)
    chunks: list[np.ndarray] = []
    firsts: list[int] = []
    pos = start
    while pos < end:
        raw = cq.entries(pos, end - pos)
        if len(raw) < ENTRY_SIZE:
            break
        arr = np.frombuffer(raw, dtype=ENTRY_DTYPE)
        chunks.append(arr)
        firsts.append(pos)
        pos += len(arr)
    if not chunks:
        return TimerEntries(start, pos, np.empty(0, TIMER_DTYPE), np.empty(0, np.int64))
    arr = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    qoff = np.arange(start, start + len(arr), dtype=np.int64)
    tag = arr["tag"].astype(np.int64)
    size = arr["size"].astype(np.int64)
    live = size > 0
    is_timer = live & (tag >= 0)
    out = np.empty(int(is_timer.sum()), TIMER_DTYPE)
    out["due"] = tag[is_timer]
    out["qoff"] = qoff[is_timer]
    out["phy"] = arr["phy"][is_timer]
    out["size"] = size[is_timer]
    cancelled = -1 - tag[live & (tag < 0)]
    return TimerEntries(start, pos, out, cancelled.astype(np.int64))


def _sorted(entries: np.ndarray) -> np.ndarray:
    order = np.lexsort((entries["qoff"], entries["due"]))
    return entries[order]


class TimerIndex:
    """Pending timers in sorted runs. See the module docstring."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []
        self._heads: list[int] = []
        self._dead: set[int] = set()
        """Queue offsets removed (recalled) but still inside a run."""
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._runs)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def add(self, entries: np.ndarray) -> None:
        """Add timers (a TIMER_DTYPE array, any order)."""
        if not len(entries):
            return
        self._runs.append(_sorted(entries))
        self._heads.append(0)
        self._count += len(entries)
        self._merge()

    def _live(self, i: int) -> int:
        return len(self._runs[i]) - self._heads[i]

    def _merge(self) -> None:
        runs, heads = self._runs, self._heads
        while len(runs) >= 2 and self._live(-1) * 2 >= self._live(-2):
            b = runs.pop()[heads.pop() :]
            a = runs.pop()[heads.pop() :]
            runs.append(_sorted(np.concatenate((a, b))))
            heads.append(0)

    def next_due(self) -> int | None:
        """The earliest due time pending (None when nothing is)."""
        self._skip_dead_heads()
        best: int | None = None
        for run, head in zip(self._runs, self._heads, strict=True):
            if head < len(run):
                due = int(run["due"][head])
                if best is None or due < best:
                    best = due
        return best

    def _skip_dead_heads(self) -> None:
        """Step over removed timers at the head of a run (so the head is a pending one)."""
        if not self._dead:
            return
        dead = self._dead
        for i, run in enumerate(self._runs):
            head = self._heads[i]
            while head < len(run) and int(run["qoff"][head]) in dead:
                dead.discard(int(run["qoff"][head]))
                head += 1
            self._heads[i] = head
        self._drop_empty()

    def count_due(self, now_ms: int) -> int:
        """Timers due at or before ``now_ms`` (recalled ones not yet stepped over included)."""
        return sum(
            int(np.searchsorted(run["due"][head:], now_ms, side="right"))
            for run, head in zip(self._runs, self._heads, strict=True)
        )

    def min_qoff(self) -> int | None:
        """The lowest queue offset pending (a restart must read the queue from there)."""
        best: int | None = None
        for run, head in zip(self._runs, self._heads, strict=True):
            if head < len(run):
                low = int(run["qoff"][head:].min())
                best = low if best is None else min(best, low)
        return best

    def pop_due(self, now_ms: int, limit: int) -> np.ndarray:
        """Remove and return up to ``limit`` timers due at or before ``now_ms``: the first
        ones in (due, queue offset) order, every one of them before any left behind."""
        parts: list[np.ndarray] = []
        taken = 0
        while taken < limit:
            self._skip_dead_heads()
            part = self._take(now_ms, limit - taken)
            if not len(part):
                break
            if self._dead:
                dead = np.isin(part["qoff"], np.fromiter(self._dead, np.int64, len(self._dead)))
                if dead.any():
                    self._dead.difference_update(part["qoff"][dead].tolist())
                    part = part[~dead]
            self._count -= len(part)
            parts.append(part)
            taken += len(part)
        if not parts:
            return np.empty(0, TIMER_DTYPE)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _take(self, now_ms: int, limit: int) -> np.ndarray:
        """The first ``limit`` entries due by ``now_ms`` across runs, removed and merged."""
        cands: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        for i, (run, head) in enumerate(zip(self._runs, self._heads, strict=True)):
            n = int(np.searchsorted(run["due"][head:], now_ms, side="right"))
            n = min(n, limit)
            if n:
                cands.append(run[head : head + n])
                owners.append(np.full(n, i, dtype=np.int64))
        if not cands:
            return np.empty(0, TIMER_DTYPE)
        cand = np.concatenate(cands)
        owner = np.concatenate(owners)
        order = np.lexsort((cand["qoff"], cand["due"]))[:limit]
        for i, k in enumerate(np.bincount(owner[order], minlength=len(self._runs)).tolist()):
            self._heads[i] += k
        self._drop_empty()
        return cand[order]

    def _drop_empty(self) -> None:
        keep = [i for i in range(len(self._runs)) if self._heads[i] < len(self._runs[i])]
        if len(keep) != len(self._runs):
            self._runs = [self._runs[i] for i in keep]
            self._heads = [self._heads[i] for i in keep]

    def find(self, due: int, qoff: int) -> bool:
        """Whether the timer (due, qoff) is pending."""
        if qoff in self._dead:
            return False
        for run, head in zip(self._runs, self._heads, strict=True):
            dues = run["due"]
            lo = int(np.searchsorted(dues, due, side="left"))
            hi = int(np.searchsorted(dues, due, side="right"))
            lo = max(lo, head)
            if lo < hi and bool((run["qoff"][lo:hi] == qoff).any()):
                return True
        return False

    def remove(self, due: int, qoff: int) -> bool:
        """Take a pending timer out (a recall). False when it is not pending."""
        if not self.find(due, qoff):
            return False
        self._dead.add(qoff)
        self._count -= 1
        return True

    def remove_many(self, qoffs: np.ndarray) -> int:
        """Take out the pending timers with these queue offsets, whatever their due time
        (cancel markers replayed at a restart or seen after a recall). Returns how many."""
        if not len(qoffs):
            return 0
        removed = 0
        want = np.asarray(qoffs, dtype=np.int64)
        for run, head in zip(self._runs, self._heads, strict=True):
            hit = np.isin(run["qoff"][head:], want)
            for q in run["qoff"][head:][hit].tolist():
                if q not in self._dead:
                    self._dead.add(q)
                    removed += 1
        self._count -= removed
        return removed

    def clear(self) -> None:
        self._runs.clear()
        self._heads.clear()
        self._dead.clear()
        self._count = 0


def fired_mask(
    entries: np.ndarray, scan_offset: int, fired_due: int, fired_qoff: int
) -> np.ndarray:
    """Which timers the fire watermark covers: queue offset below ``scan_offset`` and
    (due, queue offset) at or before (``fired_due``, ``fired_qoff``)."""
    due = entries["due"]
    qoff = entries["qoff"]
    before = (due < fired_due) | ((due == fired_due) & (qoff <= fired_qoff))
    mask: np.ndarray = (qoff < scan_offset) & before
    return mask
