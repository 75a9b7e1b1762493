"""Reads served from the tier: the records of one chunk, as a local read returns them.

A cold read finds the chunk holding the asked offset (binary search over the manifest's
bases), fetches its index and data (whole objects, kept in a byte-bounded LRU so a consumer
reading forward costs one GET per chunk), and hands out memoryview slices of the data: the
original records, byte for byte, with the same ``GetResult`` shape as
:func:`orbitmq.store.reader.read_queue`. A read stays within one chunk; the next read continues
at ``next_begin_offset``. Any failure of the backend is a
:class:`~orbitmq.common.errors.TierUnavailableError`: retryable, and no offset moves.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from orbitmq.common.errors import TierUnavailableError
from orbitmq.common.message import tag_hash
from orbitmq.store.reader import GetResult, GetStatus
from orbitmq.store.tier.backend import TierBackend
from orbitmq.store.tier.layout import INDEX_DTYPE, ChunkInfo, QueueManifest, data_key, index_key


class ChunkCache:
    """Fetched objects by key, least recently used dropped beyond ``max_bytes``."""

    def __init__(self, backend: TierBackend, max_bytes: int) -> None:
        self.backend = backend
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.gets = 0
        self.hits = 0

    def get(self, key: str) -> bytes:
        with self._lock:
            raw = self._items.get(key)
            if raw is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return raw
        try:
            raw = self.backend.get(key)
        except Exception as exc:
            raise TierUnavailableError(f"tier read of {key} failed: {exc}") from exc
        with self._lock:
            self.gets += 1
            if key not in self._items:
                self._items[key] = raw
                self._bytes += len(raw)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return raw

    def forget_all(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


def find_chunk(manifest: QueueManifest, offset: int) -> ChunkInfo | None:
    """The chunk holding ``offset``, else the first one after it (a gap), else None."""
    chunks = manifest.chunks
    i = bisect.bisect_right([c.base for c in chunks], offset) - 1
    if i >= 0 and offset < chunks[i].end:
        return chunks[i]
    return chunks[i + 1] if i + 1 < len(chunks) else None


def read_cold(
    cache: ChunkCache,
    manifest: QueueManifest,
    offset: int,
    max_count: int,
    max_bytes: int,
    tags: Iterable[str] | None,
    max_offset: int,
) -> GetResult:
    """Read ``offset`` onwards from the tier (``max_offset``: the queue's, for the result)."""
    lo = manifest.min_offset
    if offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, max_offset)
    chunk = find_chunk(manifest, offset)
    if chunk is None:
        # Past the tier's end: the caller only asks below the local minimum, so this is a
        # counted gap between the tier and the disk; continue at the watermark.
        return GetResult(GetStatus.NO_MATCHED_MESSAGE, manifest.watermark, lo, max_offset)
    if offset < chunk.base:  # inside a counted gap: continue at the next chunk
        return GetResult(GetStatus.NO_MATCHED_MESSAGE, chunk.base, lo, max_offset)
    topic, qid = manifest.topic, manifest.queue_id
    index = np.frombuffer(cache.get(index_key(topic, qid, chunk.base, chunk.end)), INDEX_DTYPE)
    data = memoryview(cache.get(data_key(topic, qid, chunk.base, chunk.end)))
    result = GetResult(GetStatus.FOUND, chunk.end, lo, max_offset)
    first = int(np.searchsorted(index["qoff"], offset))
    wanted = {tag_hash(t) for t in tags} if tags is not None else None
    budget = max_bytes
    scan_limit = max(max_count * 4, 1024) if wanted is not None else max_count
    rows = index[first : first + scan_limit]
    if wanted is None and len(rows):
        return _take_run(result, data, rows, max_count, max_bytes, chunk.end, len(index) - first)
    for qoff, pos, size, tag in zip(
        rows["qoff"].tolist(),
        rows["pos"].tolist(),
        rows["size"].tolist(),
        rows["tag"].tolist(),
        strict=True,
    ):
        if result.count >= max_count or (result.count and size > budget):
            result.next_begin_offset = qoff
            break
        if wanted is None or tag in wanted:
            result.add(data[pos : pos + size], qoff, size)
            budget -= size
        result.next_begin_offset = qoff + 1
    else:
        if len(rows) == len(index) - first:
            result.next_begin_offset = chunk.end  # the chunk's tail (and skipped records) read
    if not result.count:
        result.status = GetStatus.NO_MATCHED_MESSAGE
    return result


def _take_run(
    result: GetResult,
    data: memoryview,
    rows: np.ndarray,
    max_count: int,
    max_bytes: int,
    chunk_end: int,
    rest: int,
) -> GetResult:
    """No tag filter: the records a read takes lie back to back in the data object (uploads
    copy them in queue order), so they go out as one view, as a local read hands out a run."""
    sizes = rows["size"].astype(np.int64)
    within = np.cumsum(sizes) <= max_bytes
    take = max(1, min(len(rows), max_count, int(np.count_nonzero(within))))
    pos = rows["pos"]
    start, end = int(pos[0]), int(pos[take - 1]) + int(sizes[take - 1])
    result.body_parts.append(data[start:end])
    result.queue_offsets.extend(rows["qoff"][:take].tolist())
    result.sizes.extend(sizes[:take].tolist())
    last = int(rows["qoff"][take - 1])
    result.next_begin_offset = chunk_end if take == rest else last + 1
    return result


def find_record(
    cache: ChunkCache, manifest: QueueManifest, physical_offset: int
) -> memoryview | None:
    """The record of this queue whose original CommitLog offset is ``physical_offset``, or None.
    A queue's chunks are in CommitLog order, so one binary search finds the only candidate."""
    chunks = manifest.chunks
    i = bisect.bisect_right([c.min_phy for c in chunks], physical_offset) - 1
    if i < 0 or not chunks[i].count or physical_offset >= chunks[i].end_phy:
        return None
    chunk = chunks[i]
    topic, qid = manifest.topic, manifest.queue_id
    index = np.frombuffer(cache.get(index_key(topic, qid, chunk.base, chunk.end)), INDEX_DTYPE)
    at = int(np.searchsorted(index["phy"], physical_offset))
    if at >= len(index) or int(index["phy"][at]) != physical_offset:
        return None
    pos, size = int(index["pos"][at]), int(index["size"][at])
    data = memoryview(cache.get(data_key(topic, qid, chunk.base, chunk.end)))
    return data[pos : pos + size]


def time_to_offset(cache: ChunkCache, manifest: QueueManifest, timestamp_ms: int) -> int | None:
    """The first queue offset of this queue's tier data stored at or after ``timestamp_ms``
    (the first chunk whose newest record qualifies, then its index), or None."""
    for chunk in manifest.chunks:
        if not chunk.count or chunk.max_ts < timestamp_ms:
            continue
        key = index_key(manifest.topic, manifest.queue_id, chunk.base, chunk.end)
        index = np.frombuffer(cache.get(key), INDEX_DTYPE)
        hits = np.flatnonzero(index["ts"] >= timestamp_ms)
        if len(hits):
            return int(index["qoff"][hits[0]])
    return None
