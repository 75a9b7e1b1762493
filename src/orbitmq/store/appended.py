"""Dispatch from what the append already knows, instead of decoding the records just written.

The appender has, for every record it writes, the topic, queue id, queue offset, physical
offset, size, store timestamp and the encoded properties (as they came off the wire). That is
everything a ConsumeQueue entry (physical offset, size, tag hash) and an IndexFile row (key
hash, physical offset, store timestamp) are made of. So the CommitLog hands each append to
the dispatcher as an :class:`Appended` (a few references, no copy of the bodies), and the
dispatcher's next round over that range builds the entries from it without reading the log
back (the brief's "inline dispatch from append metadata", docs/benchmarks.md).

The decode path stays the reference and the fallback: recovery, a slave's replicated bytes
and any range this list does not cover exactly are decoded as before. Encrypted stores are told
too (the sealed records' sizes and offsets with the plaintext properties: what the decoder gets
from the opened groups), so their dispatch decrypts and decodes nothing either. The
entries built here are byte-identical to the decoded ones (tests/store/test_dispatch.py): the
same property search (``property_value``: a name counts at the start or after ``\\x02``), the
same tag rule (CRC32C of TAGS; the timer topic's due time), the same key rows in the same order
(each record's KEYS, split on spaces, first occurrence kept, then its unique id).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import crc32c
import numpy as np

from orbitmq.common.message import property_value
from orbitmq.common.native import NATIVE
from orbitmq.common.record import MAGIC, PREFIX
from orbitmq.store.consume_queue import ENTRY_DTYPE
from orbitmq.store.timer_index import TIMER_TOPIC, timer_tag

_TAGS = b"TAGS\x01"
_KEYS = b"KEYS\x01"
_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"
_HASH_MASK = 0x7FFFFFFF
_TOLD_SMALL: (
    Callable[[list[bytes], list[int], int, int, bool, list[tuple[int, int, int]]], list[int] | None]
    | None
) = getattr(NATIVE, "told_small", None)
"""``_native.told_small``: ``_each_record``'s loop in C (an extension built before it lacks it)."""
MAX_PENDING = 4096
"""Appends remembered at most; past that (dispatch held back, e.g. by a replication confirm
offset) the list is dropped and those records are decoded."""

Groups = dict[tuple[str, int], list[tuple[int, np.ndarray]]]
Scan = Callable[
    [memoryview, np.ndarray, np.ndarray, list[int], list[str], np.ndarray, np.ndarray,
     np.ndarray, list[np.ndarray | list[tuple[int, int, int]]]],
    None,
]  # fmt: skip
"""The dispatcher's vectorized property search (``Dispatcher._scan_properties``)."""


@dataclass(slots=True)
class AppendedBatch:
    """One batch of an append: record i has queue offset ``first_queue_offset + i``."""

    topic: str
    queue_id: int
    first_queue_offset: int
    physical_offsets: list[int]
    sizes: list[int]
    properties: list[bytes]


@dataclass(slots=True)
class Appended:
    """The records one append wrote in [start, end) of the CommitLog (``start`` is where the
    log ended before it: a segment-end filler may sit before the first record)."""

    start: int
    end: int
    store_timestamp_ms: int
    batches: list[AppendedBatch]


class AppendedLog:
    """Appends not dispatched yet, in log order. Appenders push under the CommitLog's lock;
    the dispatcher takes them under its own round lock (deque operations are atomic)."""

    def __init__(self) -> None:
        self._items: deque[Appended] = deque()
        self.used = 0
        """Records dispatched from here (stats, tests)."""

    def push(self, item: Appended) -> None:
        if len(self._items) >= MAX_PENDING:
            self._items.clear()
        self._items.append(item)

    def clear(self) -> None:
        self._items.clear()

    def take(self, pos: int, end: int) -> Appended | None:
        """The append starting exactly at ``pos`` and ending by ``end``, if remembered (older
        ones, passed by a decoding round, are dropped)."""
        items = self._items
        # An appender may clear the list meanwhile (a push past MAX_PENDING): what is popped
        # is checked to be what was looked at; anything lost is decoded.
        try:
            head = items[0]
            while head.start < pos:
                items.popleft()
                head = items[0]
            if head.start != pos or head.end > end:
                return None
            got = items.popleft()
        except IndexError:
            return None
        return got if got is head else None

    def next_start(self) -> int | None:
        """Where the oldest remembered append starts (a decoding round stops there)."""
        try:
            return self._items[0].start
        except IndexError:
            return None


def matches(item: Appended, view_at: Callable[[int], tuple[memoryview, int, int] | None]) -> bool:
    """A cheap guard that the log still holds what was told (a cut and re-append would not):
    the first record's size, magic, queue id and queue offset, read where it was written
    (``view_at``: the CommitLog's; a segment-end filler may come before it)."""
    first = next((b for b in item.batches if b.sizes), None)
    if first is None:
        return True
    loc = view_at(first.physical_offsets[0])
    if loc is None or loc[1] + PREFIX.size > loc[2]:
        return False
    total, magic, _crc, qid, _flag, qoff = PREFIX.unpack_from(loc[0], loc[1])
    return bool(
        total == first.sizes[0]
        and magic == MAGIC
        and qid == first.queue_id
        and qoff == first.first_queue_offset
    )


def add_appended(
    item: Appended,
    groups: Groups,
    index_items: list[np.ndarray | list[tuple[int, int, int]]],
    prefix: Callable[[str], int],
    indexing: bool,
    scan: Scan,
    small: int,
) -> int:
    """Add the ConsumeQueue entries of ``item`` to ``groups`` and its index rows (arrays of
    key hash, physical offset, store timestamp) to ``index_items``, exactly as the decoder
    would. ``prefix`` is the dispatcher's topic -> CRC32C seed of ``"topic#"``; batches of
    ``small`` records or more go through ``scan`` (numpy over all their properties at once),
    smaller ones record by record. Returns the number of records."""
    count = 0
    rows: list[tuple[int, int, int]] = []
    for b in item.batches:
        n = len(b.sizes)
        if not n:
            continue
        count += n
        tags: np.ndarray | list[int]
        if n >= small:
            if rows:  # keep the index rows in log order
                index_items.append(rows)
                rows = []
            tags = _scan_batch(b, item.store_timestamp_ms, index_items, scan)
        else:
            tags = _each_record(b, item.store_timestamp_ms, rows, prefix, indexing)
        if n >= small:
            entries = np.empty(n, dtype=ENTRY_DTYPE)
            entries["phy"] = b.physical_offsets
            entries["size"] = b.sizes
            entries["tag"] = tags
        else:  # a few: one conversion of tuples is cheaper than three column writes
            entries = np.array(
                list(zip(b.physical_offsets, b.sizes, tags, strict=True)), dtype=ENTRY_DTYPE
            )
        groups.setdefault((b.topic, b.queue_id), []).append((b.first_queue_offset, entries))
    if rows:  # as a list: the IndexFile takes a few rows one by one anyway
        index_items.append(rows)
    return count


def _scan_batch(
    b: AppendedBatch,
    store_ts: int,
    index_items: list[np.ndarray | list[tuple[int, int, int]]],
    scan: Scan,
) -> np.ndarray:
    """A big batch: its properties joined into one buffer and searched as the decoder's
    vectorized path searches a block."""
    n = len(b.sizes)
    tags = np.zeros(n, dtype=np.int64)
    props = b.properties
    lens = np.fromiter(map(len, props), dtype=np.int64, count=n)
    if int(lens.max()) > 0:
        at = np.zeros(n, dtype=np.int64)
        np.cumsum(lens[:-1], out=at[1:])
        phys = np.array(b.physical_offsets, dtype=np.int64)
        times = np.full(n, store_ts, dtype=np.int64)
        scan(memoryview(b"".join(props)), at, lens, [0], [b.topic], phys, times, tags,
             index_items)  # fmt: skip
    if b.topic == TIMER_TOPIC:
        tags[:] = [timer_tag(p) for p in props]
    return tags


def _value(props: bytes, needle: bytes) -> bytes | None:
    """``property_value``, with its usual case inline (the name first or after a separator
    at its first occurrence): called three times per record."""
    at = props.find(needle)
    if at < 0:
        return None
    if at and props[at - 1] != 0x02:
        return property_value(props, needle)
    begin = at + len(needle)
    end = props.find(b"\x02", begin)
    return props[begin:end] if end >= 0 else props[begin:]


def _each_record(
    b: AppendedBatch,
    store_ts: int,
    rows: list[tuple[int, int, int]],
    prefix: Callable[[str], int],
    indexing: bool,
) -> list[int]:
    """A small batch, record by record (the decoder's small path); in C when built (the same
    searches and rows: tests/store/test_dispatch.py compares both with the decoder)."""
    crc = crc32c.crc32c
    topic = b.topic
    timer = topic == TIMER_TOPIC
    pre = prefix(topic) if indexing else 0
    if _TOLD_SMALL is not None and not timer:
        got = _TOLD_SMALL(b.properties, b.physical_offsets, store_ts, pre, indexing, rows)
        if got is not None:  # None: a KEYS value of many parts, left to the loop below
            return got
    tags: list[int] = []
    tag_of = tags.append
    row = rows.append
    for props, phy in zip(b.properties, b.physical_offsets, strict=True):
        if not props:
            tag_of(0)
            continue
        value = _value(props, _TAGS)
        tag_of(timer_tag(props) if timer else crc(value) if value else 0)
        if indexing:
            keys = _value(props, _KEYS)
            if keys:
                if b" " in keys:
                    rows.extend(
                        (crc(k, pre) & _HASH_MASK, phy, store_ts)
                        for k in dict.fromkeys(keys.split(b" "))
                        if k
                    )
                else:
                    row((crc(keys, pre) & _HASH_MASK, phy, store_ts))
            uniq = _value(props, _UNIQ)
            if uniq:
                row((crc(uniq, pre) & _HASH_MASK, phy, store_ts))
    return tags
