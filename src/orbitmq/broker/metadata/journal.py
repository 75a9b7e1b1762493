"""MetadataJournal: a master's side of the metadata log (records.py): what its managers change
becomes records appended to :data:`~orbitmq.broker.metadata.records.METADATA_TOPIC`.

Order: **apply, then log.** A manager changes its table and saves its file, then calls
:meth:`MetadataJournal.record`; a request that changes metadata answers only after
:meth:`MetadataJournal.sync` (the record appended and, in sync replication, on every in-sync
slave). A crash between the two leaves a change that this broker has and its log has not; its
client got no answer (outcome unknown, as a send's FLUSH_SLAVE_TIMEOUT; the change is an
idempotent upsert and may be sent again). It is never lost silently the other way round: what
a replica has in its log is what the master had applied. The log is the truth after a
failover because every master writes a snapshot when it takes office (:meth:`activate`): a
former master rejoining as a slave applies its successor's snapshot, which deletes what only
it had; a master restarted in place logs the change it had applied but not logged.

Coalescing. Topic and group changes wake the writer at once. Consumer offsets set without a
waiting request (pull piggy-back commits, Pop) are kept per queue, the last value only, and
logged every ``offset_interval_s`` (one record a second at most, whatever the commit rate); a
commit request (its :meth:`sync`) logs them at once. Everything pending when the writer wakes
goes into one append (one MessageBatch, a few envelopes), so N concurrent commits cost one
append. Offsets pending when a delete is recorded are logged before the delete (order kept).

A failed append or replication wait fails the waiting requests and keeps the changes pending,
tried again after a backoff (a record logged twice is harmless: changes are whole states). On a
slave the journal is inactive: :meth:`record` drops the change (the slave's managers change
only by applying its master's records, which never call the journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.metadata.records import (
    METADATA_TOPIC,
    TAG,
    Change,
    Offsets,
    SnapshotBegin,
    SnapshotEnd,
    encode_envelopes,
)
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import MQError, ServiceNotAvailableError
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.common.tasks import TaskSet
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.supervise import ServiceHealth

log = logging.getLogger(__name__)


class _Waits(Protocol):
    async def wait_replicated(self, end_offset: int) -> None: ...


_PROPS = encode_properties({"TAGS": TAG})
_MAX_BACKOFF_S = 2.0


class MetadataJournal:
    """The writer of the metadata log (active only while this broker is a master)."""

    def __init__(
        self,
        writer_id: int,
        append: Callable[[MessageBatch], Awaitable[AppendResult]],
        wait_replicated: Callable[[int], Awaitable[None]],
        *,
        offset_interval_s: float = 1.0,
        snapshot_interval_s: float = 3600.0,
    ) -> None:
        self.writer_id = writer_id
        self._append = append
        self._wait_replicated = wait_replicated
        self._snapshot: Callable[[], list[Change]] = list
        self.offset_interval_s = offset_interval_s
        self.snapshot_interval_s = snapshot_interval_s
        self.epoch = 0
        self.active = False
        self.health = ServiceHealth("metadata-journal")
        self.records_logged = 0
        """Envelopes appended (a metric and for the tests)."""
        self._lock = threading.Lock()
        self._items: list[Change] = []
        self._open: dict[tuple[str, str, int], int] = {}
        self._seq = 0
        self._logged = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._tasks = TaskSet("metadata-journal", logger=log)
        self._snapshot_id = 0

    @classmethod
    def for_broker(
        cls,
        config: BrokerConfig,
        append: Callable[[MessageBatch], Awaitable[AppendResult]],
        replication: _Waits,
    ) -> MetadataJournal | None:
        """A replicated broker's journal (None without ``ha_enable``: nothing is logged)."""
        # Controller mode (``controller_addrs``, on the failover branch) replicates whatever
        # ha_enable says; getattr keeps this module independent of that field's arrival.
        if not (config.ha_enable or getattr(config, "controller_addrs", None)):
            return None
        return cls(
            config.broker_id,
            append,
            replication.wait_replicated,
            offset_interval_s=config.metadata_offset_log_interval_ms / 1000,
            snapshot_interval_s=config.metadata_snapshot_interval_s,
        )

    def set_snapshot_source(self, snapshot: Callable[[], list[Change]]) -> None:
        """What a snapshot holds: the broker's whole state as put changes (service.py)."""
        self._snapshot = snapshot

    # ------------------------------------------------------------------ the managers' side

    def record(self, change: Change) -> None:
        if not self.active:
            return
        with self._lock:
            self._close_offsets_locked()
            self._items.append(change)
            self._seq += 1
        self._poke()

    def record_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if not self.active:
            return
        with self._lock:
            self._open[(group, topic, queue_id)] = offset
            self._seq += 1

    async def sync(self) -> None:
        if not self.active:
            return
        target = self._seq
        if self._logged >= target:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        self._poke()
        await fut

    def _poke(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake.set()
        else:  # a manager called on a worker thread (asyncio.to_thread)
            loop.call_soon_threadsafe(self._wake.set)

    def _close_offsets_locked(self) -> None:
        """Turn the open per-queue offsets into Offsets changes at this point of the order."""
        if not self._open:
            return
        per_group: dict[str, list[tuple[str, int, int]]] = {}
        for (group, topic, queue_id), offset in self._open.items():
            per_group.setdefault(group, []).append((topic, queue_id, offset))
        self._open.clear()
        for group, entries in per_group.items():
            for i in range(0, len(entries), 2000):
                self._items.append(Offsets(group=group, entries=entries[i : i + 2000]))

    # ------------------------------------------------------------------ role

    @property
    def idle(self) -> bool:
        """Nothing recorded is waiting to be logged."""
        return self._logged >= self._seq

    async def activate(self, epoch: int) -> None:
        """Become the writer (a master taking office at ``epoch``): log a snapshot of this
        broker's state first, and wait until it is logged (a failure is logged and retried
        by the writer; it does not stop the broker taking office)."""
        self._loop = asyncio.get_running_loop()
        self.epoch = epoch
        self._snapshot_id += 1
        sid = now_ms() * 1000 + self._snapshot_id % 1000
        with self._lock:
            if not self.active:
                self._items.clear()  # nothing recorded while inactive was kept
            self._close_offsets_locked()
            self._items += [SnapshotBegin(snapshot_id=sid), *self._snapshot(),
                            SnapshotEnd(snapshot_id=sid)]  # fmt: skip
            self._seq += 1
        if not self.active:  # again at a new epoch while writing: one writer, a new snapshot
            self.active = True
            self._tasks.spawn(self._writer(), name="metadata-journal")
        try:
            await self.sync()
        except MQError as exc:  # kept pending and tried again: taking office goes on
            log.warning("metadata snapshot not logged yet at epoch %d: %s", epoch, exc)

    async def deactivate(self) -> None:
        """Stop writing (this broker is no longer master). Changes not yet logged are dropped:
        their requests got no answer, and the new master's snapshot removes them here."""
        self.active = False
        self._wake.set()
        await self._tasks.close(timeout=5.0)
        with self._lock:
            dropped = len(self._items) + len(self._open)
            self._items.clear()
            self._open.clear()
            self._logged = self._seq
        if dropped:
            log.warning("%d metadata changes not logged when this broker stopped being master",
                        dropped)  # fmt: skip
        self._fail_waiters(self._seq, ServiceNotAvailableError("no longer master"))

    async def close(self, timeout: float = 5.0) -> None:
        """At a clean stop: log what is pending (bounded), then stop."""
        if self.active:
            with contextlib.suppress(MQError, OSError, TimeoutError):
                async with asyncio.timeout(timeout):
                    with self._lock:
                        self._close_offsets_locked()
                    await self.sync()
        await self.deactivate()

    # ------------------------------------------------------------------ the writer

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        next_snapshot = loop.time() + self.snapshot_interval_s
        pause = 0.0
        while self.active:
            with contextlib.suppress(TimeoutError):
                # After a failure, the pending changes are tried again after the backoff.
                async with asyncio.timeout(pause or self.offset_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopped():
                return
            if loop.time() >= next_snapshot:
                next_snapshot = loop.time() + self.snapshot_interval_s
                sid = now_ms() * 1000
                with self._lock:
                    self._close_offsets_locked()
                    self._items += [SnapshotBegin(snapshot_id=sid), *self._snapshot(),
                                    SnapshotEnd(snapshot_id=sid)]  # fmt: skip
                    self._seq += 1
            with self._lock:
                self._close_offsets_locked()
                items, self._items = self._items, []
                high = self._seq
            if not items:
                self._logged = max(self._logged, high)
                self._resolve()
                continue
            try:
                await self._log(items)
            except (MQError, OSError) as exc:
                if not isinstance(exc, MQError):
                    exc = ServiceNotAvailableError(f"cannot log a metadata change: {exc}")
                with self._lock:
                    self._items[:0] = items  # tried again; whole states, so twice is harmless
                pause = min(_MAX_BACKOFF_S, self.health.failed(exc))
                self._fail_waiters(high, exc)
                continue
            pause = 0.0
            self.health.ok()
            self._logged = max(self._logged, high)
            self._resolve()

    def _stopped(self) -> bool:
        """Read again after an await (deactivate may have run meanwhile)."""
        return not self.active

    async def _log(self, items: list[Change]) -> None:
        bodies = encode_envelopes(self.writer_id, self.epoch, items)
        batch = MessageBatch(METADATA_TOPIC, 0, bodies, [_PROPS] * len(bodies),
                             born_timestamp_ms=now_ms())  # fmt: skip
        result = await self._append(batch)
        self.records_logged += len(bodies)
        await self._wait_replicated(result.end_offset)

    def _resolve(self) -> None:
        keep = []
        for target, fut in self._waiters:
            if target <= self._logged:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._waiters = keep

    def _fail_waiters(self, high: int, exc: BaseException) -> None:
        keep = []
        for target, fut in self._waiters:
            if target <= high:
                if not fut.done():
                    fut.set_exception(exc)
            else:
                keep.append((target, fut))
        self._waiters = keep
