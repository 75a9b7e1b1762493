"""Dispatch: read the CommitLog forward and build the ConsumeQueues and the IndexFile from it.

This is RocketMQ's "reput" service. It is the only writer of derived data, and recovery runs the
same code over the tail it re-scans, so the live path and the crash path cannot drift apart.
Work is per round: every record in [reput_offset, CommitLog end) is decoded once, entries are
grouped per queue and written with one pwrite per queue file, index keys go in one batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np

from orbitmq.common.message import tag_hash
from orbitmq.common.record import BLANK, BLANK_MAGIC, HEADER, HEADER_SIZE, U16
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.consume_queue import ENTRY_DTYPE, ConsumeQueueTable

log = logging.getLogger(__name__)

ArrivalListener = Callable[[str, int, int], None]
"""Called with (topic, queue_id, new max queue offset) after entries become readable."""

_TAGS = b"TAGS\x01"
_KEYS = b"KEYS\x01"
_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"
ROUND_BYTES = 8 * 1024 * 1024


class Indexer(Protocol):
    def build_many(self, items: list[tuple[str, list[str], str | None, int, int]]) -> None: ...


def _prop(props: bytes, needle: bytes) -> str | None:
    at = props.find(needle)
    while at > 0 and props[at - 1] != 0x02:
        at = props.find(needle, at + 1)
    if at < 0:
        return None
    begin = at + len(needle)
    end = props.find(b"\x02", begin)
    return props[begin : end if end >= 0 else len(props)].decode("utf-8", "replace")


class Dispatcher:
    """Builds derived data from the CommitLog. ``reput_offset`` is how far it has got."""

    def __init__(
        self, commit_log: CommitLog, queues: ConsumeQueueTable, index: Indexer | None
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.reput_offset = 0
        self.listeners: list[ArrivalListener] = []
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._topics: dict[bytes, str] = {}
        self.failure: BaseException | None = None

    # ------------------------------------------------------------ one round

    def dispatch_until(self, end: int) -> int:
        """Dispatch every record in [reput_offset, end). Returns records dispatched."""
        count = 0
        while self.reput_offset < end:
            count += self._round(min(end, self.reput_offset + ROUND_BYTES))
        return count

    def _round(self, end: int) -> int:
        per_queue: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        index_items: list[tuple[str, list[str], str | None, int, int]] = []
        pos = self.reput_offset
        topics = self._topics
        unpack = HEADER.unpack_from
        count = 0
        while pos < end:
            loc = self.commit_log.view_at(pos)
            if loc is None:
                raise RuntimeError(f"dispatch: no segment holds offset {pos}")
            view, at, seg_size = loc
            seg_start = pos - at
            limit = min(seg_size, end - seg_start)
            while at < limit:
                total, magic = BLANK.unpack_from(view, at)
                if magic == BLANK_MAGIC:
                    at = seg_size
                    break
                (_t, _m, _c, qid, _f, qoff, phy, _s, _bt, _bh, store_ts, _sh, _r, _p,
                 body_len) = unpack(view, at)  # fmt: skip
                t_at = at + HEADER_SIZE + body_len
                tlen = U16.unpack_from(view, t_at)[0]
                traw = bytes(view[t_at + 2 : t_at + 2 + tlen])
                topic = topics.get(traw)
                if topic is None:
                    topic = topics[traw] = traw.decode()
                p_at = t_at + 2 + tlen
                plen = U16.unpack_from(view, p_at)[0]
                tag = 0
                if plen:
                    props = bytes(view[p_at + 2 : p_at + 2 + plen])
                    if _TAGS in props:
                        tag = tag_hash(_prop(props, _TAGS))
                    if self.index is not None:
                        keys = _prop(props, _KEYS) if _KEYS in props else None
                        uniq = _prop(props, _UNIQ) if _UNIQ in props else None
                        if keys or uniq:
                            key_list = keys.split(" ") if keys else []
                            index_items.append((topic, key_list, uniq, phy, store_ts))
                slot = per_queue.get((topic, qid))
                if slot is None:
                    slot = per_queue[(topic, qid)] = (qoff, [])
                slot[1].append((phy, total, tag))
                at += total
                count += 1
            pos = seg_start + at
        for (topic, qid), (first, rows) in per_queue.items():
            cq = self.queues.get_or_create(topic, qid)
            cq.put(first, np.array(rows, dtype=ENTRY_DTYPE).tobytes())
        if index_items and self.index is not None:
            self.index.build_many(index_items)
        self.reput_offset = pos
        for topic, qid in per_queue:
            cq = self.queues.get_or_create(topic, qid)
            for listener in self.listeners:
                try:
                    listener(topic, qid, cq.max_offset)
                except Exception:
                    log.exception("arrival listener failed")
        return count

    # ------------------------------------------------------------ the service

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="orbitmq-dispatch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                self.dispatch_until(self.commit_log.max_offset)
            except BaseException as exc:  # a dispatcher that dies silently would stall reads
                log.exception("dispatcher failed; reads will not see new messages")
                self.failure = exc
                with self._done:
                    self._done.notify_all()
                return
            with self._done:
                self._done.notify_all()

    def wait_for(self, offset: int, timeout: float) -> bool:
        """Block until everything before ``offset`` is dispatched (or the timeout passes)."""
        self.wake()
        with self._done:
            return (
                self._done.wait_for(
                    lambda: self.reput_offset >= offset or self.failure is not None, timeout
                )
                and self.failure is None
            )

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
