"""The IndexFile format: a persistent hash index from message keys to CommitLog offsets.

A producer may tag a message with keys (the ``KEYS`` property) and every message carries a
unique id. ``query(topic, key)`` answers "which CommitLog offsets hold messages with this key?"
without scanning the log. The dispatcher feeds the index as records are appended; the files
follow the byte layout of RocketMQ's IndexFile (the key hash differs: CRC32C, not Java's
``String.hashCode``, so the files are not interchangeable with RocketMQ's).

This module is the format: the byte layout, the key hash, the geometry and the file names.
One mapped file is :class:`orbitmq.store.index_file.IndexFile`; all files of a store are
:class:`orbitmq.store.index_service.IndexService`.

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
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import crc32c
import numpy as np

from orbitmq.common.errors import ConfigError

HEADER_SIZE: Final = 40
SLOT_SIZE: Final = 4
ENTRY_SIZE: Final = 20

I32_MAX: Final = 2**31 - 1
HASH_MASK: Final = 0x7FFFFFFF
NAME_RE: Final = re.compile(r"\d{17}")
"""An index file's name: its creation time, ``yyyyMMddHHmmssSSS`` (UTC)."""

HEADER: Final = struct.Struct(">qqqqii")
SLOT: Final = struct.Struct(">i")
ENTRY: Final = struct.Struct(">iqii")
ENTRY_DTYPE: Final = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
assert HEADER.size == HEADER_SIZE and ENTRY.size == ENTRY_SIZE == ENTRY_DTYPE.itemsize

crc32c_seeded: Final[Callable[[bytes, int], int]] = crc32c.crc32c
"""``crc32c(data, seed)``: a key's hash continues the CRC of its ``topic#`` prefix."""


def index_key_hash(key: str) -> int:
    """The 31-bit hash stored for ``key`` (the service passes ``f"{topic}#{key}"``)."""
    return crc32c_seeded(key.encode("utf-8", "surrogatepass"), 0) & HASH_MASK


def index_file_size(hash_slot_num: int, max_index_num: int) -> int:
    """Bytes of one index file: header, slots, and entries 0..max_index_num (0 is a hole)."""
    return HEADER_SIZE + SLOT_SIZE * hash_slot_num + ENTRY_SIZE * (max_index_num + 1)


def check_geometry(hash_slot_num: int, max_index_num: int) -> None:
    """ConfigError unless slot and entry numbers fit the file's i32 fields."""
    if not 1 <= hash_slot_num <= I32_MAX:
        raise ConfigError(f"hash_slot_num must be in 1..{I32_MAX}, not {hash_slot_num}")
    if not 1 <= max_index_num < I32_MAX:
        raise ConfigError(f"max_index_num must be in 1..{I32_MAX - 1}, not {max_index_num}")


def format_name(ms: int) -> str:
    """The name of a file created at ``ms``: ``yyyyMMddHHmmssSSS``, UTC."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return f"{moment:%Y%m%d%H%M%S}{ms % 1000:03d}"


def name_after(name: str) -> str:
    """The name one millisecond after ``name`` (or the next integer if it is no date)."""
    try:
        moment = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
        return format_name(int(moment.timestamp()) * 1000 + int(name[14:]) + 1)
    except (ValueError, OverflowError, OSError):
        return str(int(name) + 1).zfill(17)
