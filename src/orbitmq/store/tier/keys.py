"""The tier's key index: per chunk, which of its records carry which key.

Query by key must find a message after its CommitLog segment and IndexFile are gone, and after
``--tier-restore`` rebuilt a broker whose disk was lost: so each chunk carries its own key
index, uploaded with it (before the manifest names the chunk) and listed in the manifest
(``ChunkInfo.keys``: its entry count; -1 for a chunk uploaded before key indexes existed, which
``--tier-restore`` indexes from the chunk's data and uploads then).

A **keys** object (``<topic>/<queue_id>/keys/<base>-<end>``) is a sorted array of 16-byte
big-endian entries ``(hash i64, row i64)``: ``hash`` is the store's IndexFile hash of
``topic#key`` (CRC32C, 31 bits; :mod:`orbitmq.store.index_format`) for each distinct KEYS word
and the UNIQ_KEY of a record, ``row`` the record's entry in the chunk's index object. A lookup
is one binary search per chunk; hash collisions are possible, so the caller checks each record's
topic and keys, as with the local index.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np

from orbitmq.common.message import property_value
from orbitmq.common.record import StoredMessage, decode, properties_slice
from orbitmq.store.index_format import HASH_MASK, crc32c_seeded
from orbitmq.store.tier.backend import TierBackend
from orbitmq.store.tier.layout import (
    INDEX_DTYPE,
    ChunkInfo,
    QueueManifest,
    data_key,
    index_key,
    keys_key,
)

KEYS_DTYPE = np.dtype([("hash", ">i8"), ("row", ">i8")])
_KEYS = b"KEYS\x01"
_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"


def key_hash(topic: str, key: str) -> int:
    """The hash of ``topic#key`` as the local IndexFile computes it."""
    prefix = crc32c_seeded(f"{topic}#".encode("utf-8", "surrogatepass"), 0)
    return crc32c_seeded(key.encode("utf-8", "surrogatepass"), prefix) & HASH_MASK


def build_keys(topic: str, data: bytes | bytearray | memoryview, index: np.ndarray) -> np.ndarray:
    """The key index of one chunk (its data object and index entries), sorted by hash."""
    prefix = crc32c_seeded(f"{topic}#".encode("utf-8", "surrogatepass"), 0)
    view = memoryview(data)
    hashes: list[int] = []
    rows: list[int] = []
    for row, pos in enumerate(index["pos"].tolist()):
        try:
            _topic, props_view = properties_slice(view, pos)
        except struct.error:
            continue
        props = bytes(props_view)
        words: list[bytes] = []
        keys = property_value(props, _KEYS)
        if keys:
            words.extend(k for k in keys.split(b" ") if k)
        uniq = property_value(props, _UNIQ)
        if uniq:
            words.append(uniq)
        for word in dict.fromkeys(words):
            hashes.append(crc32c_seeded(word, prefix) & HASH_MASK)
            rows.append(row)
    out = np.zeros(len(hashes), dtype=KEYS_DTYPE)
    if hashes:
        out["hash"] = hashes
        out["row"] = rows
        out = out[np.argsort(out["hash"], kind="stable")]
    return out


def rows_for(keys: np.ndarray, wanted: int) -> list[int]:
    """Rows of the chunk index whose records may carry the key hashed to ``wanted``."""
    lo = int(np.searchsorted(keys["hash"], wanted, side="left"))
    hi = int(np.searchsorted(keys["hash"], wanted, side="right"))
    return sorted(set(keys["row"][lo:hi].tolist()))


def find_by_key(
    get: Callable[[str], bytes],
    manifest: QueueManifest,
    key: str,
    begin_ms: int,
    end_ms: int,
) -> Iterator[StoredMessage]:
    """The records of this queue's tier data whose KEYS contain ``key`` or whose unique id is
    ``key``, stored within ``[begin_ms, end_ms]``, newest chunk first. ``get`` fetches an
    object (the tier's cache: its failures are retryable errors)."""
    topic, qid = manifest.topic, manifest.queue_id
    wanted = key_hash(topic, key)
    for chunk in reversed(manifest.chunks):
        if chunk.keys <= 0 or chunk.max_ts < begin_ms or chunk.min_ts > end_ms:
            continue
        keys = np.frombuffer(get(keys_key(topic, qid, chunk.base, chunk.end)), KEYS_DTYPE)
        rows = rows_for(keys, wanted)
        if not rows:
            continue
        index = np.frombuffer(get(index_key(topic, qid, chunk.base, chunk.end)), INDEX_DTYPE)
        data = memoryview(get(data_key(topic, qid, chunk.base, chunk.end)))
        for row in reversed(rows):
            pos, size, ts = int(index["pos"][row]), int(index["size"][row]), int(index["ts"][row])
            if not begin_ms <= ts <= end_ms:
                continue
            msg = decode(data[pos : pos + size])
            if msg.topic == topic and (key in msg.keys or msg.msg_id == key):
                yield msg


def index_missing(backend: TierBackend, manifest: QueueManifest) -> QueueManifest | None:
    """Build and upload the key index of every chunk the manifest lists without one (chunks
    uploaded before key indexes existed), then write the manifest listing them. None when
    every chunk has one. Run by ``--tier-restore``."""
    todo = [i for i, c in enumerate(manifest.chunks) if c.keys < 0]
    if not todo:
        return None
    topic, qid = manifest.topic, manifest.queue_id
    new = manifest.copy()
    for i in todo:
        c = new.chunks[i]
        index = np.frombuffer(backend.get(index_key(topic, qid, c.base, c.end)), INDEX_DTYPE)
        keys = build_keys(topic, backend.get(data_key(topic, qid, c.base, c.end)), index)
        backend.put(keys_key(topic, qid, c.base, c.end), keys.tobytes())
        new.chunks[i] = ChunkInfo(**{**_fields(c), "keys": len(keys)})
    backend.put(f"{topic}/{qid}/manifest.json", new.encode())
    return new


def _fields(c: ChunkInfo) -> dict[str, int]:
    return {name: getattr(c, name) for name in ChunkInfo.__dataclass_fields__}
