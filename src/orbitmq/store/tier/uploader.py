"""Building and uploading one queue's next chunk (run by the tier thread, never a loop).

A chunk is cut from the queue's watermark: records whose whole bytes are below ``limit`` (the
CommitLog's flushed offset, and the confirm offset when replication holds one back), at most
``max_count`` records and about ``max_bytes``. Each record is checked as a read from disk would
(``check_record``: magic, lengths, CRC; and its queue id and queue offset must be the entry's):
a record failing the check gets no index entry, exactly as a local read skips it. The order of
writes is data, index, key index (:mod:`.keys`), manifest; the in-memory manifest (and with it the watermark that gates
local deletion) moves only after all three succeeded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from orbitmq.common.record import (
    PREFIX,
    STORE_TIMESTAMP,
    STORE_TIMESTAMP_OFFSET,
    RecordError,
    check_record,
)
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import ENTRY_DTYPE, ConsumeQueue
from orbitmq.store.tier.backend import TierBackend
from orbitmq.store.tier.keys import build_keys
from orbitmq.store.tier.layout import (
    INDEX_DTYPE,
    ChunkInfo,
    QueueManifest,
    data_key,
    index_key,
    keys_key,
    manifest_key,
    parse_chunk_name,
    queue_prefix,
)


@dataclass(slots=True)
class Chunk:
    base: int
    end: int
    data: bytearray
    index: np.ndarray
    keys: np.ndarray

    def info(self) -> ChunkInfo:
        idx = self.index
        if len(idx):
            ts, phy = idx["ts"], idx["phy"]
            last = len(idx) - 1
            min_ts, max_ts = int(ts.min()), int(ts.max())
            min_phy, end_phy = int(phy[0]), int(phy[last]) + int(idx["size"][last])
        else:
            min_ts = max_ts = min_phy = end_phy = 0
        return ChunkInfo(
            self.base, self.end, len(self.data), len(idx), min_ts, max_ts, min_phy, end_phy,
            len(self.keys),
        )  # fmt: skip


def build_chunk(
    commit_log: CommitLog,
    cq: ConsumeQueue,
    start: int,
    limit: int,
    max_count: int,
    max_bytes: int,
    plain: Callable[[memoryview], bytes | memoryview] | None = None,
) -> Chunk | None:
    """The next chunk of ``cq`` from queue offset ``start``, or None if nothing is ready.
    ``plain`` turns a stored record into the record to upload (encryption at rest: the
    plaintext record, since the segment's key goes with the segment; the size may change)."""
    data = bytearray()
    rows: list[tuple[int, int, int, int, int, int]] = []
    pos = start
    stop = min(cq.max_offset, start + max_count)
    while pos < stop and len(data) < max_bytes:
        raw = cq.entries(pos, stop - pos)
        if not raw:
            break
        entries = np.frombuffer(raw, dtype=ENTRY_DTYPE)
        done = False
        for phy, size, tag in zip(
            entries["phy"].tolist(), entries["size"].tolist(), entries["tag"].tolist(), strict=True
        ):
            if size <= 0 or phy + size > limit or len(data) >= max_bytes:
                done = True  # not written, not flushed (or confirmed) yet, or the chunk is full
                break
            loc = commit_log.view_at(phy)
            if loc is None:
                done = True  # deleted locally: the caller counts the gap
                break
            view, at, seg_size = loc
            try:
                n = check_record(view, at, seg_size)
                _total, _m, _c, queue_id, _f, queue_offset = PREFIX.unpack_from(view, at)
            except (RecordError, struct.error):
                n, queue_id, queue_offset = 0, -1, -1
            if n == size and queue_id == cq.queue_id and queue_offset == pos:
                ts = STORE_TIMESTAMP.unpack_from(view, at + STORE_TIMESTAMP_OFFSET)[0]
                record = view[at : at + size] if plain is None else plain(view[at : at + size])
                rows.append((pos, len(data), len(record), tag, phy, ts))
                data += record
            pos += 1
        if done:
            break
    if pos == start:
        return None
    index = np.array(rows, dtype=INDEX_DTYPE) if rows else np.zeros(0, dtype=INDEX_DTYPE)
    return Chunk(start, pos, data, index, build_keys(cq.topic, data, index))


def upload_chunk(
    backend: TierBackend, manifest: QueueManifest, chunk: Chunk, now_ms: int
) -> QueueManifest:
    """Put the chunk's data and index, then the manifest naming it; returns the new manifest
    (the caller installs it only when this returns)."""
    topic, qid = manifest.topic, manifest.queue_id
    backend.put(data_key(topic, qid, chunk.base, chunk.end), chunk.data)
    backend.put(index_key(topic, qid, chunk.base, chunk.end), chunk.index.tobytes())
    backend.put(keys_key(topic, qid, chunk.base, chunk.end), chunk.keys.tobytes())
    new = manifest.copy()
    if not new.chunks:
        new.min_offset = chunk.base
    new.chunks.append(chunk.info())
    new.watermark = chunk.end
    new.last_upload_ms = now_ms
    backend.put(manifest_key(topic, qid), new.encode())
    return new


def remove_orphans(backend: TierBackend, manifest: QueueManifest) -> int:
    """Delete the queue's chunk objects its manifest does not name (an upload interrupted after
        its data or index was put, or a TTL deletion interrupted after the manifest was) and what
    half-written puts left. Returns
        how many objects went. Run before the queue's first upload in a process, so a chunk cut
        again from the same watermark never overlaps a leftover."""
    named = {(c.base, c.end) for c in manifest.chunks}
    gone = 0
    prefix = queue_prefix(manifest.topic, manifest.queue_id)
    gone += backend.remove_partial(prefix)  # a half-written manifest
    for kind in ("data/", "index/", "keys/"):
        gone += backend.remove_partial(prefix + kind)
        for key in backend.list(prefix + kind):
            span = parse_chunk_name(key)
            if span is not None and span not in named:
                backend.delete(key)
                gone += 1
    return gone


def expire_chunks(
    backend: TierBackend, manifest: QueueManifest, cut_ms: int
) -> QueueManifest | None:
    """Drop the chunks whose newest record was stored before ``cut_ms`` (the tier TTL), oldest
    first: the manifest without them is written first, then their objects are deleted. None
    when nothing expired."""
    keep = list(manifest.chunks)
    dropped: list[ChunkInfo] = []
    while keep and keep[0].max_ts < cut_ms:
        dropped.append(keep.pop(0))
    if not dropped:
        return None
    new = manifest.copy()
    new.chunks = keep
    new.min_offset = keep[0].base if keep else new.watermark
    topic, qid = new.topic, new.queue_id
    backend.put(manifest_key(topic, qid), new.encode())
    for c in dropped:
        backend.delete(data_key(topic, qid, c.base, c.end))
        backend.delete(index_key(topic, qid, c.base, c.end))
        backend.delete(keys_key(topic, qid, c.base, c.end))
    return new
