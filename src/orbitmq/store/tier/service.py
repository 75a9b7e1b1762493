"""TierService: the tier under one store -- its thread, its catalog, its reads and its gate.

The store hooks in at four places, each a line or two:

- ``get_messages``: a read below the local ConsumeQueue's minimum goes to :meth:`read`
  (``wants``), so every path built on the store's read (pull, Pop, the proxy, Spark, the Kafka
  gateway) gets cold data unchanged;
- ``min_offset``: the queue's minimum is the tier's when it holds older data;
- retention: a CommitLog segment is deleted only when :meth:`covers` it (every queue's
  watermark is past each of the segment's entries), unless ``tier_allow_unuploaded_delete``;
  the uploader then counts the lost offsets as gaps;
- ``services``/``stats``: the thread's health and the tier's metrics;
- ``query_by_key``: the tier's per-chunk key indexes (:meth:`by_key`) answer for data whose
  local IndexFile and segments are gone.

**The thread** (``orbitmq-tier``, supervised like the store's other threads): each turn loads
the catalog once (every queue's manifest from the backend: startup never waits for the object
store, and until the catalog is loaded cold reads are retryable errors and nothing local is
deleted), then for each queue removes orphans (first time only), counts gaps, uploads chunks up
to the flushed and confirmed offset, and applies the tier TTL. A failed turn backs off from
0.5 s doubling to 30 s with 20 % jitter; the first turn that works ends the outage. A restart
resumes every queue at its manifest's watermark.

Reads of the tier happen on the caller's thread (a broker reader thread: the broker never runs
a read below the local minimum on its loop) and fail with ``TierUnavailableError``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from orbitmq.common.errors import TierUnavailableError
from orbitmq.common.record import StoredMessage
from orbitmq.store.commit_log import CommitLog
from orbitmq.store.config import StoreConfig
from orbitmq.store.consume_queue import ENTRY_DTYPE, ConsumeQueue, ConsumeQueueTable
from orbitmq.store.dispatch import Dispatcher
from orbitmq.store.reader import GetResult, store_time
from orbitmq.store.supervise import ServiceHealth
from orbitmq.store.tier.backend import TierBackend
from orbitmq.store.tier.cold import ChunkCache, find_record, read_cold, time_to_offset
from orbitmq.store.tier.identity import check_identity
from orbitmq.store.tier.keys import find_by_key, index_missing
from orbitmq.store.tier.layout import MANIFEST, QueueManifest
from orbitmq.store.tier.uploader import build_chunk, expire_chunks, remove_orphans, upload_chunk

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
RESTORE_STATUS_S = 2.0
"""``--tier-restore`` logs where it is at most this often (a restore that rebuilds key indexes
reads every old chunk, which can take minutes)."""
CHUNKS_PER_QUEUE_TURN = 64  # one queue far behind does not starve the others for long


class TierService:
    def __init__(
        self,
        config: StoreConfig,
        backend: TierBackend,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        clock: Callable[[], int],
    ) -> None:
        self.config = config
        self.backend = backend
        self.commit_log = commit_log
        self.queues = queues
        self.clock = clock
        self.cache = ChunkCache(backend, config.tier_cache_bytes)
        self.health = ServiceHealth("tier")
        self.manifests: dict[tuple[str, int], QueueManifest] = {}
        self.loaded = False
        self.tier_id: str | None = None  # identity.py: set by the first load that works
        self.topic_ttl: dict[str, int] = {}
        self.allow_gaps = config.tier_allow_unuploaded_delete
        self._reconciled: set[tuple[str, int]] = set()
        # Where a queue never uploaded starts: its local minimum when first seen, so offsets
        # deleted before its first upload (allowed gaps) are counted, not skipped silently.
        self._baseline: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()  # guards ``manifests`` replacement per queue
        self._turn = threading.Lock()  # one upload pass at a time (the thread, or a test)
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self.uploaded_chunks = 0
        self.uploaded_bytes = 0
        self.orphans_removed = 0
        self.expired_chunks = 0
        self.gap_messages = 0
        self.last_error = ""
        self.turns = 0  # turns of the thread, done or failed (tests wait for the first)
        self.dispatcher: Dispatcher | None = None  # restore moves an empty log's start
        self.plain: Callable[[memoryview], bytes | memoryview] | None = None
        """Stored record -> record to upload (encryption at rest sets it to the sealer's
        ``plain``: a sealed record needs its segment's key, which local deletion removes)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._skip_leading_holes()
        if self.config.tier_restore:
            self.restore()
        self._note_baselines()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="orbitmq-tier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def wake(self) -> None:
        self._kick.set()

    def _run(self) -> None:
        interval = self.config.tier_upload_interval_ms / 1000
        wait = 0.0
        streak = 0
        while not self._stop.is_set():
            self._kick.wait(wait)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - supervised: reported and retried
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.health.failed(exc)
                self.turns += 1  # last: a reader seeing the turn counted sees its outcome
                streak += 1
                wait = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(streak - 1, 8))
                wait *= 1 + random.uniform(-0.2, 0.2)
                continue
            streak = 0
            self.health.ok()
            self.turns += 1
            wait = interval

    # ------------------------------------------------------------------ one turn

    def load(self) -> None:
        """Read every queue's manifest from the backend (once; retried while it fails)."""
        self.backend.probe()
        # An unmounted folder or a wrong bucket lists as an empty tier: never load it as one.
        self.tier_id = check_identity(self.backend, self.config.store_path)
        found: dict[tuple[str, int], QueueManifest] = {}
        for key in self.backend.list(""):
            if key.endswith("/" + MANIFEST):
                m = QueueManifest.decode(self.backend.get(key))
                found[(m.topic, m.queue_id)] = m
        with self._lock:
            for k, m in found.items():
                self.manifests.setdefault(k, m)
            self.loaded = True
        log.info("tier %s: %d queue manifests loaded", self.backend.describe(), len(found))

    def _skip_leading_holes(self) -> None:
        """A restored queue's first ConsumeQueue file begins below its tier watermark, with
        empty entries there; reloading sets the queue's minimum to the file's start. Move it
        past those holes ("no entry" by the storage format), so the offsets below are the
        tier's again rather than local records that fail their checks."""
        for cq in list(self.queues.queues.values()):
            while cq.min_offset < cq.max_offset:
                raw = cq.entries(cq.min_offset, cq.max_offset - cq.min_offset)
                sizes = np.frombuffer(raw, dtype=ENTRY_DTYPE)["size"]
                filled = np.flatnonzero(sizes > 0)
                if len(filled):
                    cq.min_offset += int(filled[0])
                    break
                if not len(sizes):
                    break
                cq.min_offset += len(sizes)

    def restore(self) -> int:
        """Disaster recovery from the bucket: load every manifest now (blocking; an unreachable
        tier fails the start, as the operator asked for it) and make each queue the local store
        lacks continue at its watermark, with everything below it read from the tier. Call it
        before any append. Returns how many queues were restored."""
        self.load()
        cl = self.commit_log
        end = max((c.end_phy for m in self.manifests.values() for c in m.chunks), default=0)
        if not cl.segments.segments and cl.max_offset < end and self.dispatcher is not None:
            # An empty log starts past every offset the tier holds (at a segment boundary, as a
            # new slave's does), so old message ids never name a new record.
            start = -(-end // cl.segment_size) * cl.segment_size
            with cl.lock:
                cl.max_offset = cl.flushed_offset = start
                self.dispatcher.reput_offset = start
        restored = 0
        todo = sorted(self.manifests.items())
        log.warning("tier restore: %d queues in %s", len(todo), self.backend.describe())
        last_line = time.monotonic()
        for done, ((topic, qid), m) in enumerate(todo):
            if time.monotonic() - last_line >= RESTORE_STATUS_S:  # progress of a long restore
                last_line = time.monotonic()
                log.warning("tier restore: %d/%d queues (%s/%d)", done, len(todo), topic, qid)
            indexed = index_missing(self.backend, m)  # chunks from before key indexes
            if indexed is not None:
                self._install((topic, qid), indexed)
            cq = self.queues.get_or_create(topic, qid)
            if cq.max_offset >= m.watermark:
                continue
            if cq.max_offset > cq.min_offset:
                log.error("tier restore: %s/%d holds [%d, %d) locally, below the tier's %d: kept",
                          topic, qid, cq.min_offset, cq.max_offset, m.watermark)  # fmt: skip
                continue
            with self.commit_log.lock:
                cq.min_offset = cq.max_offset = m.watermark
                self.commit_log.queue_offsets[(topic, qid)] = m.watermark
            restored += 1
        log.warning("tier restore: %d queues continue at their tier watermark", restored)
        return restored

    def run_once(self) -> None:
        """One upload pass over every queue (the thread's turn; tests call it directly)."""
        with self._turn:
            self._pass()

    def _pass(self) -> None:
        if not self.loaded:
            self.load()
        cl = self.commit_log
        limit = min(cl.flushed_offset, cl.confirm_offset)
        cfg = self.config
        for (topic, qid), cq in list(self.queues.queues.items()):
            key = (topic, qid)
            m = self.manifests.get(key)
            if m is None:
                start = min(self._baseline.get(key, cq.min_offset), cq.min_offset)
                m = QueueManifest(topic, qid, watermark=start, min_offset=start)
            if key not in self._reconciled:
                self.orphans_removed += remove_orphans(self.backend, m)
                self._reconciled.add(key)
            if m.watermark < cq.min_offset:  # deleted locally before upload: a counted gap
                lost = cq.min_offset - m.watermark
                m = m.copy()
                m.gaps += lost
                m.watermark = cq.min_offset
                if not m.chunks:
                    m.min_offset = m.watermark
                self.backend.put(f"{topic}/{qid}/{MANIFEST}", m.encode())
                self.gap_messages += lost
                log.error("tier: %s/%d lost %d offsets deleted locally before upload",
                          topic, qid, lost)  # fmt: skip
                self._install(key, m)
            for _ in range(CHUNKS_PER_QUEUE_TURN):
                if self._stop.is_set():
                    return
                chunk = build_chunk(
                    cl, cq, m.watermark, limit, cfg.tier_chunk_max_messages,
                    cfg.tier_chunk_max_bytes, self.plain,
                )  # fmt: skip
                if chunk is None:
                    break
                m = upload_chunk(self.backend, m, chunk, self.clock())
                self._install(key, m)
                self.uploaded_chunks += 1
                self.uploaded_bytes += len(chunk.data)
        self._expire()

    def _install(self, key: tuple[str, int], m: QueueManifest) -> None:
        with self._lock:
            self.manifests[key] = m

    def _expire(self) -> None:
        now = self.clock()
        for key, m in list(self.manifests.items()):
            ttl = self.topic_ttl.get(key[0], self.config.tier_retention_ms)
            if ttl <= 0 or not m.chunks:
                continue
            new = expire_chunks(self.backend, m, now - ttl)
            if new is not None:
                self.expired_chunks += len(m.chunks) - len(new.chunks)
                self._install(key, new)

    def set_topic_ttl(self, topic: str, ttl_ms: int | None) -> None:
        """Per-topic tier retention (None: the broker's ``tier_retention_ms``)."""
        if ttl_ms is None:
            self.topic_ttl.pop(topic, None)
        else:
            self.topic_ttl[topic] = ttl_ms

    # ------------------------------------------------------------------ reads

    def _local_min(self, topic: str, queue_id: int) -> int | None:
        cq = self.queues.get(topic, queue_id)
        return cq.min_offset if cq is not None else None

    def wants(self, topic: str, queue_id: int, offset: int, floor: int = 0) -> bool:
        """Whether a read of ``offset`` is the tier's: below the local data, with the tier
        holding (or possibly holding: catalog not loaded yet) this queue's older offsets; or
        below the topic's retention ``floor`` (its local retention: what the local data no
        longer serves) and held by the tier, which keeps it until the tier TTL."""
        local = self._local_min(topic, queue_id)
        m = self.manifests.get((topic, queue_id))
        if local is None:
            return m is not None and m.held
        if offset >= local:
            if offset >= floor:
                return False
            if not self.loaded:
                return True  # maybe held: a retryable error, never a silent skip
            return m is not None and m.held and m.min_offset <= offset < m.watermark
        if not self.loaded:
            return True  # unknown yet: a retryable error, never a silent skip
        return m is not None and (m.held or m.gaps > 0)

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tags: Iterable[str] | None,
        max_offset: int,
    ) -> GetResult:
        if not self.loaded:
            raise TierUnavailableError(
                f"tier {self.backend.describe()} not reachable yet: {self.health.degraded}"
            )
        m = self.manifests[(topic, queue_id)]
        return read_cold(self.cache, m, offset, max_count, max_bytes, tags, max_offset)

    def read_record(self, physical_offset: int) -> memoryview | None:
        """The record whose original CommitLog offset is ``physical_offset`` (message ids of
        data only the tier holds), or None. Retryable error while the tier is unreachable."""
        if not self.loaded:
            raise TierUnavailableError(f"tier {self.backend.describe()} not reachable yet")
        for m in list(self.manifests.values()):
            found = find_record(self.cache, m, physical_offset)
            if found is not None:
                return found
        return None

    def by_key(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, skip: set[int]
    ) -> list[StoredMessage]:
        """Up to ``max_num`` messages of ``topic`` the tier holds under ``key`` (KEYS word or
        unique id), newest first, leaving out CommitLog offsets in ``skip`` (found locally).
        Retryable error while the tier is unreachable."""
        if not self.loaded:
            raise TierUnavailableError(f"tier {self.backend.describe()} not reachable yet")
        found: list[StoredMessage] = []
        queues = [m for (t, _q), m in list(self.manifests.items()) if t == topic and m.held]
        for m in queues:
            for msg in find_by_key(self.cache.get, m, key, begin_ms, end_ms):
                if msg.physical_offset in skip:
                    continue
                skip.add(msg.physical_offset)
                found.append(msg)
                if len(found) >= max_num:
                    return found
        return found

    def time_offset(self, cq: ConsumeQueue, timestamp_ms: int) -> int:
        """Time to offset when the local data starts at or after ``timestamp_ms``: the first
        tier record stored at or after it (chunks by their newest time, then the index), else
        the local minimum. Retryable error while the tier is unreachable."""
        m = self.manifests.get((cq.topic, cq.queue_id))
        if not self.loaded and cq.min_offset > 0:
            raise TierUnavailableError(f"tier {self.backend.describe()} not reachable yet")
        if m is None or not m.held or m.min_offset >= cq.min_offset:
            return cq.min_offset
        found = time_to_offset(self.cache, m, timestamp_ms)
        return cq.min_offset if found is None else min(found, cq.min_offset)

    def min_offset(self, topic: str, queue_id: int, local: int) -> int:
        m = self.manifests.get((topic, queue_id))
        if m is not None and m.held and m.min_offset < local:
            return m.min_offset
        return local

    # ------------------------------------------------------------------ retention gate

    def covers(self, seg_end: int) -> bool:
        """Every ConsumeQueue entry pointing below ``seg_end`` is in the tier (or the operator
        allows counted gaps)."""
        if self.allow_gaps:
            self._note_baselines()
            return True
        if not self.loaded:
            return False
        for key, cq in list(self.queues.queues.items()):
            m = self.manifests.get(key)
            wm = m.watermark if m is not None else cq.min_offset
            if wm >= cq.max_offset:
                continue
            entry = cq.entry(max(wm, cq.min_offset))
            if entry is None or entry[0] < seg_end:
                return False
        return True

    def _note_baselines(self) -> None:
        for key, cq in list(self.queues.queues.items()):
            if key not in self.manifests:
                self._baseline.setdefault(key, cq.min_offset)

    # ------------------------------------------------------------------ observability

    def ranges(self, topic: str, queue_id: int) -> dict[str, int]:
        """A queue's local and tier ranges (GET_TOPIC_STATS; ``orbitmq topic describe``)."""
        cq = self.queues.get(topic, queue_id)
        local = cq.min_offset if cq is not None else 0
        m = self.manifests.get((topic, queue_id))
        wm = m.watermark if m is not None else local
        return {
            "local_min_offset": local,
            "tier_min_offset": m.min_offset if m is not None and m.held else wm,
            "tier_max_offset": wm,
            "tier_last_upload_ms": m.last_upload_ms if m is not None else 0,
        }

    def oldest_kept(self) -> dict[tuple[str, int], int]:
        """(topic, queue) -> store time of the oldest record the tier holds of that queue (the
        tiered ``rocketmq_storage_message_reserve_time``; its chunks' ``min_ts``)."""
        out: dict[tuple[str, int], int] = {}
        for key, m in list(self.manifests.items()):
            times = [c.min_ts for c in list(m.chunks) if c.min_ts > 0]
            if times:
                out[key] = min(times)
        return out

    def status(self) -> dict[str, object]:
        """What ``orbitmq tier status`` shows: the tier and each queue's upload progress."""
        queues = []
        for (topic, qid), cq in sorted(self.queues.queues.items()):
            m = self.manifests.get((topic, qid))
            wm = m.watermark if m is not None else cq.min_offset
            lag_bytes = 0
            if wm < cq.max_offset:
                entry = cq.entry(max(wm, cq.min_offset))
                if entry is not None:
                    lag_bytes = max(0, self.commit_log.max_offset - entry[0])
            queues.append(
                {
                    "topic": topic,
                    "queue_id": qid,
                    "local_min": cq.min_offset,
                    "local_max": cq.max_offset,
                    "tier_min": m.min_offset if m is not None and m.held else wm,
                    "tier_max": wm,
                    "lag_messages": max(0, cq.max_offset - wm),
                    "lag_bytes": lag_bytes,
                    "chunks": len(m.chunks) if m is not None else 0,
                    "gaps": m.gaps if m is not None else 0,
                    "last_upload_ms": m.last_upload_ms if m is not None else 0,
                }
            )
        return {
            "backend": self.backend.describe(),
            "available": self.health.degraded is None and self.loaded,
            "degraded": self.health.degraded or "",
            "errors": self.health.failures,
            "stats": self.stats(),
            "queues": queues,
        }

    def stats(self) -> dict[str, int]:
        lag = 0
        oldest = 0
        now = self.clock()
        for key, cq in list(self.queues.queues.items()):
            m = self.manifests.get(key)
            wm = m.watermark if m is not None else cq.min_offset
            if wm >= cq.max_offset:
                continue
            lag += cq.max_offset - wm
            # How long the oldest record not uploaded has waited (its store time).
            ts = store_time(self.commit_log, cq.entry(max(wm, cq.min_offset)))
            if ts is not None:
                oldest = max(oldest, now - ts)
        return {
            "tier_available": int(self.health.degraded is None and self.loaded),
            "tier_errors": self.health.failures,
            "tier_upload_lag_messages": lag,
            "tier_upload_lag_ms": oldest,
            "tier_uploaded_chunks": self.uploaded_chunks,
            "tier_uploaded_bytes": self.uploaded_bytes,
            "tier_gap_messages": self.gap_messages,
            "tier_expired_chunks": self.expired_chunks,
            "tier_cold_gets": self.cache.gets,
        }

    def wait_uploaded(self, timeout: float = 10.0) -> bool:
        """Block until every queue's watermark reaches its max offset (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.loaded and all(
                (m := self.manifests.get(k)) is not None and m.watermark >= cq.max_offset
                for k, cq in list(self.queues.queues.items())
            ):
                return True
            self.wake()
            time.sleep(0.02)
        return False
