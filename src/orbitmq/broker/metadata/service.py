"""MetadataService: the metadata log on a replicated broker (docs/ha.md, "Metadata replication").

Every replica, master or slave, tails the metadata topic's ConsumeQueue (woken by the store's
arrival listener, and once a second) and applies each record it did not write itself
(:func:`~orbitmq.broker.metadata.apply.apply_envelope`) to its managers and their files. The
store dispatches only up to the confirm offset, so a replica applies only records that every
in-sync replica holds: what one replica has applied, the others have in their logs.

A record is skipped when this broker wrote it as master (``writer`` is this broker's id and
``epoch`` one of the epochs it took office in, remembered in the checkpoint): a master applies
a change before logging it (journal.py). A malformed record or change is skipped and counted
(``bad_records``, ``bad_changes``), never stops the tail.

Progress is the checkpoint ``<store>/config/metadata_log.json``: the next queue offset to apply
and this broker's own epochs, written after the managers saved what it covers (a crash
re-applies a few records: whole states, so harmless). A restart replays from it.

Roles (what failover code calls, notes in docs/ha.md): :meth:`start` with the master epoch on a
master (it catches up, then :meth:`become_master`); :meth:`become_master` (catch up with every
record dispatched, remember the epoch, then the journal logs a snapshot and starts writing);
:meth:`become_slave` (the journal stops; the tail goes on). :meth:`stop` at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.metadata.apply import (
    ApplyOutcome,
    ApplyTarget,
    SnapshotTracker,
    apply_envelope,
    apply_offsets,
)
from orbitmq.broker.metadata.journal import MetadataJournal
from orbitmq.broker.metadata.records import (
    METADATA_TOPIC,
    REPLICATED_FILES,
    Change,
    FilePut,
    GroupPut,
    MetadataRecordError,
    TopicPut,
    decode_envelope,
    offset_changes,
)
from orbitmq.common.errors import ConfigError, MQError
from orbitmq.common.files import write_atomically
from orbitmq.common.record import decode
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.store.reader import GetStatus
from orbitmq.store.recovery import record_key

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "metadata_log.json"
_PASS_RECORDS = 256
_POLL_S = 1.0
_OWN_EPOCHS_KEPT = 1000


class MetadataService:
    """The metadata log's tail (every replica) and its journal (the master)."""

    def __init__(self, ctx: BrokerContext, journal: MetadataJournal) -> None:
        self.ctx = ctx
        self.journal = journal
        self.broker_id = ctx.config.broker_id
        self.config_dir = ctx.config.store.store_path / "config"
        self.path: Path = self.config_dir / CHECKPOINT_FILE
        self.target = ApplyTarget(ctx.topics, ctx.groups, ctx.offsets, self.config_dir)
        self.applied_offset = 0
        """The next queue offset of the metadata topic to apply."""
        self.last_physical = -1
        """The CommitLog offset of the record before ``applied_offset`` (to notice a cut)."""
        self.own_epochs: list[int] = []
        self._truncations = 0
        self.applied_records = 0
        self.skipped_own = 0
        self.bad_records = 0
        self.bad_changes = 0
        self._snap = SnapshotTracker()
        self._unnamed: set[str] = set()
        """Topics a snapshot dropped whose data waits for the end of the log (ApplyOutcome)."""
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks = TaskSet("metadata-tail", logger=log)
        journal.set_snapshot_source(self.snapshot_changes)
        ctx.bridge.watch(journal.health)  # a journal that cannot append degrades the broker
        ctx.metrics.registry.register(_MetadataCollector(self))
        for manager in (ctx.topics, ctx.groups, ctx.offsets):
            manager.journal = journal

    # ------------------------------------------------------------------ lifecycle and roles

    async def start(self, master_epoch: int | None) -> None:
        """Load the checkpoint, apply what was logged since, keep tailing; a master (its epoch
        given) then takes office as the journal's writer."""
        self._loop = asyncio.get_running_loop()
        store = self.ctx.store
        # The checkpoint is checked against the metadata ConsumeQueue: let it be complete.
        dispatched = await self.ctx.bridge.call(store.wait_for_dispatch, 30.0)
        await asyncio.to_thread(self._load, dispatched)
        self.ctx.store.add_arrival_listener(self._on_arrival)
        await self.catch_up()
        self._tasks.spawn(self._tail(), name="metadata-tail")
        if master_epoch is not None:
            await self.become_master(master_epoch)

    async def become_master(self, epoch: int) -> None:
        """Apply every record the store holds (the confirm offset must already allow the
        whole log to dispatch, as a new master's does), then log a snapshot and write."""
        store = self.ctx.store
        await self.ctx.bridge.call(store.wait_for_dispatch, 10.0)
        await self.catch_up()
        if epoch not in self.own_epochs:
            self.own_epochs = [*self.own_epochs, epoch][-_OWN_EPOCHS_KEPT:]
        await asyncio.to_thread(self._save)
        if self.ctx.topics.get(METADATA_TOPIC) is None:
            # Not readable by clients (a pull answers NO_PERMISSION): it holds the Pop secret.
            config = TopicConfig(topic_name=METADATA_TOPIC, read_queue_nums=1,
                                 write_queue_nums=1, perm=0)  # fmt: skip
            await asyncio.to_thread(self.ctx.topics.upsert, config)
        await self.journal.activate(epoch)
        log.info("metadata log: writing as master at epoch %d (applied up to %d)",
                 epoch, self.applied_offset)  # fmt: skip

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No apply pass runs inside (wrap ``truncate_to``: truncation wants reads quiesced)."""
        async with self._lock:
            yield

    async def become_slave(self) -> None:
        """Stop writing; the tail goes on applying the new master's records."""
        await self.journal.deactivate()

    async def stop(self) -> None:
        await self.journal.close()
        await self._tasks.close(timeout=5.0)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self._save)

    def _on_arrival(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """On the dispatcher thread."""
        loop = self._loop
        if topic == METADATA_TOPIC and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def _tail(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_POLL_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.catch_up()
            except (MQError, OSError) as exc:
                log.warning("metadata log: apply failed, retried: %s", exc)
                await asyncio.sleep(_POLL_S)
            except Exception:  # the tail must outlive any one bad pass
                log.exception("metadata log: apply pass failed, retried")
                await asyncio.sleep(_POLL_S)

    # ------------------------------------------------------------------ applying

    async def catch_up(self) -> int:
        """Apply every dispatched record from the checkpoint on; returns how many."""
        total = 0
        async with self._lock:
            while True:
                out, count = await asyncio.to_thread(self._pass)
                total += count
                if count == 0:
                    break
                await self._after(out)
            await self._drop_unnamed()
        return total

    async def _drop_unnamed(self) -> None:
        """At the end of the log: delete the data of the topics a snapshot dropped and no later
        record put back. Never earlier: a replay from the start (``_verify``) meets a snapshot
        older than the topics created after it, and deleting their queues then would destroy
        acknowledged messages on this replica (re-creating the config brings back no data)."""
        ctx = self.ctx
        if self.applied_offset < ctx.store.commit_log.queue_offsets.get((METADATA_TOPIC, 0), 0):
            # The log holds metadata records not dispatched yet (above the confirm offset, as
            # after a restart): a later one may put the topic back. Not the end: wait for it.
            return
        gone = sorted(t for t in self._unnamed if ctx.topics.get(t) is None)
        self._unnamed.clear()
        for topic in gone:
            apply_offsets([("del_topic", topic, [])], ctx.offsets)
            await ctx.bridge.call(ctx.store.delete_topic, topic)
            ctx.locks.delete_topic(topic)
        if gone:
            await ctx.offsets.persist()

    def _pass(self) -> tuple[ApplyOutcome, int]:
        """On a worker thread: read up to _PASS_RECORDS records, apply them, save progress."""
        store = self.ctx.store
        out = ApplyOutcome()
        if store.truncations != self._truncations:
            self._truncations = store.truncations
            self._rewind(store.last_cut)
        start = self.applied_offset
        res = store.get_messages(METADATA_TOPIC, 0, start, _PASS_RECORDS)
        if res.status is GetStatus.OFFSET_TOO_SMALL:
            log.warning("metadata log: records %d..%d are gone (retention); resuming at %d",
                        self.applied_offset, res.min_offset - 1, res.min_offset)  # fmt: skip
            self.applied_offset = res.min_offset
            return out, 1
        if res.status is not GetStatus.FOUND:
            return out, 0
        self.bad_records += len(res.skipped)
        # Copies, and the views let go at once: a truncation cannot unmap a segment in use.
        records = [(bytes(v), q) for v, q in zip(res.messages, res.queue_offsets, strict=True)]
        next_begin = res.next_begin_offset
        del res
        for raw, queue_offset in records:
            self._apply_record(raw, out)
            self.applied_offset = queue_offset + 1
            self.last_physical = decode(raw).physical_offset
        before = start
        self.applied_offset = max(self.applied_offset, next_begin)
        self.bad_changes += out.bad
        # Progress made (records, or skipped ones passed over): another pass; else done.
        return out, len(records) or int(self.applied_offset > before)

    def _rewind(self, cut: int) -> None:
        """The log was cut at CommitLog offset ``cut``: go back to the first metadata record at
        or past it (what was applied from the cut tail is undone by the new master's snapshot,
        which comes after the cut)."""
        cq = self.ctx.store.queues.get(METADATA_TOPIC, 0)
        if cq is None:
            self.applied_offset = 0
            return
        lo, hi = cq.min_offset, min(self.applied_offset, cq.max_offset)
        while lo < hi:  # the first queue offset whose record starts at or past the cut
            mid = (lo + hi) // 2
            entry = cq.entry(mid)
            if entry is not None and entry[0] >= cut:
                hi = mid
            else:
                lo = mid + 1
        if lo < self.applied_offset:
            log.warning("metadata log: the log was cut at %d; applying again from record %d "
                        "(was %d)", cut, lo, self.applied_offset)  # fmt: skip
            self.applied_offset = lo

    def _verify(self) -> None:
        """At start: the record before the checkpoint must still be where it was. If the log
        was cut after the checkpoint (a slave that truncated, then crashed before its next
        pass), replay the whole metadata log: the new master's snapshot, after the cut and
        not applied yet, makes the result right."""
        if self.applied_offset == 0 or self.last_physical < 0:
            return
        cq = self.ctx.store.queues.get(METADATA_TOPIC, 0)
        last = self.applied_offset - 1
        if cq is not None and last < cq.min_offset:
            return  # retention took it: not a cut (the pass resumes at the queue's start)
        entry = cq.entry(last) if cq is not None and last < cq.max_offset else None
        # Not dispatched (yet) is not a cut: a replica applies up to the live confirm offset
        # but keeps it on disk about once a second, so after a crash it dispatches less than
        # it had applied. The record is still in the log where the checkpoint says: the tail
        # resumes after it once replication confirms it again. (Replaying from 0 here met the
        # first master's snapshot and dropped every topic created since: acknowledged
        # messages lost after a power cut of every replica.)
        undispatched = entry is None and (cq is None or last >= cq.max_offset)
        if undispatched and self._logged_at(self.last_physical, last):
            log.info("metadata log: record %d is in the log above the kept confirm offset; "
                         "applying resumes after it once it is confirmed", last)  # fmt: skip
            return
        if entry is None or entry[0] != self.last_physical:
            start = cq.min_offset if cq is not None else 0
            log.warning("metadata log: record %d is not the one applied; replaying from %d",
                        self.applied_offset - 1, start)  # fmt: skip
            self.applied_offset = start

    def _logged_at(self, physical: int, queue_offset: int) -> bool:
        """Whether the metadata record ``queue_offset`` starts at CommitLog offset ``physical``
        (dispatched or not)."""
        key = record_key(self.ctx.store.commit_log, physical)
        return key == (METADATA_TOPIC, 0, queue_offset)

    def _apply_record(self, raw: bytes, out: ApplyOutcome) -> None:
        try:
            env = decode_envelope(decode(raw).body)
        except (MetadataRecordError, ValueError) as exc:
            self.bad_records += 1
            log.warning("metadata log: record skipped: %s", exc)
            return
        if env.writer == self.broker_id and env.epoch in self.own_epochs:
            self.skipped_own += 1
            return
        try:
            apply_envelope(env, self.target, self._snap, out)
        except (OSError, ConfigError):
            raise  # a disk problem: not the record's fault; the pass is tried again
        except Exception as exc:  # a record must never stop the tail
            self.bad_records += 1
            log.exception("metadata log: record could not be applied: %s", exc)
            return
        self.applied_records += 1

    async def _after(self, out: ApplyOutcome) -> None:
        """On the loop: what the applied changes need beyond the managers, then progress."""
        ctx = self.ctx
        apply_offsets(out.offset_ops, ctx.offsets)
        self._unnamed.update(out.topics_unnamed)
        for topic in out.topics_deleted:
            self._unnamed.discard(topic)
            await ctx.bridge.call(ctx.store.delete_topic, topic)
            ctx.locks.delete_topic(topic)
        for config in out.topics_put:
            if ctx.topics.get(config.topic_name) is not None:
                ctx.apply_retention(config)
        if out.topics_put or out.topics_deleted or out.topics_unnamed:
            ctx.topics_changed()
        await ctx.offsets.persist()  # the checkpoint never passes what the file holds
        await asyncio.to_thread(self._save)

    # ------------------------------------------------------------------ checkpoint

    def _load(self, verify: bool = True) -> None:
        self._truncations = self.ctx.store.truncations
        try:
            raw = json.loads(self.path.read_text("utf-8"))
            self.applied_offset = int(raw["applied_offset"])
            self.last_physical = int(raw.get("last_physical", -1))
            self.own_epochs = [int(e) for e in raw.get("own_epochs", [])]
        except FileNotFoundError:
            return
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(f"{self.path} is damaged: {exc}") from exc
        if verify:
            self._verify()

    def _save(self) -> None:
        data = {
            "applied_offset": self.applied_offset,
            "last_physical": self.last_physical,
            "own_epochs": self.own_epochs,
        }
        write_atomically(self.path, json.dumps(data).encode())

    # ------------------------------------------------------------------ snapshot

    def snapshot_changes(self) -> list[Change]:
        """This broker's whole state as put changes (the journal frames them as a snapshot)."""
        ctx = self.ctx
        changes: list[Change] = [TopicPut(config=c) for _n, c in sorted(ctx.topics.topics.items())]
        changes += [GroupPut(config=c) for c in ctx.groups.all()]
        table = {g: ctx.offsets.offsets(g) for g in ctx.offsets.groups()}
        changes += offset_changes(table, replace=True)
        for name in sorted(REPLICATED_FILES):
            with contextlib.suppress(FileNotFoundError):
                changes.append(FilePut(name=name, data=(self.config_dir / name).read_bytes()))
        return changes

    def stats(self) -> dict[str, int]:
        return {
            "applied_offset": self.applied_offset,
            "applied_records": self.applied_records,
            "skipped_own_records": self.skipped_own,
            "bad_records": self.bad_records,
            "bad_changes": self.bad_changes,
            "logged_records": self.journal.records_logged,
        }


class _MetadataCollector(Collector):
    """``orbitmq_broker_metadata_records_total{result}`` and the applied queue offset."""

    def __init__(self, service: MetadataService) -> None:
        self.service = service

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.service.stats()
        records = CounterMetricFamily(
            "orbitmq_broker_metadata_records",
            "Metadata log records: logged (by this master), applied, skipped_own, bad; "
            "bad_changes counts changes skipped inside applied records",
            labels=["result"],
        )
        for result, key in (("logged", "logged_records"), ("applied", "applied_records"),
                            ("skipped_own", "skipped_own_records"), ("bad", "bad_records"),
                            ("bad_changes", "bad_changes")):  # fmt: skip
            records.add_metric([result], stats[key])
        yield records
        yield GaugeMetricFamily(
            "orbitmq_broker_metadata_applied_offset",
            "Next queue offset of the metadata log this replica will apply",
            value=stats["applied_offset"],
        )
