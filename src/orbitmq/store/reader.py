"""Reads by queue offset: the ConsumeQueue says where, the CommitLog holds the bytes.

Every record served is checked against the entry that points at it (size, magic, queue id,
queue offset, topic); records written before the store's current start also pass their CRC.
A record failing a check is skipped and reported, never served. Chunks of entries are checked
with numpy gathers over the mapped segments; small chunks (a consumer asking for a few
messages) one by one, where numpy's fixed cost would dominate. Both paths are tested to give
identical results.

A read takes a :class:`ReadView` (the CommitLog, the ConsumeQueues, the per-topic limits and
the CRC boundary), not the store: the store builds one view and passes it on every read.
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import crc32c
import numpy as np

from orbitmq.common.message import decode_properties, tag_hash
from orbitmq.common.record import (
    CRC_START,
    HEADER_SIZE,
    MAGIC,
    PREFIX,
    STORE_TIMESTAMP,
    STORE_TIMESTAMP_OFFSET,
    U16,
    U32,
    properties_slice,
)
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    ConsumeQueue,
    ConsumeQueueTable,
)
from orbitmq.store.segment import Segment

log = logging.getLogger(__name__)
_MIN_RECORD = HEADER_SIZE + 4  # check_record's smallest valid total size
SMALL_READ = 48  # up to this many ConsumeQueue entries, check them one by one
_BODY_LENGTH_OFFSET = 84


_HEADER_DTYPE = np.dtype(
    {
        "names": ["total", "magic", "crc", "queue_id", "queue_offset", "store_ts", "body_len"],
        "formats": [">i4", ">u4", ">u4", ">i4", ">i8", ">i8", ">i4"],
        "offsets": [0, 4, 8, 12, 20, STORE_TIMESTAMP_OFFSET, _BODY_LENGTH_OFFSET],
        "itemsize": HEADER_SIZE,
    }
)
"""The header fields a read checks, as one numpy record: one gather fetches them all."""


def _at_every_byte(raw: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """``raw`` seen (zero-copy) as one ``dtype`` item starting at every byte: indexing it with
    record positions gathers a field, or a whole header, in one numpy step."""
    dt = np.dtype(dtype)
    count = max(0, len(raw) - dt.itemsize + 1)
    if count == 0:
        return np.zeros(0, dtype=dt)
    return np.ndarray((count,), dtype=dt, buffer=raw, strides=(1,))


def _topic_matches(
    raw: np.ndarray, pos: np.ndarray, sizes: np.ndarray, topic: np.ndarray, body: np.ndarray
) -> np.ndarray:
    """Which records at ``pos`` (``sizes`` bytes each, inside ``raw``, body lengths ``body``)
    carry ``topic``.

    The ConsumeQueue entry has no topic, so a damaged entry could point at another topic's
    record with the same queue id, queue offset and size; this tells them apart.
    """
    n = len(topic)
    t_at = pos + HEADER_SIZE + body.astype(np.int64)
    fits = (body >= 0) & (t_at + 2 + n <= pos + sizes)
    every = bool(fits.all())
    if not every and not fits.any():
        return np.zeros(len(pos), dtype=bool)
    at = t_at if every else t_at[fits]
    same: np.ndarray = _at_every_byte(raw, ">u2")[at] == n
    if n:
        same &= _at_every_byte(raw, f"V{n}")[at + 2] == np.void(topic.tobytes())
    if every:
        return same
    out = np.zeros(len(pos), dtype=bool)
    out[fits] = same
    return out


class GetStatus(enum.Enum):
    """Outcome of a read, RocketMQ's GetMessageStatus names."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"


@dataclass(slots=True)
class GetResult:
    """Records are zero-copy views of the CommitLog; ``queue_offsets[i]`` is record i's offset.
    ``next_begin_offset`` is where the next read should start. ``skipped`` lists offsets whose
    record failed its checks and was not served.

    ``body_parts`` hold the records as few views as possible (one per run of records that lie
    back to back in the CommitLog, as a batch's records do): what a pull sends on, with no
    per-record work. ``messages`` cuts them into one view per record, on first use.
    """

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    body_parts: list[memoryview] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    _messages: list[memoryview] | None = None

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    @property
    def messages(self) -> list[memoryview]:
        if self._messages is None or len(self._messages) != len(self.sizes):
            out: list[memoryview] = []
            sizes = iter(self.sizes)
            for part in self.body_parts:
                at, end = 0, len(part)
                while at < end:
                    size = next(sizes)
                    out.append(part[at : at + size])
                    at += size
            self._messages = out
        return self._messages

    def add(self, view: memoryview, offset: int, size: int) -> None:
        """One record (its own part)."""
        self.body_parts.append(view)
        self.queue_offsets.append(offset)
        self.sizes.append(size)


class ServeLimits(Protocol):
    """Per-topic limits on what may be served (retention's TTL and size floors)."""

    def floor(self, topic: str, queue_id: int) -> int:
        """Queue offsets below this are no longer served."""
        ...

    def ttl_cut(self, topic: str) -> int:
        """Records stored before this (ms) are expired; 0: no TTL."""
        ...


def _props(view: memoryview, at: int) -> bytes | memoryview:
    return properties_slice(view, at)[1]


@dataclass(slots=True)
class ReadView:
    """What a read needs. ``verify_before``: records below this CommitLog offset were written
    before the store's current start and must also pass their CRC (-1: never check)."""

    commit_log: CommitLog
    queues: ConsumeQueueTable
    limits: ServeLimits
    verify_before: int = -1
    props_of: Callable[[memoryview, int], bytes | memoryview] = field(
        default=lambda v, at: _props(v, at)
    )
    """A record's properties, for tag checks (encryption at rest opens sealed records)."""


def store_time(commit_log: CommitLog, entry: tuple[int, int, int] | None) -> int | None:
    """Store timestamp of the record a ConsumeQueue entry points at (None if not held)."""
    if entry is None:
        return None
    loc = commit_log.view_at(entry[0])
    if loc is None:
        return None
    view, at, _size = loc
    return int(STORE_TIMESTAMP.unpack_from(view, at + STORE_TIMESTAMP_OFFSET)[0])


def offset_for_timestamp(
    commit_log: CommitLog, cq: ConsumeQueue, lo: int, timestamp_ms: int
) -> int:
    """First queue offset in ``[lo, max offset)`` whose store time is >= ``timestamp_ms``
    (the max offset if none): a binary search over store timestamps."""
    hi = cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        ts = store_time(commit_log, cq.entry(mid))
        if ts is None or ts < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class _Query:
    """What every chunk of one read needs, worked out once per read."""

    queue_id: int
    segs: tuple[Segment, ...]
    seg_size: int
    verify_before: int
    wanted: np.ndarray | None
    wanted_set: set[int] | None
    wanted_tags: set[str] | None
    ttl_cut: int
    max_count: int
    topic: bytes
    topic_arr: np.ndarray
    props_of: Callable[[memoryview, int], bytes | memoryview]


def read_queue(
    view: ReadView,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int = 32,
    max_bytes: int = 4 * 1024 * 1024,
    tags: Iterable[str] | None = None,
) -> GetResult:
    """Read by queue offset. Every record is checked against its ConsumeQueue entry (size,
    queue, offset); records from before this start also pass their CRC. A record failing a
    check is skipped and listed, never served."""
    cq = view.queues.get(topic, queue_id)
    if cq is None:
        return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
    limits = view.limits
    lo = max(cq.min_offset, limits.floor(topic, queue_id))
    hi = cq.max_offset
    if hi <= lo:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, lo, lo, hi)
    if offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, hi, lo, hi)
    if offset > hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    wanted_tags = set(tags) if tags is not None else None
    wanted = (
        np.array([tag_hash(t) for t in wanted_tags], dtype=np.int64)
        if wanted_tags is not None
        else None
    )
    result = GetResult(GetStatus.FOUND, offset, lo, hi)
    commit_log = view.commit_log
    segs = tuple(commit_log.segments.segments)
    topic_bytes = topic.encode()
    q = _Query(
        queue_id,
        segs,
        commit_log.segment_size,
        view.verify_before,
        wanted,
        set(wanted.tolist()) if wanted is not None else None,
        wanted_tags,
        limits.ttl_cut(topic),
        max_count,
        topic_bytes,
        np.frombuffer(topic_bytes, np.uint8),
        view.props_of,
    )
    pos = offset
    budget = max_bytes
    # With a tag filter, look at more entries than asked for, but not without bound.
    scan_limit = offset + (max(max_count * 4, 1024) if wanted is not None else max_count)
    while pos < min(hi, scan_limit) and result.count < max_count and budget > 0:
        want = min(hi, scan_limit) - pos
        raw = cq.entries(pos, want if wanted is not None else max_count - result.count)
        if not raw or not segs:
            break
        if len(raw) <= SMALL_READ * ENTRY_SIZE:
            pos = _read_small(q, raw, pos, budget, result)
        else:
            pos = _read_entries(q, np.frombuffer(raw, dtype=ENTRY_DTYPE), pos, budget, result)
        budget = max_bytes - result.total_bytes
    result.next_begin_offset = pos
    if result.skipped:
        log.warning("%s/%d: skipped corrupt records at %s", topic, queue_id, result.skipped)
    if not result.count:
        result.status = GetStatus.NO_MATCHED_MESSAGE
    return result


def _read_small(q: _Query, raw: memoryview, first: int, budget: int, result: GetResult) -> int:
    """:func:`_read_entries` entry by entry: the same checks, cheaper for a few entries."""
    queue_id, segs, seg_size, verify_before = q.queue_id, q.segs, q.seg_size, q.verify_before
    wanted_set, wanted_tags, ttl_cut, max_count, topic = (
        q.wanted_set, q.wanted_tags, q.ttl_cut, q.max_count, q.topic
    )  # fmt: skip
    base = segs[0].start
    remaining = budget
    skipped: list[int] = []
    off = first - 1
    for phy, size, tag in ENTRY.iter_unpack(raw):
        off += 1
        if wanted_set is not None and tag not in wanted_set:
            continue
        idx = (phy - base) // seg_size
        at = phy - base - idx * seg_size
        if size < _MIN_RECORD or phy < base or idx >= len(segs) or at + size > seg_size:
            skipped.append(off)
            continue
        view = segs[idx].view
        total, magic, _crc, qid, _flag, qoff = PREFIX.unpack_from(view, at)
        t_at = at + HEADER_SIZE + struct.unpack_from(">i", view, at + _BODY_LENGTH_OFFSET)[0]
        if (
            total != size
            or magic != MAGIC
            or qid != queue_id
            or qoff != off
            or t_at < at + HEADER_SIZE
            or t_at + 2 + len(topic) > at + size
            or U16.unpack_from(view, t_at)[0] != len(topic)
            or view[t_at + 2 : t_at + 2 + len(topic)] != topic
        ):
            skipped.append(off)
            continue
        if (
            phy < verify_before
            and crc32c.crc32c(view[at + CRC_START : at + size]) != U32.unpack_from(view, at + 8)[0]
        ):
            skipped.append(off)
            continue
        if ttl_cut and STORE_TIMESTAMP.unpack_from(view, at + STORE_TIMESTAMP_OFFSET)[0] < ttl_cut:
            continue
        if (
            wanted_tags is not None
            and decode_properties(q.props_of(view, at)).get("TAGS") not in wanted_tags
        ):
            continue
        result.add(view[at : at + size], off, size)
        remaining -= size
        if result.count >= max_count or remaining <= 0:
            result.skipped += skipped
            return off + 1
    result.skipped += skipped
    return off + 1


def _read_entries(q: _Query, arr: np.ndarray, first: int, budget: int, result: GetResult) -> int:
    """Serve records for ConsumeQueue entries ``arr`` (queue offsets from ``first``).

    Checks run on the whole chunk at once: tag hashes, segment bounds, and each record's
    size, magic, queue id, queue offset and topic gathered from the CommitLog with numpy.
    Only the records that pass become memoryviews. Returns the next queue offset to look at.
    """
    queue_id, segs, seg_size, verify_before = q.queue_id, q.segs, q.seg_size, q.verify_before
    wanted, wanted_tags, ttl_cut, max_count, topic = (
        q.wanted, q.wanted_tags, q.ttl_cut, q.max_count, q.topic_arr
    )  # fmt: skip
    n = len(arr)
    offsets = np.arange(first, first + n, dtype=np.int64)
    phy = arr["phy"].astype(np.int64)
    size = arr["size"].astype(np.int64)
    keep = np.ones(n, dtype=bool) if wanted is None else np.isin(arr["tag"], wanted)
    base = segs[0].start
    seg_idx = (phy - base) // seg_size
    at = phy - base - seg_idx * seg_size
    sane = (size >= _MIN_RECORD) & (phy >= base) & (seg_idx < len(segs)) & (at + size <= seg_size)
    bad = keep & ~sane
    keep &= sane
    skipped: list[int] = offsets[bad].tolist()
    # Candidates in order: (segment view, positions, sizes) chunks, or single record views
    # (tag-filtered path); offsets and sizes flat, for the count and byte cut below.
    chunks: list[tuple[memoryview, np.ndarray, np.ndarray]] = []
    cand_offsets: list[np.ndarray] = []
    cand_sizes: list[np.ndarray] = []
    kept = seg_idx[keep]
    if not len(kept):
        segments: list[int] = []
    elif int(kept.min()) == int(kept.max()):  # the usual case: one segment, no np.unique
        segments = [int(kept[0])]
    else:
        segments = np.unique(kept).tolist()
    all_kept = bool(keep.all())
    for s_i in segments:
        if all_kept and len(segments) == 1:
            pos_in, sizes_in, offs_in, phy_in = at, size, offsets, phy
        else:
            in_seg = keep & (seg_idx == s_i)
            pos_in, sizes_in = at[in_seg], size[in_seg]
            offs_in, phy_in = offsets[in_seg], phy[in_seg]
        view = segs[s_i].view
        raw = np.frombuffer(view, dtype=np.uint8)
        # Gathered as plain bytes, then seen as the record: far cheaper than a structured gather.
        head = _at_every_byte(raw, f"V{HEADER_SIZE}")[pos_in].view(_HEADER_DTYPE)
        ok = (
            (head["total"] == sizes_in)
            & (head["magic"] == MAGIC)
            & (head["queue_id"] == queue_id)
            & (head["queue_offset"] == offs_in)
        )
        ok &= _topic_matches(raw, pos_in, sizes_in, topic, head["body_len"])
        if not ok.all():
            skipped += offs_in[~ok].tolist()
        if ttl_cut:
            ok &= head["store_ts"] >= ttl_cut
        if int(phy_in.min()) < verify_before:
            # Written before this start: the CRC must match too. The framing was checked
            # above, so what is left is one CRC32C call per record.
            stored = head["crc"].tolist()
            pl, zl, ol = pos_in.tolist(), sizes_in.tolist(), offs_in.tolist()
            old = ok & (phy_in < verify_before)
            for k in np.flatnonzero(old).tolist():
                a = pl[k]
                if crc32c.crc32c(view[a + CRC_START : a + zl[k]]) != stored[k]:
                    ok[k] = False
                    skipped.append(ol[k])
        if wanted_tags is None:  # the usual case: no per-record work at all
            if not ok.all():
                pos_in, sizes_in, offs_in = pos_in[ok], sizes_in[ok], offs_in[ok]
            chunks.append((view, pos_in, sizes_in))
            cand_offsets.append(offs_in)
            cand_sizes.append(sizes_in)
            continue
        for a, sz, off, good in zip(
            pos_in.tolist(), sizes_in.tolist(), offs_in.tolist(), ok.tolist(), strict=True
        ):
            if not good:
                continue
            if decode_properties(q.props_of(view, a)).get("TAGS") not in wanted_tags:
                continue
            chunks.append((view, np.array([a], dtype=np.int64), np.array([sz], dtype=np.int64)))
            cand_offsets.append(np.array([off], dtype=np.int64))
            cand_sizes.append(np.array([sz], dtype=np.int64))
    view_offsets = _joined(cand_offsets)
    view_sizes = _joined(cand_sizes)
    # Serve up to max_count records, and stop once max_bytes is reached (at least one).
    room = max_count - result.count
    take = min(room, len(view_sizes))
    budget_hit = False
    if len(view_sizes):
        reached = np.flatnonzero(np.cumsum(view_sizes) >= budget)
        if len(reached) and int(reached[0]) + 1 <= take:
            take = int(reached[0]) + 1
            budget_hit = True
    stop = first + n
    if take < len(view_sizes) or (take == room and take) or budget_hit:
        stop = int(view_offsets[take - 1]) + 1 if take else first
    _add_runs(result, chunks, take)
    result.queue_offsets += view_offsets[:take].tolist()
    result.sizes += view_sizes[:take].tolist()
    result.skipped += sorted(o for o in skipped if o < stop)
    return stop


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _add_runs(
    result: GetResult, chunks: list[tuple[memoryview, np.ndarray, np.ndarray]], take: int
) -> None:
    """The first ``take`` candidate records as body parts: one view per run of records that
    lie back to back in their segment."""
    left = take
    for view, pos, sizes in chunks:
        if left <= 0:
            break
        c = min(left, len(pos))
        left -= c
        if not c:
            continue
        p, z = pos[:c], sizes[:c]
        breaks = np.flatnonzero(p[1:] != p[:-1] + z[:-1]) + 1
        if not len(breaks):  # the usual case: one run
            result.body_parts.append(view[int(p[0]) : int(p[-1] + z[-1])])
            continue
        los = np.concatenate(([0], breaks))
        his = np.concatenate((breaks, [c])) - 1
        begins, ends = p[los].tolist(), (p[his] + z[his]).tolist()
        result.body_parts += [view[b:e] for b, e in zip(begins, ends, strict=True)]
