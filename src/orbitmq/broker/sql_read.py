"""A pull's read with a SQL92 filter: on a reader thread, read and keep the records the filter
passes, reading on past non-matching records up to SQL_SCAN_LIMIT, so a selective filter does not
cost the consumer a round trip per batch of records it would drop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orbitmq.common.filter import MessageFilter
from orbitmq.common.message import decode_properties
from orbitmq.common.record import properties_slice
from orbitmq.store.message_store import GetResult, GetStatus, MessageStore

__all__ = ["SQL_SCAN_LIMIT", "SqlRead", "read_sql"]

SQL_SCAN_LIMIT = 1024
"""A SQL92 pull that matches nothing reads on, up to this many records, before answering
PULL_RETRY_IMMEDIATELY (so a selective filter does not cost a round trip per batch)."""


@dataclass(slots=True)
class SqlRead:
    """A pull's read with a SQL92 filter applied: ``result`` is the last read that found records
    (or the first read, when it found none), ``parts`` the matching records, ``next_begin`` where
    the next pull starts."""

    result: GetResult
    next_begin: int
    parts: list[memoryview] = field(default_factory=list)
    dropped: int = 0


def read_sql(
    store: MessageStore, flt: MessageFilter, topic: str, queue_id: int, offset: int, max_nums: int,
    max_bytes: int,
) -> SqlRead:  # fmt: skip
    """On a reader thread: read and keep the records the filter passes, reading on until
    ``max_nums`` / ``max_bytes`` worth passed, the queue ends, or SQL_SCAN_LIMIT records were
    looked at. ``next_begin`` is just past the last record looked at."""
    chunk = max(max_nums, 64)
    first = store.get_messages(topic, queue_id, offset, chunk, max_bytes, None)
    out = SqlRead(first, first.next_begin_offset)
    res = first
    used = 0
    scanned = 0
    while res.status is GetStatus.FOUND:
        out.result = res
        views = res.messages
        keep = flt.matches_many([decode_properties(properties_slice(v, 0)[1]) for v in views])
        out.next_begin = res.next_begin_offset
        full = False
        for view, passed, queue_offset in zip(views, keep, res.queue_offsets, strict=True):
            scanned += 1
            if not passed:
                out.dropped += 1
                continue
            out.parts.append(view)
            used += len(view)
            if len(out.parts) >= max_nums or used >= max_bytes:
                out.next_begin = queue_offset + 1
                full = True
                break
        if full or scanned >= SQL_SCAN_LIMIT or out.next_begin >= res.max_offset:
            break
        res = store.get_messages(topic, queue_id, out.next_begin, chunk, max_bytes, None)
    if res is not out.result and res.status is GetStatus.NO_MATCHED_MESSAGE:
        out.next_begin = res.next_begin_offset  # read on past records it could not serve
    return out
