"""TransactionService: RocketMQ's transactional messages, durable (docs/transactions.md).

The send side (storing a prepared send as a half message) is
:class:`~orbitmq.broker.transaction.half.HalfMessages`; END_TRANSACTION is read by
:class:`~orbitmq.broker.transaction.processor.TransactionProcessor`; this service applies the
decisions, checks back the undecided and replays the state at restart.

A prepared send (sys_flag PREPARED, or property TRAN_MSG=true; PGROUP names the producer group)
is stored as a *half message* in the half topic, invisible to consumers, with REAL_TOPIC /
REAL_QID saying where it belongs. The producer runs its local transaction and answers with
END_TRANSACTION (COMMIT, ROLLBACK or UNKNOWN). Every decision is an op record in the op topic
(see :mod:`orbitmq.broker.transaction.records`); a half message without a decision is checked
back (CHECK_TRANSACTION_STATE, oneway, to one live connection of its producer group) every
``transaction_check_interval_ms`` once it is ``transaction_timeout_ms`` old, and discarded after
``transaction_check_max`` checks.

Exactly-once commit. The copy to the real topic and the op record are two appends to two topics,
so a commit is three appends, each awaited before the next::

    CommitBegin(half, real topic, real queue, floor = real queue's max offset)
    the copy (prepared_transaction_offset = half)
    Committed(half)

The CommitLog is one sequence and a crash keeps a prefix of it, so after a restart one of these
holds: no CommitBegin (nothing happened: the half is pending and gets checked back); CommitBegin
without Committed (the copy may be there: the broker looks for a record with that
prepared_transaction_offset in the real queue from ``floor`` on, appends the copy only if it is
not, then Committed); or Committed (done). While running, decisions for one half message are
serialized (:attr:`Half.busy`) and a decided one answers duplicates without touching the store,
so a decision sent twice, concurrently or after a restart, is applied once.

Transactional batches. A prepared send whose property TRAN_BATCH=n says its body packs n
messages of one queue (the send-body layout) is one half record: one request, one append, one
op trail. COMMIT copies all n in one append; the restart check counts the copies already in the
real queue (all, none, or a prefix when a crash cut the append) and appends only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.transaction.copies import copies_of, count_copies, tail
from orbitmq.broker.transaction.records import (
    HALF_TOPIC,
    OP_TOPIC,
    Checked,
    CommitBegin,
    Committed,
    Discarded,
    Op,
    OpRecordError,
    RolledBack,
    decode_ops,
    encode_ops,
)
from orbitmq.broker.transaction.state import Half, TxState, TxStatus, half_from_record
from orbitmq.common.errors import (
    FlushTimeoutError,
    MQError,
    TransactionNotFoundError,
    TransactionStateConflictError,
)
from orbitmq.common.files import write_atomically
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import decode
from orbitmq.common.tasks import TaskSet
from orbitmq.protocol.bodies import PERM_READ, TopicConfig
from orbitmq.protocol.requests import CheckTransactionStateRequest
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import GetStatus
from orbitmq.store.supervise import ServiceHealth

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "transaction.json"
CHECKPOINT_INTERVAL_S = 1.0
MAX_CHECKS_PER_PASS = 2048
"""Check-backs sent per pass at most (the rest wait for the next pass)."""
MAX_CHECK_BYTES_PER_PASS = 64 * 1024 * 1024
"""Bytes of half records sent per check pass at most (a check-back carries its half record, and
a half batch's can be megabytes), one record at least: the rest wait for the next pass."""
REPLAY_CHUNK = 1024
REPLAY_BYTES = 16 * 1024 * 1024


class TransactionService:
    """Decides half messages (exactly once), checks back the undecided, replays at restart."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.config = ctx.config
        self.file_written = ctx.file_written  # the checkpoint replicates (docs/ha.md)
        self.store = ctx.store
        self.bridge = ctx.bridge
        self.system_log = ctx.log
        self.topics = ctx.topics
        self.consumers = ctx.consumers
        self.clock = ctx.clock
        self.state = TxState()
        """Shared with :class:`~orbitmq.broker.transaction.half.HalfMessages`, which adds to it."""
        self.path: Path = self.config.store.store_path / "config" / CHECKPOINT_FILE
        self._op_floors: list[int] = []
        """Op-topic max offset when each op append in flight started (its record lands at or
        past it): the checkpoint must not pass them."""
        self._tasks = TaskSet("transactions", logger=log)
        self.health = ServiceHealth("transaction-check")
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._rotation = itertools.count()
        self._written: tuple[int, int] = (-1, -1)
        self._last_checkpoint = 0.0
        self.checks_sent = 0
        self.discarded = 0
        self.started = False

    async def start(self) -> None:
        """After the store is open: make the system topics, replay, start checking back."""
        for topic in (HALF_TOPIC, OP_TOPIC):
            if self.topics.get(topic) is None:
                config = TopicConfig(
                    topic_name=topic, read_queue_nums=1, write_queue_nums=1, perm=PERM_READ
                )
                await asyncio.to_thread(self.topics.upsert, config)
        await self.recover()
        self._stopping.clear()
        self._task = self._tasks.spawn(self._run(), name="tx-check")
        self.started = True

    async def stop(self) -> None:
        """Before the store closes: stop checking, write the checkpoint (if the store is up)."""
        self.started = False
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        if not self.store.is_open:
            return  # crashed (tests): the checkpoint on disk stays what it was
        try:
            self.state.prune(self.state.halves_in_flight > 0)
            await self.write_checkpoint(force=True)
        except (MQError, OSError):
            log.exception("cannot write the transaction checkpoint at stop")

    async def _wait_idle(self, half: Half) -> None:
        while half.busy is not None:
            await asyncio.shield(half.busy)

    async def commit(self, half: Half) -> None:
        """Apply COMMIT once (see the module docstring); a duplicate is a no-op."""
        await self._wait_idle(half)
        if half.status is TxStatus.COMMITTED:
            return
        check_conflict(half.status, "COMMIT", half.msg_id)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        half.busy = fut
        try:
            verify = half.status is TxStatus.COMMITTING  # begun before: the copy may exist
            if half.status is TxStatus.PENDING:
                floor = self.store.max_offset(half.topic, half.queue_id)
                await self.append_ops(
                    [CommitBegin(half.phys, half.topic, half.queue_id, floor)], [half]
                )
                half.status = TxStatus.COMMITTING
                half.commit_floor = floor
            await self._finish_commit(half, verify)
        finally:
            half.busy = None
            fut.set_result(None)

    async def _finish_commit(self, half: Half, verify: bool) -> None:
        raw = (await self.system_log.read_records([half.phys]))[0]
        copies = None if raw is None else await self.bridge.read(copies_of, raw, half)
        if copies is None:
            raise TransactionNotFoundError(
                f"half message {half.msg_id} at offset {half.phys} is gone from the store"
            )
        present = await self.bridge.read(count_copies, self.store, half) if verify else 0
        if present >= len(copies):
            log.info("transaction %s: the copy is stored already, not copied again", half.msg_id)
        else:
            if present:
                log.info("transaction %s: %d of %d copies are stored already; appending the rest",
                         half.msg_id, present, len(copies))  # fmt: skip
                copies = tail(copies, present)
            if self.topics.get(half.topic) is None:
                log.warning("transaction %s commits to %s, which no longer exists here",
                            half.msg_id, half.topic)  # fmt: skip
            try:
                await self.bridge.put(copies)
            except FlushTimeoutError as exc:
                if not isinstance(exc.result, AppendResult):
                    raise  # stored but not yet fsynced goes on: Committed comes after it
        await self.append_ops([Committed(half.phys)], [half])
        half.status = TxStatus.COMMITTED

    async def rollback(self, half: Half) -> None:
        await self._wait_idle(half)
        if half.status in (TxStatus.ROLLED_BACK, TxStatus.DISCARDED):
            return
        check_conflict(half.status, "ROLLBACK", half.msg_id)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        half.busy = fut
        try:
            await self.append_ops([RolledBack(half.phys)], [half])
            half.status = TxStatus.ROLLED_BACK
        finally:
            half.busy = None
            fut.set_result(None)

    async def append_ops(self, ops: list[Op], halves: list[Half]) -> int:
        """Append one op record (as durable as a send); returns its queue offset."""
        batch = MessageBatch(
            OP_TOPIC, 0, [encode_ops(ops)], [b""], born_timestamp_ms=self.clock.now_ms()
        )
        floor = self.system_log.max_offset(OP_TOPIC, 0)
        self._op_floors.append(floor)
        try:
            try:
                result = await self.system_log.append(batch)
            except FlushTimeoutError as exc:
                if not isinstance(exc.result, AppendResult):
                    raise
                result = exc.result
            op_q = result.first_queue_offset
            for half in halves:
                self.state.note_op(half, op_q)
            return op_q
        finally:
            self._op_floors.remove(floor)

    async def _run(self) -> None:
        interval = max(0.01, self.config.transaction_check_interval_ms / 1000)
        tick = min(interval, CHECKPOINT_INTERVAL_S)
        next_check = time.monotonic() + interval
        while not self._stopping.is_set():
            pause: float | None = None
            try:
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + interval
                    await self.check_once()
                self.state.prune(self.state.halves_in_flight > 0)
                await self.write_checkpoint()
            except Exception as exc:  # noqa: BLE001 - supervised; halves stay pending
                pause = self.health.failed(exc)  # logged once per outage, counted
            else:
                self.health.ok()
            if pause is None:
                pause = max(0.0, min(tick, next_check - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._stopping.wait()

    async def check_once(self, now: int | None = None) -> int:
        """One pass: finish commits cut short, discard halves checked ``transaction_check_max``
        times, check back the others old enough. Returns the check-backs sent."""
        now = self.clock.now_ms() if now is None else now
        cfg = self.config
        due: list[Half] = []
        discard: list[Half] = []
        stuck: list[Half] = []
        due_bytes = 0
        for half in list(self.state.by_q.values()):
            if half.busy is not None:
                continue
            if half.status is TxStatus.COMMITTING:
                stuck.append(half)
            elif half.status is TxStatus.PENDING and now - half.store_ms >= max(
                cfg.transaction_timeout_ms, half.immunity_ms
            ):
                if half.checks >= cfg.transaction_check_max:
                    discard.append(half)
                elif len(due) < MAX_CHECKS_PER_PASS and (
                    not due or due_bytes + half.size <= MAX_CHECK_BYTES_PER_PASS
                ):
                    due.append(half)
                    due_bytes += half.size
        for half in stuck:
            try:
                await self.commit(half)
            except MQError as exc:
                log.warning("transaction %s: finishing its commit failed: %s", half.msg_id, exc)
        if discard:
            await self._discard(discard)
        return await self._check_back(due)

    async def _discard(self, halves: list[Half]) -> None:
        await self.append_ops([Discarded(h.phys) for h in halves], halves)
        for half in halves:
            half.status = TxStatus.DISCARDED
            log.warning(
                "transaction %s of producer group %s (topic %s) discarded after %d check-backs "
                "without a decision",
                half.msg_id, half.group, half.topic, half.checks,
            )  # fmt: skip
        self.discarded += len(halves)

    async def _check_back(self, due: list[Half]) -> int:
        targets = []
        offline: set[str] = set()
        for half in due:
            conns = self.consumers.producer_connections(half.group)
            if not conns:
                offline.add(half.group)  # not counted: nobody was asked
                continue
            targets.append((half, conns[next(self._rotation) % len(conns)]))
        for group in sorted(offline):
            log.info("transaction check-back: no producer of group %s is online", group)
        if not targets:
            return 0
        halves = [h for h, _ in targets]
        await self.append_ops([Checked([h.phys for h in halves])], halves)
        records = await self.system_log.read_records([h.phys for h in halves])
        sent = 0
        for (half, conn), raw in zip(targets, records, strict=True):
            half.checks += 1
            if raw is None:
                log.warning("transaction %s: half message unreadable at %d", half.msg_id, half.phys)
                continue
            check = CheckTransactionStateRequest(
                producer_group=half.group,
                commit_log_offset=half.phys,
                tran_state_table_offset=half.qoffset,
                msg_id=half.msg_id,
                transaction_id=half.transaction_id,
                topic=half.topic,
                queue_id=half.queue_id,
                check_times=half.checks,
                batch_count=half.batch_size or None,
            )
            try:
                conn.send_oneway(check.frame(raw))
            except MQError as exc:
                log.info("transaction check-back to %s failed: %s", conn.peer, exc)
                continue
            sent += 1
        self.checks_sent += sent
        return sent

    def _read_checkpoint(self) -> tuple[int, int]:
        try:
            raw = json.loads(self.path.read_text("utf-8"))
            half, op = raw["half_offset"], raw["op_offset"]
            if not (isinstance(half, int) and isinstance(op, int) and half >= 0 and op >= 0):
                raise ValueError(f"offsets {half!r}, {op!r}")
            return half, op
        except FileNotFoundError:
            return 0, 0
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("%s is damaged (%s): replaying both transaction topics", self.path, exc)
            return 0, 0

    async def write_checkpoint(self, force: bool = False) -> None:
        """Where a restart starts replaying: the half window's start, and the first op record
        about a half message in it."""
        now = time.monotonic()
        if not force and now - self._last_checkpoint < CHECKPOINT_INTERVAL_S:
            return
        half_floor = self.state.floor_q
        op_floor = self.state.op_floor()
        if op_floor is None:
            op_floor = self.system_log.max_offset(OP_TOPIC, 0)
        if self._op_floors:
            op_floor = min(op_floor, *self._op_floors)
        if (half_floor, op_floor) == self._written:
            return
        self._last_checkpoint = now
        data = json.dumps(
            {"half_offset": half_floor, "op_offset": op_floor, "written_at_ms": self.clock.now_ms()}
        )
        await asyncio.to_thread(write_atomically, self.path, data.encode())
        self.file_written(CHECKPOINT_FILE, data.encode())
        self._written = (half_floor, op_floor)

    async def recover(self) -> None:
        """Rebuild the state from the half and op topics, then finish commits cut short."""
        system_log = self.system_log
        await system_log.settle()
        half_start, op_start = self._read_checkpoint()
        began = time.monotonic()
        half_start = max(half_start, system_log.min_offset(HALF_TOPIC, 0))
        state = self.state
        state.reset(half_start)
        halves = 0
        async for view in self._replay(HALF_TOPIC, half_start):
            half = half_from_record(decode(view))
            if half is not None:
                state.add(half)
                halves += 1
        ops = bad = 0
        op_start = max(op_start, system_log.min_offset(OP_TOPIC, 0))
        async for view in self._replay(OP_TOPIC, op_start):
            record = decode(view)
            try:
                entry = decode_ops(record.body)
            except OpRecordError as exc:
                bad += 1
                log.warning("transaction op record %d ignored: %s", record.queue_offset, exc)
                continue
            ops += 1
            for op in entry:
                state.apply(op, record.queue_offset)
        stuck = [h for h in state.by_q.values() if h.status is TxStatus.COMMITTING]
        for half in stuck:
            try:
                await self.commit(half)
            except MQError as exc:
                log.warning("transaction %s: finishing its commit failed: %s", half.msg_id, exc)
        state.prune(False)
        self._written = (-1, -1)
        log.info(
            "transactions: %d half messages and %d op records replayed in %.2fs (%d ignored); "
            "%d pending, %d commits finished",
            halves, ops, time.monotonic() - began, bad, state.pending(), len(stuck),
        )  # fmt: skip

    async def _replay(self, topic: str, start: int) -> AsyncIterator[memoryview]:
        offset = start
        end = self.system_log.max_offset(topic, 0)
        while offset < end:
            res = await self.system_log.read(topic, 0, offset, REPLAY_CHUNK, REPLAY_BYTES)
            if res.status is GetStatus.FOUND:
                for view in res.messages:
                    yield view
            if res.next_begin_offset <= offset:
                break
            offset = res.next_begin_offset


def check_conflict(status: TxStatus, decision: str, msg_id: str) -> None:
    agrees = {
        "COMMIT": (TxStatus.PENDING, TxStatus.COMMITTING, TxStatus.COMMITTED),
        "ROLLBACK": (TxStatus.PENDING, TxStatus.ROLLED_BACK, TxStatus.DISCARDED),
    }[decision]
    if status not in agrees:
        raise TransactionStateConflictError(
            f"transaction {msg_id} is {status.value.lower().replace('_', ' ')}: {decision} refused"
        )
