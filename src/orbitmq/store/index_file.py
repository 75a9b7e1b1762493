"""IndexFile and IndexService: a persistent hash index from message keys to CommitLog offsets.

A producer may tag a message with keys (the ``KEYS`` property) and every message carries a
unique id. ``query(topic, key)`` answers "which CommitLog offsets hold messages with this key?"
without scanning the log. The dispatcher feeds the index as records are appended; the files
follow the byte layout of RocketMQ's IndexFile (the key hash differs: CRC32C, not Java's
``String.hashCode``, so the files are not interchangeable with RocketMQ's).

Byte layout of one file (all integers big-endian, S = hash_slot_num, N = max_index_num)::

    offset 0                                                                       40
    +-------------+-------------+-------------+-------------+----------+----------+
    | begin_ts i64| end_ts i64  | begin_phy   | end_phy i64 | slot_cnt | idx_count|
    |   (ms)      |   (ms)      |   i64       |             |   i32    |   i32    |
    +-------------+-------------+-------------+-------------+----------+----------+
    offset 40: S hash slots of 4 bytes
    +---------+---------+-----+-----------+
    | slot 0  | slot 1  | ... | slot S-1  |   i32: number of the newest entry whose
    +---------+---------+-----+-----------+        key hash falls in the slot; 0 = empty
    offset E = 40 + 4*S: N + 1 entries of 20 bytes, entry i at E + 20*i
    +-----------+-----------+-----------+-----+-----------+
    | entry 0   | entry 1   | entry 2   | ... | entry N   |
    | (unused)  |           |           |     |           |
    +-----------+-----------+-----------+-----+-----------+
    one entry:
    +--------------+---------------+---------------+---------------+
    | key_hash i32 | phy_offset i64| time_diff i32 | prev_index i32|
    +--------------+---------------+---------------+---------------+

    file size = 40 + 4*S + 20*(N + 1)

* ``idx_count`` is the number of the next entry to write. It starts at 1: entry 0 is a
  20-byte hole that is never written, so that slot value 0 and ``prev_index`` 0 can mean
  "none". Entry numbering and positions are RocketMQ's (entry i at E + 20*i); unlike
  RocketMQ, the file is one entry longer so that a file really holds N entries
  (RocketMQ's holds N - 1). A file is full when ``idx_count == N + 1``.
* ``slot_cnt`` is, as in RocketMQ, the number of slots in use (informational only); the
  number of slots itself is configuration and is not stored.
* ``key_hash = crc32c(f"{topic}#{key}".encode()) & 0x7fffffff``; slot = key_hash % S. (Lone
  surrogates are encoded with ``surrogatepass`` so that no key can make dispatch raise.)
* ``time_diff`` is ``(store_timestamp_ms - begin_ts) // 1000`` clamped to [0, 2**31 - 1]: the
  file keeps each entry's store time to the second only. Time filters therefore err on the
  side of inclusion: an entry matches ``[begin_ms, end_ms]`` when the second it was stored in
  overlaps the range, so nothing stored inside the range is ever missed.
* ``prev_index`` links an entry to the previous (older) entry of the same slot: a slot and
  its chain form a linked list, newest first. Hash collisions share chains; a lookup keeps
  only entries whose full ``key_hash`` matches.
* Files are named after their creation time, ``yyyyMMddHHmmssSSS`` (17 digits, UTC so that
  names never go backwards across a DST change); names sort in creation order, and a name is
  bumped by a millisecond when the clock would not make it larger than the newest one.

Why no checksum, and why readers never trust the bytes: the index is *derived* data. Dispatch
rebuilds it from the CommitLog, and recovery truncates it back to what the CommitLog holds
(``truncate_from``). A lookup result is only a hint: callers read the record at the offset
and check its topic and keys themselves, because hash collisions are possible anyway. So a
damaged file costs at most missed or wrong hints, never an exception: every chain walk
follows only ``prev_index`` values that are strictly smaller than the current entry and
positive, and only entries below ``idx_count``, so a walk ends after at most ``idx_count``
steps whatever the bytes say.

Durability: the disk calls that can fail for reasons outside the program go through the
store's ``FileOps`` (``segment.py``), as the CommitLog's and ConsumeQueues' do, so the same
faults can be injected and surface as the same errors (``io_error``: DiskFullError on
ENOSPC, else StoreIOError). Files are created with ``FileOps.allocate`` (``posix_fallocate``)
to their full size so that a store through the mmap can never hit an unallocated block on a
full disk (SIGBUS); a new file's name is made durable with a directory fsync. ``flush`` is an
``fdatasync`` of the file (it releases the GIL; the size never changes after allocation, so
no metadata needs writing); on Linux it also writes back pages dirtied through the shared
mapping. A file found with the wrong size when loaded is extended to the full size (allocate,
else ftruncate) before it is mapped, so the map never reaches past EOF; it is logged and
marked ``suspect``, as is a file whose header disagrees with itself or with its newest entry.
``IndexService`` never appends to a suspect file: it starts a new one.

Threading: one thread (the dispatcher) makes all writes (``put_hashes``, ``build``,
``truncate_from``) and the caller serialises them; ``IndexService`` also holds a lock around
its own writes and file-list changes, so retention (``delete_below``) and ``flush`` may come
from other threads. Queries run concurrently with writes without a lock: a writer stores the
entry, then the in-memory entry count, then the slot (a batch: all its entries, the count,
then its slots), so a reader that sees a new slot value also sees the entry. A query racing
with the deletion of a file returns what it found before the file was closed.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import crc32c
import numpy as np

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import ConfigError, StoreClosedError, StoreError, StoreIOError
from orbitmq.common.files import fsync_dir
from orbitmq.store.segment import FileOps, io_error

__all__ = [
    "ENTRY_SIZE",
    "HEADER_SIZE",
    "SLOT_SIZE",
    "IndexFile",
    "IndexService",
    "index_file_size",
    "index_key_hash",
]

log = logging.getLogger(__name__)
_SMALL_BATCH = 16  # below this many entries, insert one by one

HEADER_SIZE: Final = 40
SLOT_SIZE: Final = 4
ENTRY_SIZE: Final = 20

_I32_MAX: Final = 2**31 - 1
_HASH_MASK: Final = 0x7FFFFFFF
_NAME_RE: Final = re.compile(r"\d{17}")

_HEADER: Final = struct.Struct(">qqqqii")
_SLOT: Final = struct.Struct(">i")
_ENTRY: Final = struct.Struct(">iqii")
_ENTRY_DTYPE: Final = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
assert _HEADER.size == HEADER_SIZE and _ENTRY.size == ENTRY_SIZE == _ENTRY_DTYPE.itemsize

_crc32c: Final[Callable[[bytes, int], int]] = crc32c.crc32c
_ZEROS: Final = bytes(64 * 1024)


def index_key_hash(key: str) -> int:
    """The 31-bit hash stored for ``key`` (the service passes ``f"{topic}#{key}"``)."""
    return _crc32c(key.encode("utf-8", "surrogatepass"), 0) & _HASH_MASK


def index_file_size(hash_slot_num: int, max_index_num: int) -> int:
    """Bytes of one index file: header, slots, and entries 0..max_index_num (0 is a hole)."""
    return HEADER_SIZE + SLOT_SIZE * hash_slot_num + ENTRY_SIZE * (max_index_num + 1)


def _check_geometry(hash_slot_num: int, max_index_num: int) -> None:
    if not 1 <= hash_slot_num <= _I32_MAX:
        raise ConfigError(f"hash_slot_num must be in 1..{_I32_MAX}, not {hash_slot_num}")
    if not 1 <= max_index_num < _I32_MAX:
        raise ConfigError(f"max_index_num must be in 1..{_I32_MAX - 1}, not {max_index_num}")


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
        _check_geometry(hash_slot_num, max_index_num)
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

    # -- opening ---------------------------------------------------------------------------

    def _create(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise io_error(f"creating index file {self.path}", exc) from exc
        try:
            self._fs.allocate(fd, self._size)
        except OSError as exc:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise io_error(
                f"allocating {self._size} bytes for index file {self.path}", exc
            ) from exc
        return fd

    def _open_existing(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreIOError(f"cannot open index file {self.path}: {exc}") from exc
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
                try:
                    self._fs.allocate(fd, self._size)
                except OSError:
                    os.ftruncate(fd, self._size)
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
            raise StoreIOError(f"cannot size index file {self.path}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_header(self) -> None:
        bt, et, bp, ep, used, count = _HEADER.unpack_from(self._mm, 0)
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
        key_hash, phy, diff, prev = _ENTRY.unpack_from(
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
        _HEADER.pack_into(
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
        entries = np.empty(k, dtype=_ENTRY_DTYPE)
        entries["key_hash"] = h
        entries["phy_offset"] = p
        diff = (t - self._begin_ts) // 1000
        entries["time_diff"] = np.minimum(np.maximum(diff, 0, out=diff), _I32_MAX, out=diff)
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
        old = _SLOT.unpack_from(mm, slot_at)[0]
        if n == 1:
            self._begin_phy = phy_offset
            if self._begin_ts <= 0:
                self._begin_ts = store_timestamp_ms
        diff = (store_timestamp_ms - self._begin_ts) // 1000
        if diff < 0:
            diff = 0
        elif diff > _I32_MAX:
            diff = _I32_MAX
        if 0 < old < n:
            prev = old
        else:
            prev = 0
            if old == 0:
                self._used += 1
        _ENTRY.pack_into(mm, self._entries_at + ENTRY_SIZE * n, key_hash, phy_offset, diff, prev)
        self._count = n + 1  # before the slot: a reader that sees the slot sees the entry
        _SLOT.pack_into(mm, slot_at, n)
        self._end_phy = phy_offset
        self._end_ts = store_timestamp_ms
        return True

    def truncate_from(self, phy_offset: int) -> int:
        """Drop the entries at or beyond ``phy_offset`` (crash recovery); returns how many.

        Entries are popped newest first while the newest one has ``phy_offset`` at or beyond
        the given offset, or is blank (``key_hash == 0 and phy_offset == 0``: a page that never
        reached the disk), or has a negative ``phy_offset`` (garbage). Popping stops at the
        first entry that is none of these. Each popped entry is unlinked from its slot and its
        bytes zeroed. If afterwards any slot points outside ``0..index_count-1`` (the header
        and the slot pages reached the disk at different times), all slots are rebuilt from
        the surviving entries with numpy: per slot, the newest entry wins (older entries keep
        their ``prev_index``, which was written before them). When anything changed, the
        header's end values become the newest survivor's (its time to the second) or, with no
        survivor, the begin values.
        """
        if self._closed:
            raise StoreClosedError(f"index file {self.path} is closed")
        mm = self._mm
        slot_unpack, slot_pack = _SLOT.unpack_from, _SLOT.pack_into
        top = n = self._count
        rebuild = False
        while n > 1:
            i = n - 1
            key_hash, phy, _diff, prev = _ENTRY.unpack_from(mm, self._entries_at + ENTRY_SIZE * i)
            if not (phy >= phy_offset or phy < 0 or (key_hash == 0 and phy == 0)):
                break
            if key_hash >= 0:
                slot_at = HEADER_SIZE + SLOT_SIZE * (key_hash % self._slots)
                if slot_unpack(mm, slot_at)[0] == i:
                    if 0 < prev < i:
                        slot_pack(mm, slot_at, prev)
                    else:
                        slot_pack(mm, slot_at, 0)
                        self._used = max(self._used - 1, 0)
                        rebuild = rebuild or prev != 0
            n = i
            self._count = n
        if n < top:
            self._zero_entries(n, top)
        slots: np.ndarray[Any, Any] = np.frombuffer(mm, ">i4", self._slots, HEADER_SIZE)
        try:
            rebuild = rebuild or bool(((slots < 0) | (slots >= n)).any())
        finally:
            del slots
        if rebuild:
            log.warning("index file %s: slots point past the entries; rebuilding them", self.path)
            self._rebuild_slots()
        if n < top or rebuild:
            if n > 1:
                _h, self._end_phy, diff, _p = _ENTRY.unpack_from(
                    mm, self._entries_at + ENTRY_SIZE * (n - 1)
                )
                self._end_ts = self._begin_ts + 1000 * diff
            else:
                self._end_phy, self._end_ts = self._begin_phy, self._begin_ts
        self._write_header()
        return top - n

    def _zero_entries(self, start: int, stop: int) -> None:
        at, end = self._entries_at + ENTRY_SIZE * start, self._entries_at + ENTRY_SIZE * stop
        while at < end:
            step = min(end - at, len(_ZEROS))
            self._mm[at : at + step] = _ZEROS[:step]
            at += step

    def _rebuild_slots(self) -> None:
        n = self._count
        newest = np.zeros(self._slots, dtype=np.int64)
        if n > 1:
            entries: np.ndarray[Any, Any] = np.frombuffer(
                self._mm, _ENTRY_DTYPE, n - 1, self._entries_at + ENTRY_SIZE
            )
            try:
                hashes = entries["key_hash"].astype(np.int64)
            finally:
                del entries
            numbers = np.arange(1, n, dtype=np.int64)
            valid = hashes >= 0
            np.maximum.at(newest, hashes[valid] % self._slots, numbers[valid])
        slots: np.ndarray[Any, Any] = np.frombuffer(self._mm, ">i4", self._slots, HEADER_SIZE)
        try:
            slots[:] = newest
        finally:
            del slots
        self._used = int(np.count_nonzero(newest))

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
        unpack = _ENTRY.unpack_from
        try:
            i = _SLOT.unpack_from(mm, HEADER_SIZE + SLOT_SIZE * (key_hash % self._slots))[0]
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


def _format_name(ms: int) -> str:
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return f"{moment:%Y%m%d%H%M%S}{ms % 1000:03d}"


def _name_after(name: str) -> str:
    """The name one millisecond after ``name`` (or the next integer if it is no date)."""
    try:
        moment = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
        return _format_name(int(moment.timestamp()) * 1000 + int(name[14:]) + 1)
    except (ValueError, OverflowError, OSError):
        return str(int(name) + 1).zfill(17)


class IndexService:
    """All index files of a store directory; the dispatcher feeds it, queries read it.

    Call ``load()`` once before anything else. Writes (``build``, ``build_many``,
    ``truncate_from``, ``delete_below``, ``close``) take an internal lock; ``query`` and
    ``flush`` do not block on it.
    """

    def __init__(
        self,
        directory: Path,
        hash_slot_num: int,
        max_index_num: int,
        *,
        clock: Callable[[], int] = now_ms,
        fs: FileOps | None = None,
    ) -> None:
        _check_geometry(hash_slot_num, max_index_num)
        self.directory = Path(directory)
        self._fs = fs or FileOps()
        self._slots = hash_slot_num
        self._max = max_index_num
        self._clock = clock
        self._lock = threading.Lock()
        self._files: tuple[IndexFile, ...] = ()  # oldest first; replaced, never mutated
        self._current: IndexFile | None = None  # the newest file, if it accepts entries
        self._prefixes: dict[str, int] = {}  # topic -> crc32c of f"{topic}#"
        self._loaded = False
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index service {self.directory} is closed")
        if not self._loaded:
            raise StoreError(f"index service {self.directory}: load() has not been called")

    def _prefix(self, topic: str) -> int:
        crc = self._prefixes.get(topic)
        if crc is None:
            if len(self._prefixes) >= 65_536:
                self._prefixes.clear()
            crc = _crc32c(f"{topic}#".encode("utf-8", "surrogatepass"), 0)
            self._prefixes[topic] = crc
        return crc

    def _set_files(self, files: Sequence[IndexFile]) -> None:
        self._files = tuple(files)
        newest = self._files[-1] if self._files else None
        self._current = (
            newest if newest is not None and not newest.is_full and not newest.suspect else None
        )

    def _roll(self, begin_timestamp_ms: int) -> IndexFile:
        old = self._current
        if old is not None:
            old._write_header()
        name = _format_name(self._clock())
        if self._files and name <= self._files[-1].path.name:
            name = _name_after(self._files[-1].path.name)
        self.directory.mkdir(parents=True, exist_ok=True)
        new = IndexFile(
            self.directory / name,
            self._slots,
            self._max,
            create=True,
            begin_timestamp_ms=begin_timestamp_ms,
            fs=self._fs,
        )
        try:
            fsync_dir(self.directory)  # the new name must survive a power cut, like the data
        except OSError as exc:
            self._delete(new)
            raise io_error(f"creating index file {new.path}", exc) from exc
        self._set_files((*self._files, new))
        log.debug("index: new file %s", new.path)
        return new

    @staticmethod
    def _delete(index_file: IndexFile) -> None:
        index_file.close()
        index_file.path.unlink(missing_ok=True)

    # -- API -------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the existing files, sorted by name. Damaged files load as well (see IndexFile)."""
        with self._lock:
            if self._closed:
                raise StoreClosedError(f"index service {self.directory} is closed")
            if self._loaded:
                raise StoreError(f"index service {self.directory} is already loaded")
            self.directory.mkdir(parents=True, exist_ok=True)
            paths = sorted(
                p for p in self.directory.iterdir() if _NAME_RE.fullmatch(p.name) and p.is_file()
            )
            files: list[IndexFile] = []
            try:
                for path in paths:
                    opened = IndexFile(path, self._slots, self._max, create=False, fs=self._fs)
                    files.append(opened)
            except BaseException:
                for f in files:
                    f.close()
                raise
            self._set_files(files)
            self._loaded = True

    def build(
        self,
        topic: str,
        keys: Sequence[str],
        uniq_key: str | None,
        phy_offset: int,
        store_timestamp_ms: int,
    ) -> None:
        """Index ``topic#key`` for each non-empty key and ``topic#uniq_key`` (duplicates once)."""
        self.build_many(((topic, keys, uniq_key, phy_offset, store_timestamp_ms),))

    def build_many(self, items: Iterable[tuple[str, Sequence[str], str | None, int, int]]) -> None:
        """``build`` for a batch, in order: (topic, keys, uniq_key, phy_offset, timestamp_ms).

        Rolls to a new file whenever the current one is full. A plain ``str`` as ``keys`` is a
        TypeError (it would index each character); split KEYS before calling. If an item fails
        (say, a new file cannot be created), the entries before it stay indexed; indexing them
        again later is harmless, queries deduplicate. The hashes are computed here and go in
        through the same batch path as ``put_hashes``.
        """
        with self._lock:
            self._check_ready()
            crc = _crc32c
            prefixes = self._prefixes
            hashes: list[int] = []
            phys: list[int] = []
            times: list[int] = []
            try:
                for topic, keys, uniq_key, phy_offset, timestamp in items:
                    if isinstance(keys, str):
                        raise TypeError("keys must be a sequence of keys, not a str")
                    prefix = prefixes.get(topic)
                    if prefix is None:
                        prefix = self._prefix(topic)
                    if not uniq_key:
                        todo: Iterable[str] = keys if len(keys) <= 1 else dict.fromkeys(keys)
                    elif not keys:
                        todo = (uniq_key,)
                    else:
                        todo = dict.fromkeys((*keys, uniq_key))
                    for key in todo:
                        if not key:
                            continue
                        hashes.append(
                            crc(key.encode("utf-8", "surrogatepass"), prefix) & _HASH_MASK
                        )
                        phys.append(phy_offset)
                        times.append(timestamp)
            finally:  # what was hashed before a failure is still indexed
                if hashes:
                    self._put_arrays(
                        np.array(hashes, dtype=np.int64),
                        np.array(phys, dtype=np.int64),
                        np.array(times, dtype=np.int64),
                    )

    def put_hashes(self, items: Sequence[tuple[int, int, int]] | np.ndarray[Any, Any]) -> None:
        """Insert precomputed (key_hash, phy_offset, timestamp_ms) entries in order.

        ``key_hash`` must be ``crc32c(f"{topic}#{key}") & 0x7fffffff`` (what ``query`` looks
        for; the dispatcher computes it from the raw key bytes, seeded with the CRC of
        ``f"{topic}#"``, which is the same number). ``items`` may also be an integer array of
        shape (n, 3), which saves the conversion of the tuples (about half the time of a
        batch). Rolls to a new file whenever the current one is full; entries that went in
        before a failure stay indexed.
        """
        with self._lock:
            self._check_ready()
            n = len(items)
            if n == 0:
                return
            if n < _SMALL_BATCH and not isinstance(items, np.ndarray):
                # numpy's fixed cost outweighs a few entries
                if any(not 0 <= row[0] <= _HASH_MASK for row in items):
                    raise ValueError("put_hashes: key hashes must be in 0..2**31-1")
                self._put_rows(items)
                return
            if isinstance(items, np.ndarray):
                if items.ndim != 2 or items.shape[1] != 3:
                    raise ValueError(f"put_hashes: an array must be (n, 3), not {items.shape}")
                table = items.astype(np.int64, copy=False)
            else:
                chain = itertools.chain.from_iterable(items)
                table = np.fromiter(chain, dtype=np.int64, count=3 * n).reshape(n, 3)
            self._put_arrays(table[:, 0], table[:, 1], table[:, 2])

    def _put_rows(self, rows: Sequence[Sequence[int]]) -> None:
        current = self._current
        try:
            for key_hash, phy_offset, timestamp in rows:
                if current is None or not current._put_hash(key_hash, phy_offset, timestamp):
                    current = self._roll(timestamp)
                    current._put_hash(key_hash, phy_offset, timestamp)
        finally:
            if current is not None:
                current._write_header()

    def _put_arrays(
        self,
        hashes: np.ndarray[Any, Any],
        phys: np.ndarray[Any, Any],
        times: np.ndarray[Any, Any],
    ) -> None:
        """Fill the current file, then new ones, with the entries (the lock is held)."""
        n = len(hashes)
        done = 0
        current = self._current
        while done < n:
            if current is None or current.is_full:
                current = self._roll(int(times[done]))
                if current.is_full:  # cannot happen: max_index_num >= 1
                    raise StoreError(f"index: new file {current.path} takes no entries")
            done += current.put_hashes(hashes[done:], phys[done:], times[done:])

    def query(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[int]:
        """CommitLog offsets of messages indexed under ``topic#key``, newest files first.

        Deduplicated, at most ``max_num``; an entry matches the time range when the second it
        was stored in overlaps ``[begin_ms, end_ms]``. Hash collisions are possible: callers
        read each record and check its topic and keys.
        """
        self._check_ready()
        out: list[int] = []
        if max_num <= 0 or not key or begin_ms > end_ms:
            return out
        key_hash = _crc32c(key.encode("utf-8", "surrogatepass"), self._prefix(topic)) & _HASH_MASK
        seen: set[int] = set()
        for f in reversed(self._files):
            # every entry's time is at least the file's begin timestamp
            if f.index_count <= 1 or end_ms < f.begin_timestamp_ms:
                continue
            f._select_hash(key_hash, begin_ms, end_ms, max_num - len(out), out, seen)
            if len(out) >= max_num:
                break
        return out

    def truncate_from(self, phy_offset: int) -> int:
        """Recovery: drop every entry at or beyond ``phy_offset``; returns how many were dropped.

        Files left without entries (those that began at or beyond the offset) are deleted.
        """
        with self._lock:
            self._check_ready()
            dropped = 0
            keep: list[IndexFile] = []
            empty: list[IndexFile] = []
            for f in self._files:
                dropped += f.truncate_from(phy_offset)
                (keep if f.index_count > 1 else empty).append(f)
            self._set_files(keep)
            for f in empty:
                log.info("index: deleting %s, which holds nothing below %d", f.path, phy_offset)
                self._delete(f)
            return dropped

    def delete_below(self, min_phy_offset: int) -> list[Path]:
        """Retention: delete the files whose entries all lie below ``min_phy_offset``.

        The newest file is always kept. Returns the deleted paths.
        """
        with self._lock:
            self._check_ready()
            if len(self._files) <= 1:
                return []
            gone = [f for f in self._files[:-1] if f.end_phy_offset < min_phy_offset]
            if not gone:
                return []
            self._set_files([f for f in self._files if f not in gone])
            for f in gone:
                log.info("index: deleting %s, all below %d", f.path, min_phy_offset)
                self._delete(f)
            return [f.path for f in gone]

    def flush(self) -> None:
        """fsync every file changed since the last flush (does not block ``build``)."""
        for f in self._files:
            f.flush()

    def close(self) -> None:
        """Flush and close every file. Idempotent; raises the first flush error, if any."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            files, self._files, self._current = self._files, (), None
        error: BaseException | None = None
        for f in files:
            try:
                f.flush()
            except StoreIOError as exc:
                error = error or exc
            finally:
                f.close()
        if error is not None:
            raise error

    @property
    def max_phy_offset(self) -> int:
        """``end_phy_offset`` of the newest file holding entries, or 0."""
        for f in reversed(self._files):
            if f.index_count > 1:
                return f.end_phy_offset
        return 0

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files, oldest first."""
        return tuple(f.path for f in self._files)
