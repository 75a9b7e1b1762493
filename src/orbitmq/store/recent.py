"""A read at the tail answered from the dispatch round that made the records readable.

A long-polled pull is answered on arrival, inside the dispatch round (broker/long_polling.py).
When that round built its entries from what the appends told (store/appended.py), the round
already holds every new record's queue offset, physical offset and size: the answer is views
of the CommitLog cut from those, with no ConsumeQueue read-back and no per-record checks of
bytes this process wrote a moment ago (the checks are for entries and records read from disk;
records from before the store's start also pass their CRC, and none of these is).

It answers only what it can answer exactly as :func:`orbitmq.store.reader.read_queue` would
(tests/store/test_recent.py compares them): no tag filter, only on the thread running the round,
only while the queue's entries end where the told records end, the asked offset among them and
at or above what may be served, and none of them past the topic's TTL. Anything else is None,
and the caller reads as before. Records are served as one view per run of records that lie
back to back in a segment, as the numpy read path does.
"""

from __future__ import annotations

import threading

from orbitmq.store.appended import Appended, AppendedBatch
from orbitmq.store.reader import GetResult, GetStatus, ReadView


class RecentRound:
    """The appends told to the dispatch round now running (empty between rounds)."""

    def __init__(self) -> None:
        self._items: list[Appended] = []
        self._thread = -1
        self._by_queue: dict[tuple[str, int], list[tuple[AppendedBatch, int]]] | None = None
        self.served = 0
        """Reads answered from here (stats, tests)."""
        self.view: ReadView | None = None
        """What reads need; None (encryption at rest, tiered storage, a read hook): no answers."""

    def begin(self, items: list[Appended]) -> None:
        """Called by the round, on its thread, before it notifies the arrival listeners."""
        self._items = items
        self._thread = threading.get_ident()
        self._by_queue = None

    def end(self) -> None:
        self._items = []
        self._thread = -1
        self._by_queue = None

    def _queue(self, topic: str, queue_id: int) -> list[tuple[AppendedBatch, int]]:
        by_queue = self._by_queue
        if by_queue is None:
            by_queue = self._by_queue = {}
            for item in self._items:
                for b in item.batches:
                    if b.sizes:
                        key = (b.topic, b.queue_id)
                        by_queue.setdefault(key, []).append((b, item.store_timestamp_ms))
        return by_queue.get((topic, queue_id), [])

    def read(
        self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int
    ) -> GetResult | None:
        """``read_queue(view, topic, queue_id, offset, max_count, max_bytes)`` without a tag
        filter, from the records of this round; None when it cannot say the same."""
        view = self.view
        if view is None or self._thread != threading.get_ident() or max_count <= 0:
            return None
        if max_bytes <= 0:
            return None
        told = self._queue(topic, queue_id)
        cq = view.queues.get(topic, queue_id)
        if not told or cq is None:
            return None
        end = told[0][0].first_queue_offset
        for b, _ts in told:  # contiguous queue offsets, ending where the queue ends
            if b.first_queue_offset != end:
                return None
            end += len(b.sizes)
        hi = cq.max_offset
        lo = max(cq.min_offset, view.limits.floor(topic, queue_id))
        if end != hi or offset < told[0][0].first_queue_offset or offset < lo or offset >= hi:
            return None
        ttl_cut = view.limits.ttl_cut(topic)
        if ttl_cut and any(ts < ttl_cut for _b, ts in told):
            return None
        view_at = view.commit_log.view_at
        result = GetResult(GetStatus.FOUND, offset, lo, hi)
        parts, sizes, offsets = result.body_parts, result.sizes, result.queue_offsets
        remaining = max_bytes
        run_seg: memoryview | None = None
        run_from = run_to = 0
        seg_lo = seg_hi = -1  # the CommitLog range of run_seg's segment
        off = offset
        for b, _ts in told:
            first = b.first_queue_offset
            if off >= first + len(b.sizes):
                continue
            phys, bsizes = b.physical_offsets, b.sizes
            for i in range(off - first, len(bsizes)):
                phy, size = phys[i], bsizes[i]
                if seg_lo <= phy < seg_hi and phy - seg_lo == run_to:
                    run_to += size  # right after the record before, in the same segment
                else:
                    loc = view_at(phy)
                    if loc is None:
                        return None
                    if run_seg is not None:
                        parts.append(run_seg[run_from:run_to])
                    run_seg, at, seg_size = loc
                    seg_lo, seg_hi = phy - at, phy - at + seg_size
                    run_from, run_to = at, at + size
                sizes.append(size)
                offsets.append(off)
                off += 1
                remaining -= size
                if len(sizes) >= max_count or remaining <= 0:
                    break
            if len(sizes) >= max_count or remaining <= 0:
                break
        if run_seg is not None:
            parts.append(run_seg[run_from:run_to])
        result.next_begin_offset = off
        self.served += 1
        return result
