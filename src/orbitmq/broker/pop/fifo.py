"""FIFO Pop: the per-queue window that keeps message groups in order (docs/fifo.md).

An ordinary pop moves the group's offset past every message it hands out and relies on revive
copying un-acked ones to the retry topic. A FIFO pop cannot: the next message of a message group
must wait until the previous one is acked, so messages are handed out *out of offset order*
across groups, and an un-acked one is retried in place. So for FIFO the group's consumer offset
is only the **base** of a window: every message below it is finished (acked, dead-lettered or
rejected by the filter); above it, up to ``pop_fifo_window`` messages, the window knows which
offsets are

* **in flight**: handed out by an open CK entry (``inflight``: offset -> (ck id, index)), and
* **done**: finished, but not yet part of the contiguous prefix the base moves over,

and how often each unfinished offset has been delivered (``attempts``). Everything else in the
window is visible. A pop walks the window, blocks the message group of every in-flight message
(in-flight messages are always the oldest unfinished message of their group), and hands out at
most one message per group that is not blocked. The window is rebuilt at restart from the
revive log: a FIFO CK marks its offsets in flight (with their attempts), an ACK marks them
done. Filter rejections are kept in memory only (a restart filters those messages again).

A pop does not rescan the window from its base each time: ``scan_from`` is where the next walk
starts. Every offset between the base and it was found done, in flight, or of a group with a
message in flight, and only the end of an in-flight message (ack, dead-letter, or its invisible
time running out) can make such an offset deliverable again: its group's later messages and
(released) itself, all at or above it. So those events move ``scan_from`` back to the message's
offset (:meth:`FifoWindow.rewind`), a rebase sets it to the new base, and a walk that ends
moves it to where the walk stopped. The groups of in-flight messages are kept
(``group_of``/``busy``, learned when a walk picks or meets them) so a walk that starts past
them still blocks those groups; in-flight offsets whose group is not known yet (replayed at
restart) make the walk start at the lowest of them.

Everything here runs on the event loop; :class:`~orbitmq.broker.pop.state.PopState` owns the
windows and applies CKs and ACKs to them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c

from orbitmq.common.message import PROPERTY_SHARDING_KEY, property_value
from orbitmq.common.record import CRC_START, properties_slice

WindowKey = tuple[str, str, int]
"""(consumer group, topic, queue id)."""

_GROUP_NEEDLE = PROPERTY_SHARDING_KEY.encode() + b"\x01"
_RECONSUME_AT = 72
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")


def message_group(record: memoryview) -> bytes:
    """A stored record's message group (``__SHARDINGKEY``), raw. A message without one belongs
    to the queue's unnamed group ``b""``: such messages keep their queue order among
    themselves, as an orderly queue would."""
    props = properties_slice(record, 0)[1]
    if not len(props):
        return b""
    value = property_value(bytes(props), _GROUP_NEEDLE)
    return value if value is not None else b""


def with_attempt(record: memoryview, attempt: int) -> bytes:
    """A copy of a stored record whose RECONSUME_TIMES says ``attempt - 1`` (CRC redone), so
    a client reports the in-place redelivery's attempt like any retried message's."""
    buf = bytearray(record)
    _I32.pack_into(buf, _RECONSUME_AT, max(0, attempt - 1))
    _U32.pack_into(buf, 8, crc32c.crc32c(memoryview(buf)[CRC_START:]))
    return bytes(buf)


@dataclass(slots=True)
class FifoWindow:
    base: int = -1
    """The group's consumer offset of the queue: every offset below is finished. -1 while
    unknown (during restart replay, before the service sets it)."""
    inflight: dict[int, tuple[int, int]] = field(default_factory=dict)
    """offset -> (ck id, index) of the CK entry that holds it; only that entry's ack or
    expiry changes it (a change_invisible_duration's new CK takes it over)."""
    done: set[int] = field(default_factory=set)
    """Finished offsets at or above ``base``."""
    attempts: dict[int, int] = field(default_factory=dict)
    """Deliveries so far of unfinished offsets that were delivered at least once."""
    pins: list[tuple[int, int]] = field(default_factory=list)
    """(highest queue offset, revive-log offset) of every CK that handed out offsets here:
    the restart checkpoint must not pass a CK still covering offsets at or above ``base``
    (replay rebuilds ``done`` and ``attempts`` from them)."""
    scan_from: int = -1
    """Where the next walk starts (at or below: see the module docstring)."""
    rewound: int | None = None
    """The lowest offset :meth:`rewind` was given since the current walk began (None: none);
    a walk that ends keeps ``scan_from`` at or below it."""
    group_of: dict[int, bytes] = field(default_factory=dict)
    """In-flight offset -> its message group, where known."""
    busy: dict[bytes, int] = field(default_factory=dict)
    """Message group -> in-flight messages of it whose offset is in ``group_of``."""

    def deliver(self, offset: int, ck_id: int, index: int, attempt: int) -> None:
        self.inflight[offset] = (ck_id, index)
        self.done.discard(offset)
        if attempt > self.attempts.get(offset, 0):
            self.attempts[offset] = attempt

    def note_group(self, offset: int, group: bytes) -> None:
        """``offset``, in flight, is of ``group`` (learned by a walk)."""
        if offset in self.inflight and offset not in self.group_of:
            self.group_of[offset] = group
            self.busy[group] = self.busy.get(group, 0) + 1

    def _ended(self, offset: int) -> None:
        """An in-flight message ended: its group (and, released, itself) may go again."""
        del self.inflight[offset]
        group = self.group_of.pop(offset, None)
        if group is not None:
            left = self.busy[group] - 1
            if left:
                self.busy[group] = left
            else:
                del self.busy[group]
        self.rewind(offset)

    def rewind(self, offset: int) -> None:
        """Offsets from ``offset`` on may be deliverable again: the next walk starts there."""
        self.scan_from = min(self.scan_from, offset)
        self.rewound = offset if self.rewound is None else min(self.rewound, offset)

    def next_scan(self) -> int:
        """Where the next walk would start."""
        start = max(self.scan_from, self.base)
        if len(self.group_of) < len(self.inflight):  # groups not known yet (restart)
            start = min(start, *(o for o in self.inflight if o not in self.group_of))
        return start

    def scan_start(self) -> int:
        """A walk begins (one at a time, under the queue's lock): where it starts; rewinds
        are recorded from now on."""
        self.rewound = None
        return self.next_scan()

    def scanned_to(self, offset: int) -> None:
        """A walk (its picks stored) proved every offset below ``offset`` not deliverable
        now; rewinds during the walk still count."""
        self.scan_from = offset if self.rewound is None else min(offset, self.rewound)
        self.rewound = None

    def ack(self, offset: int, ck_id: int, index: int) -> bool:
        """The entry holding ``offset`` was acked (or dead-lettered): finished. False when
        another entry holds it now (replaced) or it was never held."""
        if self.inflight.get(offset) != (ck_id, index):
            return False
        self._ended(offset)
        self.attempts.pop(offset, None)
        self.done.add(offset)
        return True

    def release(self, offset: int, ck_id: int, index: int) -> bool:
        """The entry's invisible time ended un-acked: visible again, in place."""
        if self.inflight.get(offset) != (ck_id, index):
            return False
        self._ended(offset)
        return True

    def skip(self, offset: int) -> None:
        """Finished without a delivery (the filter rejected it, or its record is unreadable)."""
        if offset >= self.base and offset not in self.inflight:
            self.done.add(offset)

    def advance(self) -> int:
        """Move the base over the finished prefix; returns the new base."""
        base, done = self.base, self.done
        while base in done:
            done.discard(base)
            self.attempts.pop(base, None)
            base += 1
        self.base = base
        return base

    def rebase(self, offset: int) -> None:
        """The consumer offset was set from outside (reset, commit, first use, restart):
        forget what is below it; moved back, forget what was finished (it is to be consumed
        again). In-flight entries stay: their messages are out."""
        if offset < self.base:
            self.done.clear()
        else:
            self.done = {o for o in self.done if o >= offset}
            self.attempts = {o: n for o, n in self.attempts.items() if o >= offset}
        self.base = offset
        self.rewind(offset)
        self.scan_from = offset

    def earliest(self) -> int | None:
        """The lowest offset this window knows anything about (for a base never persisted)."""
        known = [*self.inflight, *self.done, *self.attempts]
        return min(known) if known else None

    def floor(self) -> int | None:
        """The lowest revive-log offset of a CK covering offsets at or above the base; drops
        the pins below it."""
        if self.base >= 0:
            self.pins = [p for p in self.pins if p[0] >= self.base]
        return min((p[1] for p in self.pins), default=None)

    @property
    def idle(self) -> bool:
        return not (self.inflight or self.done or self.attempts or self.pins)
