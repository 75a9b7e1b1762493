"""What the tier holds, byte by byte: per-queue chunks and one manifest per queue.

Keys (all under the backend's root; a topic name is a valid path segment by its validation):

    <topic>/<queue_id>/data/<base:020d>-<end:020d>    the records of queue offsets [base, end)
    <topic>/<queue_id>/index/<base:020d>-<end:020d>   one INDEX entry per record in the data
    <topic>/<queue_id>/keys/<base:020d>-<end:020d>    the chunk's key index (:mod:`.keys`)
    <topic>/<queue_id>/manifest.json                  the queue's chunks, watermark, gaps

A **data** object is the original CommitLog records, byte for byte, in queue order: each still
carries its QUEUE_OFFSET and its original PHYSICAL_OFFSET, so a pull from the tier returns what
a pull from the disk returned, and message ids (which encode the physical offset) still resolve.

An **index** entry (40 bytes, big-endian):

| off | size | field |
| ---: | ---: | --- |
| 0 | 8 | queue offset (i64) |
| 8 | 4 | position of the record in the data object (u32) |
| 12 | 4 | record size (u32) |
| 16 | 8 | tag hash (i64), as the ConsumeQueue's |
| 24 | 8 | original CommitLog offset (i64) |
| 32 | 8 | store timestamp, ms (i64) |

Entries are in queue-offset order; a record that failed its check when it was uploaded has no
entry (the local read would have skipped it too).

The **manifest** (JSON) is written after the chunk's objects, so a manifest never names a
chunk that is not there; objects without a manifest entry are orphans of an interrupted upload
and are deleted before the queue uploads again. The bucket alone is enough to rebuild the
tier's state (``watermark``: the next queue offset to upload; ``min_offset``: the first one
still held after TTL; ``gaps``: offsets lost because the operator allowed local deletion before
upload, counted, never silent).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

INDEX_DTYPE = np.dtype(
    [
        ("qoff", ">i8"),
        ("pos", ">u4"),
        ("size", ">u4"),
        ("tag", ">i8"),
        ("phy", ">i8"),
        ("ts", ">i8"),
    ]
)
INDEX_SIZE = INDEX_DTYPE.itemsize  # 40
MANIFEST = "manifest.json"
VERSION = 1


def queue_prefix(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}/"


def data_key(topic: str, queue_id: int, base: int, end: int) -> str:
    return f"{queue_prefix(topic, queue_id)}data/{base:020d}-{end:020d}"


def index_key(topic: str, queue_id: int, base: int, end: int) -> str:
    return f"{queue_prefix(topic, queue_id)}index/{base:020d}-{end:020d}"


def keys_key(topic: str, queue_id: int, base: int, end: int) -> str:
    return f"{queue_prefix(topic, queue_id)}keys/{base:020d}-{end:020d}"


def manifest_key(topic: str, queue_id: int) -> str:
    return queue_prefix(topic, queue_id) + MANIFEST


@dataclass(slots=True)
class ChunkInfo:
    """One uploaded chunk: queue offsets [base, end), its byte size and time and
    CommitLog ranges (``min_phy`` .. ``end_phy``: the original offsets its records spanned).
    ``keys``: entries of its key index object, -1 when it has none (uploaded before key
    indexes existed; ``--tier-restore`` builds it)."""

    base: int
    end: int
    bytes: int
    count: int
    min_ts: int
    max_ts: int
    min_phy: int
    end_phy: int
    keys: int = -1


@dataclass(slots=True)
class QueueManifest:
    topic: str
    queue_id: int
    watermark: int = 0
    min_offset: int = 0
    gaps: int = 0
    chunks: list[ChunkInfo] = field(default_factory=list)
    last_upload_ms: int = 0

    def encode(self) -> bytes:
        doc = asdict(self)
        doc["version"] = VERSION
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> QueueManifest:
        doc = json.loads(raw)
        if doc.get("version") != VERSION:
            raise ValueError(f"unknown tier manifest version {doc.get('version')!r}")
        return cls(
            topic=str(doc["topic"]),
            queue_id=int(doc["queue_id"]),
            watermark=int(doc["watermark"]),
            min_offset=int(doc["min_offset"]),
            gaps=int(doc["gaps"]),
            chunks=[ChunkInfo(**{k: int(v) for k, v in c.items()}) for c in doc["chunks"]],
            last_upload_ms=int(doc.get("last_upload_ms", 0)),
        )

    def copy(self) -> QueueManifest:
        return QueueManifest(
            self.topic,
            self.queue_id,
            self.watermark,
            self.min_offset,
            self.gaps,
            list(self.chunks),
            self.last_upload_ms,
        )

    @property
    def held(self) -> bool:
        """The tier holds at least one record of this queue."""
        return bool(self.chunks)


def parse_chunk_name(name: str) -> tuple[int, int] | None:
    """``<base>-<end>`` of a data or index key's last segment, or None."""
    base, _, end = name.rpartition("/")[2].partition("-")
    if not (base.isdigit() and end.isdigit()):
        return None
    return int(base), int(end)
