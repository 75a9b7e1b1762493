"""Dispatch: read the CommitLog forward and build the ConsumeQueues and the IndexFile from it.

This is RocketMQ's "reput" service. It is the only writer of derived data, and recovery runs the
same code over the tail it re-scans, so the live path and the crash path cannot drift apart.
Work is per round: every record in [reput_offset, CommitLog end) is decoded once, entries are
grouped per queue and written with one pwrite per queue file, index keys go in one batch.

The IndexFile is an aid for queries by key, not part of what makes a message readable: when it
cannot be written (no space for a new file, an I/O error) the round goes on without those keys,
logged once per outage and counted in ``index_skipped``; the next try is after
``INDEX_RETRY_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import crc32c
import numpy as np

from orbitmq.common.errors import StoreClosedError, StoreError
from orbitmq.common.message import find_all, property_value
from orbitmq.common.record import BLANK, BLANK_MAGIC, HEADER, HEADER_SIZE, U16
from orbitmq.store.appended import Appended, AppendedLog, add_appended, matches
from orbitmq.store.commit_log import SYSFLAG_SEALED, CommitLog
from orbitmq.store.consume_queue import ENTRY_DTYPE, ConsumeQueueTable
from orbitmq.store.recent import RecentRound
from orbitmq.store.seal_group import Places, extra_bytes, group_run
from orbitmq.store.supervise import ServiceHealth
from orbitmq.store.timer_index import TIMER_TOPIC, timer_tag


class PropertiesOpener(Protocol):
    def props_of(self, view: memoryview, at: int) -> bytes | memoryview: ...

    def group_of(
        self, view: memoryview, at: int
    ) -> tuple[memoryview, Places, int, list[int]] | None:
        """For a record of a sealed group (format 2): the group's plaintext records, where
        each is in it by physical offset (start, size, index), how many bytes larger each
        sealed record is, and the plaintext sizes in order; None for any other record or a
        group that does not authenticate."""
        ...


log = logging.getLogger(__name__)

ArrivalListener = Callable[[str, int, int], None]
"""Called with (topic, queue_id, new max queue offset) after entries become readable."""

_TAGS = b"TAGS\x01"
_KEYS = b"KEYS\x01"
_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"
_NEEDLES = (_TAGS, _KEYS, _UNIQ)
_HASH_MASK = 0x7FFFFFFF
ROUND_BYTES = 8 * 1024 * 1024
_COLUMNS = {w: np.arange(w, dtype=np.int64) for w in (2, 4, 8)}
SMALL_BLOCK = 16  # below this many records, decode one by one
INDEX_RETRY_S = 5.0


IndexBatch = list[np.ndarray | list[tuple[int, int, int]]]
"""Arrays (or lists) of (key hash, physical offset, store timestamp ms) rows, in log order."""


class Indexer(Protocol):
    def put_hashes(self, items: np.ndarray | list[tuple[int, int, int]]) -> None: ...


def _walk(view: memoryview, at: int, limit: int) -> tuple[list[int], int, bool]:
    """Record starts from ``at`` while below ``limit``; (starts, position after, hit filler)."""
    starts: list[int] = []
    push = starts.append
    unpack = BLANK.unpack_from
    while at < limit:
        total, magic = unpack(view, at)
        if magic == BLANK_MAGIC:
            return starts, at, True
        push(at)
        at += total
    return starts, at, False


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
        # One round at a time: the thread's, an appender's inline round (dispatch_ready), the
        # final one at close. Re-entrant so a holder may call dispatch_until.
        self._lock = threading.RLock()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._topics: dict[bytes, str] = {}
        self._prefixes: dict[str, int] = {}
        self.failure: BaseException | None = None
        """The error of the latest round while dispatch is failing (None when it works)."""
        self.health = ServiceHealth("dispatcher")
        self.opener: PropertiesOpener | None = None
        """Encryption at rest: opens sealed records' properties (set by the store)."""
        self.appended = AppendedLog()
        if commit_log is not None:  # (a test drives the decoders alone)
            commit_log.on_append = self.appended.push
        self.fast = True  # entries from what appends told (store/appended.py); False: decode
        self.recent = RecentRound()  # what the running round was told, for reads at the tail
        self.index_skipped = 0  # index entries dropped because the IndexFile failed
        self.index_failure: str | None = None  # the cause while the index is failing
        self._index_retry_at = 0.0

    # ------------------------------------------------------------ one round

    def dispatch_until(self, end: int) -> int:
        """Dispatch every record in [reput_offset, end). Returns records dispatched."""
        count = 0
        with self._lock:
            while self.reput_offset < end:
                count += self._round(min(end, self.reput_offset + ROUND_BYTES))
        return count

    def dispatch_ready(self) -> bool:
        """Dispatch, on the caller's thread, everything appended and confirmed so far, and
        notify the arrival listeners there: the appender already has the records in cache,
        and doing it here saves the hand-off to the dispatcher thread and back (the latency
        tail, docs/benchmarks.md). When a round is running elsewhere, dispatch is failing
        (the thread reports and retries that) or the dispatcher is stopped (truncation,
        close), the thread is woken instead. True if done here."""
        if self._stop or self.failure is not None or not self._lock.acquire(blocking=False):
            self.wake()
            return False
        try:
            self.dispatch_until(self.commit_log.confirm_offset)
        except Exception:  # noqa: BLE001 - the thread meets it again, reports and retries it
            self.wake()
            return False
        finally:
            self._lock.release()
        with self._done:
            self._done.notify_all()
        return True

    def _round(self, end: int) -> int:
        """Dispatch the records starting in [reput_offset, end): walk, decode, write, notify."""
        groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]] = {}
        index_items: IndexBatch = []
        pos = self.reput_offset
        floor = self.commit_log.min_offset
        if pos < floor:
            # Retention forced out segments this never dispatched (a full disk while dispatch
            # failed): their messages are gone, carry on from the oldest one left.
            log.error("dispatch: records %d..%d were deleted before dispatch; skipping them",
                      pos, floor)  # fmt: skip
            pos = self.reput_offset = floor
        count = 0
        told = self.appended if self.fast else None
        items: list[Appended] = []
        while pos < end:
            item = told.take(pos, end) if told is not None else None
            loc = self.commit_log.view_at(pos)
            if loc is None:
                raise RuntimeError(f"dispatch: no segment holds offset {pos}")
            view, at, seg_size = loc
            if item is not None and told is not None:
                if matches(item, self.commit_log.view_at):
                    count += (got := add_appended(item, groups, index_items, self._prefix,
                                                  self.index is not None, self._scan_properties,
                                                  SMALL_BLOCK))  # fmt: skip
                    told.used += got
                    items.append(item)
                    pos = item.end
                    continue
                told.clear()  # the log no longer holds what was told (cut): decode
            seg_start = pos - at
            limit = min(seg_size, end - seg_start)
            if told is not None and (nxt := told.next_start()) is not None and nxt > pos:
                limit = min(limit, nxt - seg_start)  # from there, what an append told
            starts, at, filler = _walk(view, at, limit)
            if starts:
                count += len(starts)
                if self.opener is None:
                    self._decode_block(view, seg_start, starts, groups, index_items)
                else:  # encryption at rest: decode the opened plaintext of each group
                    self._decode_sealed(view, seg_start, starts, groups, index_items)
            pos = seg_start + (seg_size if filler else at)
        self._write_queues(groups)
        # Readable from here: listeners first (a held pull is answered in this round, on the
        # loop), then the IndexFile; reput_offset moves last, as the checkpoint vouches for
        # everything below it, index entries included.
        self.recent.begin(items)  # _notify catches what its listeners raise
        self._notify(groups)
        self.recent.end()
        self._write_index(index_items)
        self.reput_offset = pos
        return count

    def _decode_sealed(
        self,
        view: memoryview,
        seg_start: int,
        starts: list[int],
        groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]],
        index_items: IndexBatch,
    ) -> None:
        """Records of an encrypted store, in order: each sealed group's records are decoded
        from its plaintext (one decrypt, cached for reads), anything else one by one."""
        opener = self.opener
        assert opener is not None
        other: list[int] = []
        plains: list[memoryview] = []  # the wanted records of each group, back to back
        inner: list[int] = []
        base = 0
        i, n = 0, len(starts)
        while i < n:
            got = opener.group_of(view, starts[i])
            if got is None:
                if plains:
                    self._decode_block(
                        memoryview(b"".join(plains)), 0, inner, groups, index_items, True
                    )
                    plains, inner, base = [], [], 0
                other.append(starts[i])
                i += 1
                continue
            if other:
                self._decode_small(view, seg_start, other, groups, index_items)
                other = []
            plain, where, _extra, sizes = got
            first, last, i = group_run(where, sizes, starts, i, seg_start, base, inner)
            plains.append(plain[first:last])
            base += last - first
        if plains:  # one numpy decode for every group of the round
            self._decode_block(memoryview(b"".join(plains)), 0, inner, groups, index_items, True)
        if other:
            self._decode_small(view, seg_start, other, groups, index_items)

    def _decode_block(
        self,
        view: memoryview,
        seg_start: int,
        starts: list[int],
        groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]],
        index_items: IndexBatch,
        sealed: bool = False,
    ) -> None:
        """Decode a run of records of one segment at once (numpy gathers of header fields);
        Python work is per run of same-queue records and per record with properties only.
        ``sealed``: ``view`` holds plaintext records of sealed groups, which carry their
        physical offset and are stored larger (``seal_group.extra_bytes``)."""
        if len(starts) < SMALL_BLOCK:
            self._decode_small(view, seg_start, starts, groups, index_items, sealed)
            return
        raw = np.frombuffer(view, dtype=np.uint8)
        last = len(raw) - 1
        s = np.array(starts, dtype=np.int64)

        def field(at: np.ndarray, width: int, dtype: str) -> np.ndarray:
            idx = np.minimum(at[:, None] + _COLUMNS[width], last)
            return raw[idx].view(dtype).reshape(-1)

        n = len(s)
        sizes = field(s, 4, ">i4").astype(np.int64)
        qids = field(s + 12, 4, ">i4").astype(np.int64)
        qoffs = field(s + 20, 8, ">i8").astype(np.int64)
        times = field(s + 56, 8, ">i8").astype(np.int64)
        topic_at = s + HEADER_SIZE + field(s + 84, 4, ">i4")
        topic_len = field(topic_at, 2, ">u2").astype(np.int64)
        props_at = topic_at + 2 + topic_len
        props_len = field(props_at, 2, ">u2").astype(np.int64)
        phys = s + seg_start
        if sealed:
            phys = field(s + 28, 8, ">i8").astype(np.int64)
            sizes += extra_bytes(0) + topic_len
        # Runs of records sharing topic and queue: compare each topic with the one before.
        width = int(topic_len.max())
        tops = raw[np.minimum((topic_at + 2)[:, None] + np.arange(width), last)]
        brk = np.ones(n, dtype=bool)
        if n > 1:
            brk[1:] = (
                (qids[1:] != qids[:-1])
                | (topic_len[1:] != topic_len[:-1])
                | (tops[1:] != tops[:-1]).any(axis=1)
                | (qoffs[1:] != qoffs[:-1] + 1)
            )
        run_starts = np.flatnonzero(brk).tolist()
        run_ends = [*run_starts[1:], n]
        tags = np.zeros(n, dtype=np.int64)
        topics = self._topics
        tas = topic_at.tolist()
        tls = topic_len.tolist()
        run_topics: list[str] = []
        for a in run_starts:
            traw = bytes(view[tas[a] + 2 : tas[a] + 2 + tls[a]])
            topic = topics.get(traw)
            if topic is None:
                topic = topics[traw] = traw.decode("utf-8", "replace")
            run_topics.append(topic)
        if int(props_len.max()) > 0:
            self._scan_properties(
                view, props_at + 2, props_len, run_starts, run_topics, phys, times, tags,
                index_items,
            )  # fmt: skip
        if TIMER_TOPIC in run_topics:  # the timer topic's tag is the due time (timer_index)
            p_at, p_len = (props_at + 2).tolist(), props_len.tolist()
            for topic, a, b in zip(run_topics, run_starts, run_ends, strict=True):
                if topic == TIMER_TOPIC:
                    for k in range(a, b):
                        tags[k] = timer_tag(bytes(view[p_at[k] : p_at[k] + p_len[k]]))
        entries = np.empty(n, dtype=ENTRY_DTYPE)
        entries["phy"] = phys
        entries["size"] = sizes
        entries["tag"] = tags
        first_offsets = qoffs.tolist()
        qid_list = qids.tolist()
        for topic, a, b in zip(run_topics, run_starts, run_ends, strict=True):
            groups.setdefault((topic, qid_list[a]), []).append((first_offsets[a], entries[a:b]))

    def _decode_small(
        self,
        view: memoryview,
        seg_start: int,
        starts: list[int],
        groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]],
        index_items: IndexBatch,
        sealed: bool = False,
    ) -> None:
        """The same decoding, record by record: cheaper than numpy for a handful of records
        (SYNC_FLUSH senders each append a few messages and wake the dispatcher each time)."""
        topics = self._topics
        crc = crc32c.crc32c
        indexing = self.index is not None
        rows: list[tuple[int, int, int]] = []
        runs: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        opener = self.opener
        for at in starts:
            (total, _m, _c, qid, _f, qoff, _p, sys_flag, _bt, _bh, store_ts, _sh, _r, _pt,
             body_len) = HEADER.unpack_from(view, at)  # fmt: skip
            t_at = at + HEADER_SIZE + body_len
            tlen = U16.unpack_from(view, t_at)[0]
            traw = bytes(view[t_at + 2 : t_at + 2 + tlen])
            topic = topics.get(traw)
            if topic is None:
                topic = topics[traw] = traw.decode("utf-8", "replace")
            p_at = t_at + 2 + tlen
            plen = U16.unpack_from(view, p_at)[0]
            phy = seg_start + at
            if sealed:  # a sealed group's plaintext record
                phy, total = _p, total + extra_bytes(tlen)
            tag = 0
            props = b""
            if opener is not None and sys_flag & SYSFLAG_SEALED:
                props = bytes(opener.props_of(view, at))
            elif plen:
                props = bytes(view[p_at + 2 : p_at + 2 + plen])
            if props:
                value = property_value(props, _TAGS)
                if value:
                    tag = crc(value)
                if topic == TIMER_TOPIC:
                    tag = timer_tag(props)
                if indexing:
                    pre = self._prefix(topic)
                    keys = property_value(props, _KEYS)
                    if keys:
                        rows.extend(
                            (crc(k, pre) & _HASH_MASK, phy, store_ts)
                            for k in dict.fromkeys(keys.split(b" "))
                            if k
                        )
                    uniq = property_value(props, _UNIQ)
                    if uniq:
                        rows.append((crc(uniq, pre) & _HASH_MASK, phy, store_ts))
            run = runs.get((topic, qid))
            if run is None:
                run = runs[(topic, qid)] = (qoff, [])
            run[1].append((phy, total, tag))
        for key, (first, entries) in runs.items():
            groups.setdefault(key, []).append((first, np.array(entries, dtype=ENTRY_DTYPE)))
        if rows:
            index_items.append(np.array(rows, dtype=np.int64))

    def _scan_properties(
        self,
        view: memoryview,
        props_at: np.ndarray,
        props_len: np.ndarray,
        run_starts: list[int],
        run_topics: list[str],
        phys: np.ndarray,
        times: np.ndarray,
        tags: np.ndarray,
        index_items: IndexBatch,
    ) -> None:
        """Find TAGS, KEYS and UNIQ_KEY in a block's properties with C-speed substring search
        over one buffer holding every record's properties, then touch only the records that
        have them."""
        # Gather just the properties of every record into one buffer (no bodies to search).
        p_hi = np.cumsum(props_len)
        p_lo = p_hi - props_len
        total = int(p_hi[-1])
        gather = np.arange(total, dtype=np.int64) + np.repeat(props_at - p_lo, props_len)
        raw = np.frombuffer(view, dtype=np.uint8)[gather]
        blk = raw.tobytes()
        run_of = np.searchsorted(np.array(run_starts), np.arange(len(p_lo)), side="right") - 1
        separators: np.ndarray | None = None
        crc = crc32c.crc32c
        for needle in _NEEDLES:
            if needle is not _TAGS and self.index is None:
                continue
            at = find_all(blk, needle)
            if not len(at):
                continue
            rec = np.searchsorted(p_lo, at, side="right") - 1
            safe = np.maximum(rec, 0)
            ok = (rec >= 0) & (at < p_hi[safe])
            # A name starts the properties or follows a \x02 separator.
            ok &= (at == p_lo[safe]) | (raw[np.maximum(at - 1, 0)] == 2)
            at, rec = at[ok], rec[ok]
            if not len(at):
                continue
            # Each value ends at the next \x02 or at the end of the record's properties.
            if separators is None:
                separators = np.flatnonzero(raw == 2)
            starts = at + len(needle)
            nxt = np.searchsorted(separators, starts)
            ends = np.where(
                nxt < len(separators), separators[np.minimum(nxt, len(separators) - 1)], len(blk)
            )
            ends = np.minimum(ends, p_hi[rec])
            spans = zip(starts.tolist(), ends.tolist(), strict=True)
            if needle is _TAGS:
                tags[rec] = [crc(blk[a:b]) if b > a else 0 for a, b in spans]
                continue
            run_prefix = np.array([self._prefix(t) for t in run_topics], dtype=np.int64)
            prefixes = run_prefix[run_of[rec]].tolist()
            values = [blk[a:b] for a, b in spans]
            if needle is _KEYS and any(b" " in v for v in values):
                self._index_split_keys(values, prefixes, phys[rec], times[rec], index_items)
                continue
            keep = [k for k, v in enumerate(values) if v]
            hashes = [crc(values[k], prefixes[k]) & _HASH_MASK for k in keep]
            if hashes:
                index_items.append(
                    np.column_stack(
                        (np.array(hashes, dtype=np.int64), phys[rec][keep], times[rec][keep])
                    )
                )

    @staticmethod
    def _index_split_keys(
        values: list[bytes],
        prefixes: list[int],
        phys: np.ndarray,
        times: np.ndarray,
        index_items: IndexBatch,
    ) -> None:
        rows: list[tuple[int, int, int]] = []
        crc = crc32c.crc32c
        for v, pre, phy, ts in zip(values, prefixes, phys.tolist(), times.tolist(), strict=True):
            rows.extend(
                (crc(k, pre) & _HASH_MASK, phy, ts) for k in dict.fromkeys(v.split(b" ")) if k
            )
        if rows:
            index_items.append(np.array(rows, dtype=np.int64))

    def _prefix(self, topic: str) -> int:
        pre = self._prefixes.get(topic)
        if pre is None:
            pre = self._prefixes[topic] = crc32c.crc32c(f"{topic}#".encode())
        return int(pre)

    def _write_queues(self, groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]]) -> None:
        for (topic, qid), runs in groups.items():
            cq = self.queues.get_or_create(topic, qid)
            first, chunks = runs[0][0], [runs[0][1].tobytes()]
            expect = first + len(runs[0][1])
            for nxt_first, nxt in runs[1:]:
                if nxt_first != expect:  # not contiguous (cannot happen with one appender)
                    cq.put(first, b"".join(chunks))
                    first, chunks = nxt_first, []
                chunks.append(nxt.tobytes())
                expect = nxt_first + len(nxt)
            cq.put(first, b"".join(chunks))

    def _write_index(self, index_items: IndexBatch) -> None:
        if index_items and self.index is not None:
            if len(index_items) == 1:  # one run, one needle (or record by record): in order
                self._index(index_items[0])
                return
            rows = np.concatenate([np.asarray(x, dtype=np.int64) for x in index_items])
            # Entries must go in log order: several needles were found separately.
            self._index(rows[np.argsort(rows[:, 1], kind="stable")])

    def _index(self, rows: np.ndarray | list[tuple[int, int, int]]) -> None:
        assert self.index is not None
        if self.index_failure is not None and time.monotonic() < self._index_retry_at:
            self.index_skipped += len(rows)
            return
        try:
            self.index.put_hashes(rows)
        except StoreClosedError:
            raise
        except (StoreError, OSError) as exc:
            self.index_skipped += len(rows)
            self._index_retry_at = time.monotonic() + INDEX_RETRY_S
            if self.index_failure is None:
                log.warning("index: cannot write (%s); messages stay readable, queries by key "
                            "miss them until it can", exc)  # fmt: skip
            self.index_failure = str(exc)
            return
        if self.index_failure is not None:
            log.warning("index: writable again (%d entries were skipped)", self.index_skipped)
            self.index_failure = None

    def _notify(self, groups: dict[tuple[str, int], list[tuple[int, np.ndarray]]]) -> None:
        if not self.listeners:
            return
        for topic, qid in groups:
            cq = self.queues.get(topic, qid)
            if cq is None:
                continue
            for listener in self.listeners:
                try:
                    listener(topic, qid, cq.max_offset)
                except Exception:
                    log.exception("arrival listener failed")

    # ------------------------------------------------------------ the service

    def start(self) -> None:
        with self._lock:  # appends told before a truncation point at records no longer there
            self.appended.clear()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="orbitmq-dispatch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            # No pause between rounds: a new message reaches waiting pulls one dispatch round
            # after its append. (RocketMQ's reput service sleeps 1 ms; measured here, that ms
            # was a third of a long-polled message's delivery latency.) Under load rounds grow
            # by themselves, since appends arrive while a round runs.
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                # Idle turns leave the lock alone: an appender's inline round that found it
                # taken would fall back to this thread (two hand-offs for its messages).
                if self.reput_offset < self.commit_log.confirm_offset:
                    self.dispatch_until(self.commit_log.confirm_offset)
            except Exception as exc:  # noqa: BLE001 - supervised: reported, retried; sends refused
                pause = self.health.failed(exc)
                self.failure = exc
                with self._done:
                    self._done.notify_all()
                deadline = time.monotonic() + pause
                while not self._stop and time.monotonic() < deadline:
                    time.sleep(min(0.05, pause))
                continue
            if self.failure is not None:
                self.failure = None
                self.health.ok()
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
        with self._lock:  # an inline round (dispatch_ready) under way ends first; no new one
            pass  # starts while stopped (truncate_to, close)
