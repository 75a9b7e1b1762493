"""MessageStore: the storage engine's one entry point (a library; it knows nothing of networks).

    append(batch)  -> AppendResult      page-cache write, never waits for fsync
    flush_future(end_offset) -> Future  completes when that much is durable (group commit)
    put(batch)     -> AppendResult      append, and in SYNC_FLUSH wait for the fsync
    get_messages(topic, queue, offset, max_count, max_bytes, tags) -> GetResult (memoryviews)
    min_offset / max_offset / offset_for_timestamp / get_message / query_by_key
    replication (docs/ha.md): epochs, read_replication, append_replicated, truncate_to,
    set_confirm_offset (reads and dispatch stop there; without replicas, at the max offset;
    kept in ``confirm`` across restarts, store/confirm.py)

Every call is synchronous and may block on disk. An event loop may append and dispatch on its
own thread (page-cache writes; the broker does so for small batches, docs/benchmarks.md) and
run other calls on a worker thread; it awaits fsyncs through ``request_flush`` and a flush
listener. The store itself starts no event loop. Background threads: dispatcher, flusher, checkpointer,
retention. The store is opened by one process at a time (flock on ``lock``).

The store builds its parts (CommitLog, ConsumeQueueTable, IndexService, Dispatcher) and hands
each helper only the parts it uses: ``recover(parts, ...)``, ``RetentionService(...)``,
``read_queue(view, ...)``; no helper imports this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import (
    DiskFullError,
    FlushTimeoutError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import RecordError, StoredMessage, check_record, decode, pack_host
from orbitmq.common.validation import validate_bodies_and_properties, validate_topic
from orbitmq.store import layout
from orbitmq.store.checkpoint import Checkpoint
from orbitmq.store.commit_log import AppendResult, CommitLog
from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.confirm import ConfirmFile
from orbitmq.store.consume_queue import ConsumeQueueTable
from orbitmq.store.dispatch import ArrivalListener, Dispatcher
from orbitmq.store.epoch import EPOCH_FILE, EpochFile
from orbitmq.store.flush import FlushListener, FlushService, PeriodicService
from orbitmq.store.index_service import IndexService
from orbitmq.store.reader import (
    GetResult,
    GetStatus,
    ReadView,
    offset_for_timestamp,
    read_queue,
    store_time,
)
from orbitmq.store.recovery import RecoveryReport, StoreParts, recover
from orbitmq.store.replica import append_chunk, read_chunk
from orbitmq.store.retention import RetentionService, TopicRetention
from orbitmq.store.sealing import make_sealer
from orbitmq.store.segment import FileOps, io_error
from orbitmq.store.status import degraded, messages_by_key, store_stats
from orbitmq.store.supervise import ServiceHealth
from orbitmq.store.tier.factory import attach_tier
from orbitmq.store.truncate import TruncateReport, check_cut, truncate

__all__ = ["GetResult", "GetStatus", "MessageStore"]
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class MessageStore:
    """The store. ``open()`` recovers and starts the background services; ``close()`` flushes,
    writes a clean checkpoint and removes the abort marker."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        fs: FileOps | None = None,
        clock: Callable[[], int] = now_ms,
        disk_usage: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.fs = fs or FileOps()
        self.clock = clock
        root = config.store_path
        self.root = root
        self.abort_path = root / layout.ABORT_FILE
        self.checkpoint_path = root / layout.CHECKPOINT_FILE
        self.confirm_file = ConfirmFile(root / "confirm", self.fs)
        self.commit_log = CommitLog(
            root / layout.COMMITLOG_DIR, config.mapped_file_size_commit_log, self.fs, clock
        )
        self.queues = ConsumeQueueTable(
            root / layout.CONSUMEQUEUE_DIR,
            config.consume_queue_entries_per_file,
            self.fs,
            config.max_open_consume_queue_files,
        )
        self.index: IndexService | None = None
        if config.message_index_enable:
            index_dir = root / layout.INDEX_DIR
            self.index = IndexService(
                index_dir, config.max_hash_slot_num, config.max_index_num, clock=clock, fs=self.fs
            )
        self.dispatcher = Dispatcher(self.commit_log, self.queues, self.index)
        self.flusher = FlushService(self.commit_log, config)
        self.retention = RetentionService(
            config,
            self.commit_log,
            self.queues,
            self.index,
            self.dispatcher,
            clock,
            root,
            disk_usage=disk_usage,
        )
        self._view = ReadView(self.commit_log, self.queues, self.retention)
        self.sealer = make_sealer(
            root, config.mapped_file_size_commit_log, config.encryption_key_file,
            config.encryption_retired_key_files, config.encrypt_at_rest,
            config.encryption_cache_bytes,
        )  # fmt: skip
        if self.sealer is not None:  # encryption at rest: seal on append, open on read
            self.commit_log.sealer = self.dispatcher.opener = self.sealer
            self.sealer.view_at = self.commit_log.view_at
            self._view.props_of = self.sealer.props_of
        self.tier = attach_tier(self)  # docs/tiered-storage.md; after the parts it reads
        if self.sealer is None and self.tier is None and self.fs.read_check is None:
            self.dispatcher.recent.view = self._view  # reads answered from a round: recent.py
        self.read_told = self.dispatcher.recent.read
        """``get_messages`` without tags, from the round running on this thread, or None."""
        self.epochs = EpochFile(root / EPOCH_FILE, self.fs)
        self._checkpointer = PeriodicService(
            "orbitmq-checkpoint", config.flush_interval_consume_queue_ms / 1000, self.checkpoint
        )
        self._cleaner = PeriodicService(
            "orbitmq-retention", config.clean_resource_interval_ms / 1000, self.retention.run
        )
        self._store_host = pack_host(config.store_host)
        self._checkpoint_lock = threading.Lock()
        self._last_recheck = 0.0
        self.read_errors = 0
        self._lock_fd = -1
        self.trusted_from = 0  # records at or past this offset were written by this process
        self.truncations = 0
        """How many times ``truncate_to`` cut this log (readers that keep a position compare)."""
        self.last_cut = 0
        """Where the last ``truncate_to`` cut it."""
        self.is_open = False
        self.recovery: RecoveryReport | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> RecoveryReport:
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / layout.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise StoreError(f"{self.root} is open in another process") from exc
        try:
            self.epochs.load()
            if self.sealer is not None:  # keys unwrap, and a fresh writer epoch
                self.sealer.start(self.root / layout.COMMITLOG_DIR)
        except StoreError:
            self._release()
            raise
        self.commit_log.confirmed = self.confirm_file.load()  # serve no more than before
        parts = StoreParts(self.commit_log, self.queues, self.index, self.dispatcher)
        report = recover(parts, self.checkpoint_path, self.abort_path)
        self.epochs.truncate_after(self.commit_log.max_offset)  # a crash inside truncate_to
        self.recovery = report
        self.trusted_from = self.commit_log.max_offset
        self._view.verify_before = self.trusted_from if self.config.check_crc_on_read else -1
        self.retention.run(startup=True)
        if not report.clean:
            self.checkpoint()
        self.abort_path.touch()
        layout.fsync_dir(self.root)
        self.dispatcher.start()
        self.flusher.start()
        self._checkpointer.start()
        self._cleaner.start()
        if self.tier is not None:
            self.tier.start()
        self.is_open = True
        return report

    def close(self) -> None:
        """Stop the services, dispatch and fsync everything, mark the shutdown clean."""
        if not self.is_open:
            return
        self._stop_services()
        try:
            if self.commit_log.fenced:
                # An fsync failed: leave the abort marker so the next start verifies the tail.
                log.error("closing after an I/O failure (%s): not a clean shutdown",
                          self.commit_log.fenced)  # fmt: skip
                return
            self.dispatcher.dispatch_until(self.commit_log.confirm_offset)  # not above it
            self.commit_log.flush()
            self.queues.flush()
            if self.index is not None:
                self.index.flush()
            end = self.commit_log.max_offset
            self.confirm_file.save(self.commit_log.confirmed)
            Checkpoint(
                dispatch_safe_offset=self.dispatcher.reput_offset,
                commit_log_flushed=end,
                clean_end_offset=end,
                last_record_offset=self.queues.last_record_offset(end),
                written_at_ms=self.clock(),
                clean=True,
            ).save(self.checkpoint_path, self.fs)
            self.abort_path.unlink(missing_ok=True)
            layout.fsync_dir(self.root)
        finally:
            self._release()

    def crash_for_test(self) -> None:
        """Stop as a SIGKILL would: no flush, no checkpoint, the abort marker stays."""
        self._stop_services()
        self._release()

    def _stop_services(self) -> None:
        self.is_open = False
        if self.tier is not None:
            self.tier.stop()
        self._cleaner.stop()
        self._checkpointer.stop()
        self.flusher.stop()
        self.dispatcher.stop()

    def _release(self) -> None:
        self.commit_log.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> MessageStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checkpoint(self) -> None:
        """Fsync derived data up to what is dispatched and record that as the safe point."""
        with self._checkpoint_lock:
            if self.commit_log.fenced:
                return  # nothing past the failed fsync may be vouched for; recovery rescans it
            safe = self.dispatcher.reput_offset
            self.commit_log.flush(safe)
            self.queues.flush()
            if self.index is not None:
                self.index.flush()
            Checkpoint(
                dispatch_safe_offset=safe,
                commit_log_flushed=self.commit_log.flushed_offset,
                written_at_ms=self.clock(),
            ).save(self.checkpoint_path, self.fs)
            self.confirm_file.save(self.commit_log.confirmed)

    # ------------------------------------------------------------------ replication

    def truncate_to(
        self, offset: int, *, step: Callable[[str], None] | None = None
    ) -> TruncateReport:
        """Cut the log at ``offset`` and everything derived from it, crash-safely
        (:mod:`orbitmq.store.truncate`); the next append continues every queue right after its
        last kept entry. Call it with no reads in flight (a rejoining slave serves none). A
        failure part-way fences writes: the store must be reopened, and recovery finishes it."""
        if not self.is_open:
            raise StoreClosedError("store is not open")
        check_cut(self.commit_log, offset)
        services = (self._cleaner, self._checkpointer, self.flusher, self.dispatcher)
        for service in services:
            service.stop()
        parts = StoreParts(self.commit_log, self.queues, self.index, self.dispatcher)
        with self._checkpoint_lock, self.commit_log.lock:
            try:
                report = truncate(parts, self.epochs, self.checkpoint_path, offset, step=step)
            except BaseException as exc:
                self.commit_log.fenced = f"truncation to {offset} failed part-way: {exc}"
                raise
        self.flusher.forget_beyond(offset)
        if (confirmed := self.commit_log.confirmed) is not None:  # durable before new bytes
            self.set_confirm_offset(min(confirmed, offset))
        self.confirm_file.save(self.commit_log.confirmed)
        self.last_cut = offset
        self.truncations += 1
        for service in reversed(services):
            service.start()
        return report

    def append_replicated(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """A slave's append: the master's raw CommitLog bytes (whole records), written at
        exactly this log's end after every record was checked (:mod:`orbitmq.store.replica`;
        ReplicaOffsetError, ReplicaDataError). Returns the new end. The slave's dispatcher
        builds its ConsumeQueues, IndexFiles and timer index from them."""
        if not self.is_open:
            raise StoreClosedError("store is not open")
        if self.retention.disk_full:
            raise DiskFullError(
                f"disk use {self.retention.disk_ratio:.0f}% is above "
                f"{self.config.disk_space_warning_level_ratio}%: replication paused until space frees"
            )
        cl = self.commit_log
        if not cl.segments.segments and cl.max_offset == 0 and offset % cl.segment_size == 0:
            # A new slave starting at the master's first segment: dispatch from there.
            self.dispatcher.reput_offset = max(self.dispatcher.reput_offset, offset)
        checked = append_chunk(cl, offset, data)
        self.dispatcher.wake()
        return checked.end

    @property
    def confirm_offset(self) -> int:
        """How far reads, dispatch and arrival notifications reach (the max offset unless
        replication set one)."""
        return self.commit_log.confirm_offset

    def set_confirm_offset(self, offset: int | None) -> None:
        """Replication's confirm offset (a record boundary; None: follow the max offset).
        Consumers never see a record ending past it; the dispatcher catches up to it. It only
        holds back what is not dispatched yet: lowering it hides nothing already served (only
        ``truncate_to`` takes records back)."""
        cl = self.commit_log
        if offset is not None and cl.min_offset < offset < cl.max_offset:
            check_cut(cl, offset)
        cl.confirmed = offset
        self.dispatcher.wake()

    def read_replication(self, offset: int, max_bytes: int, limit: int | None = None) -> memoryview:
        """The master's side: whole records from ``offset``, zero-copy, at most ``max_bytes``
        (or one record), within one segment, never past ``limit`` (the next epoch's start)."""
        return read_chunk(self.commit_log, offset, max_bytes, limit)

    # ------------------------------------------------------------------ writes

    def set_store_host(self, host: tuple[str, int]) -> None:
        """The address written into each record as STORE_HOST (the broker's, once it listens)."""
        self._store_host = pack_host(host)

    def validate(self, batch: MessageBatch) -> None:
        validate_topic(batch.topic)
        validate_bodies_and_properties(
            batch.bodies,
            batch.properties,
            self.config.max_message_size,
            self.config.max_properties_size,
        )
        if batch.queue_id < 0:
            raise ValueError("queue_id must be >= 0")

    def append(self, batch: MessageBatch, *, wake_dispatcher: bool = True) -> AppendResult:
        """Validate and append to the page cache. Raises before writing anything on bad input.
        ``wake_dispatcher=False``: the caller calls ``dispatch_ready`` itself."""
        if not self.is_open:
            raise StoreClosedError("store is not open")
        self.validate(batch)
        self._check_writable()
        result = self._write(lambda: self.commit_log.append(batch, self._store_host))
        if wake_dispatcher:
            self.dispatcher.wake()
        return result

    def append_many(
        self, batches: list[MessageBatch], *, validated: bool = False
    ) -> list[AppendResult] | None:
        """Several batches in one write (``CommitLog.append_many``: one lock, one ``pwrite``;
        None: they straddle a segment end, append them one by one), made readable by the
        caller's ``dispatch_ready``. Bad input in any batch raises before anything is written
        (``validated``: the caller ran ``validate`` on each, to answer a bad one alone)."""
        if not self.is_open:
            raise StoreClosedError("store is not open")
        if not validated:
            for batch in batches:
                self.validate(batch)
        self._check_writable()
        return self._write(lambda: self.commit_log.append_many(batches, self._store_host))

    def _check_writable(self) -> None:
        failure = self.dispatcher.failure
        if failure is not None:
            raise StoreUnavailableError(
                f"dispatcher failing ({failure}): sends refused until new messages can be "
                "made readable again"
            )
        if self.retention.disk_full and not self._recheck_disk():
            if self.retention.no_space is not None:
                raise DiskFullError(f"{self.retention.no_space}: writes refused until it fits")
            raise DiskFullError(
                f"disk use {self.retention.disk_ratio:.0f}% is above "
                f"{self.config.disk_space_warning_level_ratio}%: writes refused until space frees"
            )

    def _write(self, write: Callable[[], _T]) -> _T:
        try:
            return write()
        except DiskFullError as exc:  # no room for a new segment: refuse until there is
            self.retention.note_no_space(str(exc))
            self._recheck_disk()
            raise

    def dispatch_ready(self) -> bool:
        """Make what was appended readable now, here if no round runs elsewhere (True)."""
        return self.dispatcher.dispatch_ready()

    def _recheck_disk(self) -> bool:
        """While writes are refused: look again whether they fit (a statvfs, so writes resume
        as soon as space returns) and, at most once a second, ask retention for a run that
        deletes what it may. True when writes are accepted again."""
        if self.retention.recheck():
            return True
        now = time.monotonic()
        if now - self._last_recheck >= 1.0:
            self._last_recheck = now
            self._cleaner.wake()
        return False

    def flush_future(self, end_offset: int) -> Future[None]:
        """Durability of everything before ``end_offset``: done at once in ASYNC_FLUSH."""
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            return self.flusher.request(end_offset)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def put(self, batch: MessageBatch) -> AppendResult:
        """Append; in SYNC_FLUSH also wait for the group-commit fsync (FlushTimeoutError)."""
        result = self.append(batch)
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            try:
                self.flusher.request(result.end_offset).result(
                    self.config.sync_flush_timeout_ms / 1000
                )
            except FutureTimeout as exc:
                raise FlushTimeoutError(
                    f"not fsynced within {self.config.sync_flush_timeout_ms} ms"
                ) from exc
        return result

    @property
    def sync_flush(self) -> bool:
        return self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def request_flush(self, end_offset: int) -> None:
        """SYNC_FLUSH without a Future per append: ask for an fsync up to ``end_offset`` and
        learn of it through a flush listener (one call per fsync, for every waiter at once)."""
        self.flusher.request_offset(end_offset)

    def add_flush_listener(self, listener: FlushListener) -> None:
        """``listener(flushed_offset, error)`` runs on the flush thread after every fsync."""
        self.flusher.listeners.append(listener)

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        """``listener(topic, queue_id, max_offset)`` runs on the dispatcher thread, or on the
        thread that called ``dispatch_ready``: keep it short and check which thread it is on."""
        self.dispatcher.listeners.append(listener)

    def wait_for_dispatch(self, timeout: float = 10.0) -> bool:
        """Block until every record appended (below the confirm offset) is readable."""
        return self.dispatcher.wait_for(self.commit_log.confirm_offset, timeout)

    def set_topic_retention(self, topic: str, retention: TopicRetention | None) -> None:
        self.retention.set_topic(topic, retention)

    # ------------------------------------------------------------------ reads

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        lo = max(cq.min_offset, self.retention.floor(topic, queue_id))
        return lo if self.tier is None else self.tier.min_offset(topic, queue_id, lo)

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for (t, q) in self.queues.queues if t == topic)

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tags: Iterable[str] | None = None,
    ) -> GetResult:
        """Read by queue offset (see :func:`orbitmq.store.reader.read_queue`).

        An I/O error reading the files fails this read only (StoreIOError, ``read_errors``)."""
        try:
            check = self.fs.read_check
            if check is not None:
                check(topic, queue_id, offset)
            floor = self.retention.floor(topic, queue_id)  # a topic's local retention
            if self.tier is not None and self.tier.wants(topic, queue_id, offset, floor):
                hi = self.max_offset(topic, queue_id)
                res = self.tier.read(topic, queue_id, offset, max_count, max_bytes, tags, hi)
            else:
                res = read_queue(self._view, topic, queue_id, offset, max_count, max_bytes, tags)
            return res if self.sealer is None else self.sealer.open_result(res)
        except OSError as exc:
            self.read_errors += 1
            raise io_error(f"reading {topic}/{queue_id} at {offset}", exc) from exc

    def get_message(self, physical_offset: int) -> StoredMessage | None:
        """The record at a CommitLog offset, verified and decoded, or None."""
        raw = self.read_record(physical_offset)
        return decode(raw) if raw is not None else None

    def read_record(self, physical_offset: int) -> memoryview | None:
        """The raw record at a CommitLog offset (zero-copy), verified, or None."""
        loc = self.commit_log.view_at(physical_offset)
        confirmed = self.commit_log.confirm_offset
        if loc is None and self.tier is not None and physical_offset < self.commit_log.min_offset:
            return self.tier.read_record(physical_offset)  # an id of data only the tier holds
        if loc is None or physical_offset >= confirmed:
            return None
        view, at, size = loc
        try:
            n = check_record(view, at, size)
        except RecordError:
            return None
        if not 0 < n <= confirmed - physical_offset:
            return None
        return view[at : at + n] if self.sealer is None else self.sealer.plain(view[at : at + n])

    def last_store_time(self, topic: str, queue_id: int) -> int:
        """Store timestamp of the newest message of a queue (0 if empty)."""
        cq = self.queues.get(topic, queue_id)
        if cq is None or cq.max_offset <= cq.min_offset:
            return 0
        return store_time(self.commit_log, cq.entry(cq.max_offset - 1)) or 0

    def delete_topic(self, topic: str) -> int:
        """Forget a topic's ConsumeQueues (its records stay in the CommitLog until retention
        deletes their segments). Returns the number of queues removed."""
        doomed = [key for key in self.queues.queues if key[0] == topic]
        for key in doomed:
            cq = self.queues.queues.pop(key)
            cq.destroy()
            self.commit_log.queue_offsets.pop(key, None)
        self.retention.set_topic(topic, None)
        with contextlib.suppress(OSError):
            os.rmdir(layout.topic_dir(self.queues.root, topic))
        return len(doomed)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is >= ``timestamp_ms`` (max offset if none)."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        lo = max(cq.min_offset, self.retention.floor(topic, queue_id))
        found = offset_for_timestamp(self.commit_log, cq, lo, timestamp_ms)
        return found if found > lo or not self.tier else self.tier.time_offset(cq, timestamp_ms)

    def query_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose KEYS contain ``key`` or whose unique id is ``key``
        (:func:`orbitmq.store.status.messages_by_key`; the tier's key index too)."""
        args = (topic, key, max_num, begin_ms, end_ms, self.tier)
        return messages_by_key(self.index, self.get_message, *args)

    def health(self) -> dict[str, str]:
        """What is degraded, by part, with its cause; empty when everything works
        (:func:`orbitmq.store.status.degraded`)."""
        return degraded(self.services(), self.dispatcher, self.retention, self.commit_log)

    def services(self) -> list[ServiceHealth]:
        """The failure records of the background services (for metrics)."""
        return [
            self.dispatcher.health,
            self.flusher.health,
            self._checkpointer.health,
            self._cleaner.health,
            *([self.tier.health] if self.tier is not None else []),
        ]

    def stats(self) -> dict[str, int]:
        return store_stats(self)
