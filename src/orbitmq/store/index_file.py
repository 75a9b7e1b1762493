"""One IndexFile: a fixed-size file, mapped in full, holding a header, hash slots and entries.

The byte layout, the key hash and the file names are in :mod:`orbitmq.store.index_format`;
this module reads and writes one file. :class:`orbitmq.store.index_service.IndexService`
owns the files of a store and calls the underscore methods meant for it (``_put_hash``,
``_write_header``, ``_select_hash``).

Durability: the disk calls that can fail for reasons outside the program go through the
store's ``FileOps`` (``segment.py``), as the CommitLog's and ConsumeQueues' do, so the same
faults can be injected and surface as the same errors (``io_error``: DiskFullError on
ENOSPC, else StoreIOError). Files have their full length but are sparse: the header and the
slots (written anywhere) are reserved at creation, the entries (written in order)
``RESERVE_STEP`` bytes ahead of the newest one (``FileOps.reserve``), so every store through
the mmap lands on a reserved block, never on a hole of a full disk (SIGBUS); a reservation
that fails is a DiskFullError before anything is written. A new name gets a directory fsync;
``flush`` is an ``fdatasync`` (it also writes back pages dirtied through the mapping). A file
of the wrong size when loaded is resized before it is mapped and marked ``suspect``, as is one
whose header disagrees with itself or its newest entry, or whose blocks cannot be reserved.
``IndexService`` never appends to a suspect file: it starts a new one.

Threading: one thread at a time writes a file (``put_hash``, ``put_hashes``,
``truncate_from``: the dispatcher, through ``IndexService``, which serialises them); ``flush``
may come from any thread. Queries run concurrently with writes without a lock: a writer
stores the entry, then the in-memory entry count, then the slot (a batch: all its entries,
the count, then its slots), so a reader that sees a new slot value also sees the entry. A
query racing with the closing of a file returns what it found before the file was closed.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np

from orbitmq.common.errors import StoreClosedError, StoreError
from orbitmq.store.index_cut import entry_phy_and_diff, needs_cut, relink, surviving_count
from orbitmq.store.index_format import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    I32_MAX,
    SLOT,
    SLOT_SIZE,
    check_geometry,
    index_file_size,
    index_key_hash,
)
from orbitmq.store.segment import FileOps, io_error

__all__ = ["IndexFile"]

log = logging.getLogger(__name__)
_ZEROS: Final = bytes(64 * 1024)
RESERVE_STEP: Final = 4 * 1024 * 1024
"""Bytes of entries reserved at a time, ahead of the newest entry."""


class IndexFile:
    """One index file, mapped in full. See the module docstring for the layout and threading.

    ``create=True`` makes a new file (it must not exist) whose ``begin_timestamp_ms`` is the
    base of every entry's ``time_diff``; 0 means "take it from the first ``put``". With
    ``create=False`` the file is opened and its header read; a damaged header is clamped to
    sane values and the file marked ``suspect``, never rejected.

    Entries must be put in non-decreasing ``phy_offset`` order (dispatch order), which is what
    ``truncate_from`` relies on.
    """

    __slots__ = (
        "_begin_phy",
        "_begin_ts",
        "_closed",
        "_count",
        "_dirty",
        "_end_phy",
        "_end_ts",
        "_entries_at",
        "_fd",
        "_fs",
        "_lock",
        "_max",
        "_mm",
        "_reserved",
        "_size",
        "_slots",
        "_suspect",
        "_used",
        "path",
    )

    def __init__(
        self,
        path: Path,
        hash_slot_num: int,
        max_index_num: int,
        *,
        create: bool,
        begin_timestamp_ms: int = 0,
        fs: FileOps | None = None,
    ) -> None:
        check_geometry(hash_slot_num, max_index_num)
        self.path = Path(path)
        self._fs = fs or FileOps()
        self._slots = hash_slot_num
        self._max = max_index_num
        self._entries_at = HEADER_SIZE + SLOT_SIZE * hash_slot_num
        self._size = index_file_size(hash_slot_num, max_index_num)
        self._lock = threading.Lock()
        self._closed = False
        self._suspect = False
        self._dirty = False
        self._reserved = 0  # bytes from the start whose blocks are taken
        fd = self._create() if create else self._open_existing()
        try:
            self._mm = mmap.mmap(fd, self._size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if create:
            self._begin_ts = begin_timestamp_ms
            self._end_ts = begin_timestamp_ms
            self._begin_phy = self._end_phy = 0
            self._used = 0
            self._count = 1
            self._write_header()
        else:
            self._read_header()
            try:  # what is written has its blocks; this makes the bookkeeping say so
                self._ensure(self._entries_at + ENTRY_SIZE * (self._count + 1))
            except StoreError as exc:
                self._suspect = True  # never appended to: a new file is started instead
                log.warning("index file %s: cannot reserve its blocks (%s); read only",
                            self.path, exc)  # fmt: skip

    # -- opening ---------------------------------------------------------------------------

    def _create(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise io_error(f"creating index file {self.path}", exc) from exc
        try:
            self._fs.truncate(fd, self._size)
            first = min(self._size, self._entries_at + RESERVE_STEP)
            self._fs.reserve(fd, 0, first)
            self._reserved = first
        except OSError as exc:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise io_error(f"reserving blocks for index file {self.path}", exc) from exc
        return fd

    def _ensure(self, end: int) -> None:
        """Take the blocks up to ``end`` (and a step beyond) before the map is written there."""
        if end <= self._reserved:
            return
        upto = min(self._size, max(end, self._reserved + RESERVE_STEP))
        try:
            self._fs.reserve(self._fd, self._reserved, upto - self._reserved)
        except OSError as exc:
            raise io_error(f"reserving blocks for index file {self.path}", exc) from exc
        self._reserved = upto

    def _open_existing(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise io_error(f"opening index file {self.path}", exc) from exc
        try:
            actual = os.fstat(fd).st_size
            if actual < self._size:
                self._suspect = True
                log.warning(
                    "index file %s is %d bytes, expected %d (truncated?): extending it and "
                    "treating it as suspect",
                    self.path,
                    actual,
                    self._size,
                )
                self._fs.truncate(fd, self._size)
            elif actual > self._size:
                self._suspect = True
                log.warning(
                    "index file %s is %d bytes, expected %d (other geometry?): mapping the "
                    "first %d bytes and treating it as suspect",
                    self.path,
                    actual,
                    self._size,
                    self._size,
                )
        except OSError as exc:
            os.close(fd)
            raise io_error(f"sizing index file {self.path}", exc) from exc
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_header(self) -> None:
        bt, et, bp, ep, used, count = HEADER.unpack_from(self._mm, 0)
        if not 1 <= count <= self._max + 1:
            self._suspect = True
            log.warning(
                "index file %s: index_count %d outside 1..%d; clamped, file is suspect",
                self.path,
                count,
                self._max + 1,
            )
            count = min(max(count, 1), self._max + 1)
        else:
            problem = self._header_problem(bt, et, bp, ep, used, count)
            if problem:
                self._suspect = True
                log.warning("index file %s: %s; file is suspect", self.path, problem)
        self._begin_ts, self._end_ts, self._begin_phy, self._end_phy = bt, et, bp, ep
        self._used = min(max(used, 0), self._slots)
        self._count = count

    def _header_problem(self, bt: int, et: int, bp: int, ep: int, used: int, count: int) -> str:
        """Why the header disagrees with itself or with the newest entry ("" if it does not).

        A file that was last written by ``put`` or ``truncate_from`` always passes; a store
        clock that stepped back makes a false alarm, which only costs a new file.
        """
        if count == 1:
            if bt < 0 or et != bt or ep != bp or used != 0:
                return "header of an empty file is inconsistent"
            return ""
        key_hash, phy, diff, prev = ENTRY.unpack_from(
            self._mm, self._entries_at + ENTRY_SIZE * (count - 1)
        )
        if not 1 <= used <= min(count - 1, self._slots):
            return f"{used} slots in use for {count - 1} entries"
        if key_hash < 0 or not 0 <= prev < count - 1:
            return f"entry {count - 1} is damaged"
        if not 0 <= bp <= ep == phy:
            return f"offsets {bp}..{ep} disagree with entry {count - 1} at {phy}"
        if bt <= 0 or not 0 <= et - (bt + 1000 * diff) < 1000:
            return f"times {bt}..{et} disagree with entry {count - 1} (+{diff} s)"
        return ""

    def _write_header(self) -> None:
        HEADER.pack_into(
            self._mm,
            0,
            self._begin_ts,
            self._end_ts,
            self._begin_phy,
            self._end_phy,
            self._used,
            self._count,
        )
        self._dirty = True

    # -- properties ------------------------------------------------------------------------

    @property
    def is_full(self) -> bool:
        return self._count > self._max

    @property
    def index_count(self) -> int:
        """Number of the next entry to write: 1 + the number of entries held."""
        return self._count

    @property
    def begin_timestamp_ms(self) -> int:
        return self._begin_ts

    @property
    def end_timestamp_ms(self) -> int:
        return self._end_ts

    @property
    def begin_phy_offset(self) -> int:
        return self._begin_phy

    @property
    def end_phy_offset(self) -> int:
        return self._end_phy

    @property
    def hash_slot_count(self) -> int:
        """Slots in use (RocketMQ's ``hashSlotCount``); informational."""
        return self._used

    @property
    def suspect(self) -> bool:
        """True when loading found a wrong size or an impossible header."""
        return self._suspect

    @property
    def closed(self) -> bool:
        return self._closed

    # -- writing ---------------------------------------------------------------------------

    def put(self, key: str, phy_offset: int, store_timestamp_ms: int) -> bool:
        """Index ``key`` (already ``topic#key``) at ``phy_offset``. False when the file is full."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp_ms)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp_ms: int) -> bool:
        """Add one entry for a precomputed ``key_hash``. False when the file is full.

        The scalar reference path: ``put_hashes`` must leave exactly the bytes that calling
        this once per entry leaves.
        """
        if self._closed:
            raise StoreClosedError(f"index file {self.path} is closed")
        if not self._put_hash(key_hash, phy_offset, store_timestamp_ms):
            return False
        self._write_header()
        return True

    def put_hashes(
        self,
        hashes: np.ndarray[Any, Any],
        phys: np.ndarray[Any, Any],
        times: np.ndarray[Any, Any],
    ) -> int:
        """Add entries for precomputed key hashes in order; returns how many fitted.

        The entries fill the room left in the file (the caller starts a new file for the
        rest). The result is byte for byte what ``put_hash`` once per entry gives, without a
        Python loop per entry: the new entries get numbers c..c+k-1; within the batch an
        entry's ``prev_index`` is the number of the batch's previous entry in the same slot
        (a stable sort by slot puts each slot's entries next to each other, in order), and
        the first entry of a slot links to what the slot held before (when that is a valid
        older entry, as ``_put_hash`` decides); each slot then takes its last entry's number.
        Writes go entries (one copy), entry count, slots (one fancy assignment), header, so
        a concurrent reader that sees a new slot value also sees its entry.
        """
        if self._closed:
            raise StoreClosedError(f"index file {self.path} is closed")
        total = len(hashes)
        if len(phys) != total or len(times) != total:
            raise ValueError(f"put_hashes: {total} hashes, {len(phys)} offsets, {len(times)} times")
        c = self._count
        k = min(total, self._max + 1 - c)
        if k <= 0:
            return 0
        h = np.asarray(hashes[:k], dtype=np.int64)
        p = np.asarray(phys[:k], dtype=np.int64)
        t = np.asarray(times[:k], dtype=np.int64)
        if (h >> 31).any():
            raise ValueError("put_hashes: key hashes must be in 0..2**31-1")
        if c == 1:
            self._begin_phy = int(p[0])
            if self._begin_ts <= 0:
                self._begin_ts = int(t[0])
        # Sorting (slot << bits) | position is a stable sort by slot (positions are unique,
        # and slot < 2**31, k < 2**31 keep it below 2**62), several times faster than
        # argsort(kind="stable"); it yields both the slots in order and the permutation.
        bits = k.bit_length()
        keyed = np.sort(((h % self._slots) << bits) | np.arange(k, dtype=np.int64))
        by_slot = keyed >> bits
        numbers = (keyed & ((1 << bits) - 1)) + c  # entry numbers, in slot order
        starts = np.empty(k, dtype=bool)  # first entry of its slot in the batch
        starts[0] = True
        np.not_equal(by_slot[1:], by_slot[:-1], out=starts[1:])
        first = np.flatnonzero(starts)
        last = np.empty_like(first)  # last entry of its slot in the batch
        last[:-1] = first[1:] - 1
        last[-1] = k - 1
        prev_sorted = np.empty(k, dtype=np.int64)
        prev_sorted[1:] = numbers[:-1]
        entries = np.empty(k, dtype=ENTRY_DTYPE)
        entries["key_hash"] = h
        entries["phy_offset"] = p
        diff = (t - self._begin_ts) // 1000
        entries["time_diff"] = np.minimum(np.maximum(diff, 0, out=diff), I32_MAX, out=diff)
        self._ensure(self._entries_at + ENTRY_SIZE * (c + k))
        mm = self._mm
        slots: np.ndarray[Any, Any] = np.frombuffer(mm, ">i4", self._slots, HEADER_SIZE)
        try:
            first_slots = by_slot[first]
            heads = slots[first_slots].astype(np.int64)
            # as _put_hash: link to the slot's entry only if it is an older one
            prev_sorted[first] = np.where((heads > 0) & (heads < numbers[first]), heads, 0)
            self._used += int(np.count_nonzero(heads == 0))
            prev = np.empty(k, dtype=np.int64)
            prev[numbers - c] = prev_sorted
            entries["prev_index"] = prev
            at = self._entries_at + ENTRY_SIZE * c
            mm[at : at + ENTRY_SIZE * k] = entries.data
            self._count = c + k  # before the slots: a reader that sees a slot sees its entry
            slots[by_slot[last]] = numbers[last]
        finally:
            del slots
        self._end_phy = int(p[-1])
        self._end_ts = int(t[-1])
        self._write_header()
        return k

    def _put_hash(self, key_hash: int, phy_offset: int, store_timestamp_ms: int) -> bool:
        """The hot path: add one entry; the caller writes the header when its batch ends."""
        n = self._count
        if n > self._max:
            return False
        mm = self._mm
        slot_at = HEADER_SIZE + SLOT_SIZE * (key_hash % self._slots)
        old = SLOT.unpack_from(mm, slot_at)[0]
        if n == 1:
            self._begin_phy = phy_offset
            if self._begin_ts <= 0:
                self._begin_ts = store_timestamp_ms
        diff = (store_timestamp_ms - self._begin_ts) // 1000
        if diff < 0:
            diff = 0
        elif diff > I32_MAX:
            diff = I32_MAX
        end = self._entries_at + ENTRY_SIZE * (n + 1)
        if end > self._reserved:
            self._ensure(end)
        if 0 < old < n:
            prev = old
        else:
            prev = 0
            if old == 0:
                self._used += 1
        ENTRY.pack_into(mm, self._entries_at + ENTRY_SIZE * n, key_hash, phy_offset, diff, prev)
        self._count = n + 1  # before the slot: a reader that sees the slot sees the entry
        SLOT.pack_into(mm, slot_at, n)
        self._end_phy = phy_offset
        self._end_ts = store_timestamp_ms
        return True

    def truncate_from(self, phy_offset: int) -> int:
        """Drop the entries at or beyond ``phy_offset`` (recovery, a cut); returns how many.

        Torn pages cannot make it keep a stale entry or lose a survivor's key
        (:mod:`orbitmq.store.index_cut`): the survivors are the longest prefix of entries
        that look written and have non-decreasing offsets below ``phy_offset``; the count
        drops to them first (a concurrent reader never walks past it), the rest is zeroed, then
        every chain link and slot that disagrees with the survivors' key hashes is rewritten.
        When anything changed, the header's end values become the newest survivor's (its time
        to the second) or, with no survivor, the begin values.
        """
        if self._closed:
            raise StoreClosedError(f"index file {self.path} is closed")
        mm, at, top = self._mm, self._entries_at, self._count
        if needs_cut(mm, at, self._slots, top, phy_offset):
            n = surviving_count(mm, at, top, phy_offset)
            self._count = n
            self._zero_entries(n, top)
            self._used, repaired = relink(mm, at, self._slots, n)
            if repaired:
                log.warning("index file %s: %d chain links repaired", self.path, repaired)
            if n > 1:
                self._end_phy, diff = entry_phy_and_diff(mm, at, n - 1)
                self._end_ts = self._begin_ts + 1000 * diff
            else:
                self._end_phy, self._end_ts = self._begin_phy, self._begin_ts
        self._write_header()
        return top - self._count

    def _zero_entries(self, start: int, stop: int) -> None:
        at, end = self._entries_at + ENTRY_SIZE * start, self._entries_at + ENTRY_SIZE * stop
        while at < end:
            step = min(end - at, len(_ZEROS))
            self._mm[at : at + step] = _ZEROS[:step]
            at += step

    # -- reading ---------------------------------------------------------------------------

    def select(self, key: str, begin_ms: int, end_ms: int, max_num: int) -> list[int]:
        """Offsets of entries whose hash matches ``key`` and stored second overlaps the range.

        Newest first, without duplicates, at most ``max_num``. Collisions are possible: the
        caller checks the record. Returns what was found so far if the file is closed meanwhile.
        """
        out: list[int] = []
        if max_num > 0 and not self._closed:
            self._select_hash(index_key_hash(key), begin_ms, end_ms, max_num, out, set())
        return out

    def _select_hash(
        self,
        key_hash: int,
        begin_ms: int,
        end_ms: int,
        max_num: int,
        out: list[int],
        seen: set[int],
    ) -> None:
        mm = self._mm
        unpack = ENTRY.unpack_from
        try:
            i = SLOT.unpack_from(mm, HEADER_SIZE + SLOT_SIZE * (key_hash % self._slots))[0]
            n = self._count  # read after the slot (see put)
            # entry time t = begin_ts + 1000 * diff; it matches when t <= end and t + 999 >= begin
            base_ts = self._begin_ts
            low, high = begin_ms - 999 - base_ts, end_ms - base_ts
            entries_at = self._entries_at
            taken = 0
            while 0 < i < n:
                entry_hash, phy, diff, prev = unpack(mm, entries_at + ENTRY_SIZE * i)
                if entry_hash == key_hash and low <= 1000 * diff <= high and phy not in seen:
                    seen.add(phy)
                    out.append(phy)
                    taken += 1
                    if taken >= max_num:
                        return
                if prev >= i:  # a chain only goes back; anything else is damage
                    return
                i = prev
        except ValueError:  # "mmap closed or invalid": the file was closed under us
            if not self._closed:
                raise

    # -- lifecycle -------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the file if it changed since the last flush. Safe from any thread."""
        with self._lock:
            if self._closed or not self._dirty:
                return
            self._dirty = False
            try:
                self._fs.fdatasync(self._fd)
            except OSError as exc:
                self._dirty = True
                raise io_error(f"fsync of index file {self.path}", exc) from exc

    def close(self) -> None:
        """Unmap and close (no fsync: call ``flush`` first for durability). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._mm.close()
            finally:
                os.close(self._fd)

    def __repr__(self) -> str:
        return (
            f"IndexFile({self.path.name}, entries={self._count - 1}/{self._max}, "
            f"phy={self._begin_phy}..{self._end_phy}{', suspect' if self._suspect else ''})"
        )
