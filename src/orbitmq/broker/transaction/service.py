"""TransactionService: RocketMQ's transactional messages, durable (docs/transactions.md).

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
import dataclasses
import itertools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.broker.transaction.records import (
    HALF_TOPIC,
    OP_TOPIC,
    PROPERTY_CHECK_IMMUNITY_S,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    Checked,
    CommitBegin,
    Committed,
    Discarded,
    Op,
    RecordCodecError,
    RolledBack,
    decode_ops,
    encode_ops,
)
from orbitmq.broker.transaction.state import Half, TxState, TxStatus
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    EmptyBodyError,
    FlushTimeoutError,
    MessageIllegalError,
    MQError,
    PropertiesTooLargeError,
    ProtocolError,
    TransactionNotFoundError,
    TransactionStateConflictError,
    TransactionTypeMismatchError,
)
from orbitmq.common.files import write_atomically
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    MessageBatch,
    decode_properties,
    encode_properties,
    property_value,
)
from orbitmq.common.record import StoredMessage, decode
from orbitmq.common.validation import validate_group
from orbitmq.protocol.bodies import PERM_READ, TopicConfig
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError, get_int, get_str
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import SendBody, decode_send_body
from orbitmq.store.commit_log import AppendResult
from orbitmq.store.message_store import GetStatus, MessageStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from orbitmq.broker.controller import BrokerController
    from orbitmq.net.connection import Reply

log = logging.getLogger(__name__)

TX_TYPE_MASK = 0xC
"""The transaction-type bits of sys_flag (RocketMQ's MessageSysFlag)."""
DECISIONS = ("COMMIT", "ROLLBACK", "UNKNOWN")
MESSAGE_TYPE_TRANSACTION = "TRANSACTION"
CHECKPOINT_FILE = "transaction.json"
CHECKPOINT_INTERVAL_S = 1.0
MAX_CHECKS_PER_PASS = 2048
"""Check-backs sent per pass at most (the rest wait for the next pass)."""
MAX_CHECK_BYTES_PER_PASS = 64 * 1024 * 1024
"""Bytes of half records sent per check pass at most (a check-back carries its half record, and
a half batch's can be megabytes), one record at least: the rest wait for the next pass."""
REPLAY_CHUNK = 1024
SCAN_CHUNK = 1024
_TRAN_TRUE = PROPERTY_TRANSACTION_PREPARED.encode() + b"\x01true"
_TRAN_NEEDLE = PROPERTY_TRANSACTION_PREPARED.encode() + b"\x01"
_STRIPPED_ON_COMMIT = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_CHECK_IMMUNITY_S,
)
_RESERVED_IN_BATCH = tuple(
    name.encode() + b"\x01"
    for name in (*_STRIPPED_ON_COMMIT, PROPERTY_TRANSACTION_BATCH, PROPERTY_TRANSACTION_ID)
)
"""Properties a message packed in a half batch may not carry: its commit copy keeps its
properties byte for byte (no per-message re-encoding), so they are refused at send instead."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class HalfRequest:
    """A prepared send rewritten for the half topic (see :meth:`TransactionService.half_of`)."""

    batch: MessageBatch
    group: str
    msg_id: str
    transaction_id: str
    topic: str
    queue_id: int
    immunity_ms: int
    batch_size: int = 0
    """Messages packed in a half batch (0: a single half message)."""


def _bool_field(frame: Frame, name: str) -> bool:
    value = frame.fields.get(name, False)
    if not isinstance(value, bool):
        raise FieldError(f"field {name!r} must be a boolean")
    return value


class TransactionService:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.bridge = broker.bridge
        self.topics = broker.topics
        self.state = TxState()
        self.path: Path = self.config.store.store_path / "config" / CHECKPOINT_FILE
        self._halves_in_flight = 0
        self._sending: dict[tuple[str, str], asyncio.Event] = {}
        """Half appends under way by (group, transaction id), for a retry that overtakes one."""
        self._op_floors: list[int] = []
        """Op-topic max offset when each op append in flight started (its record lands at or
        past it): the checkpoint must not pass them."""
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._rotation = itertools.count()
        self._written: tuple[int, int] = (-1, -1)
        self._last_checkpoint = 0.0
        self.checks_sent = 0
        self.discarded = 0
        self.started = False

    def handlers(self) -> dict[int, Callable[[Frame], Awaitable[Reply]]]:
        return {RequestCode.END_TRANSACTION: self.end_transaction}

    # ------------------------------------------------------------------ lifecycle

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
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tx-check")
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
            self.state.prune(self._halves_in_flight > 0)
            await self.write_checkpoint(force=True)
        except (MQError, OSError):
            log.exception("cannot write the transaction checkpoint at stop")

    # ------------------------------------------------------------------ the send path

    def half_of(
        self, batch: MessageBatch, send: SendBody, topic: TopicConfig
    ) -> HalfRequest | None:
        """The half-topic request for a prepared send, None for any other send. Checked on
        every send: one bit test, and a substring search over the properties block."""
        if batch.sys_flag & TX_TYPE_MASK != SYSFLAG_TRANSACTION_PREPARED:
            if _TRAN_TRUE not in send.properties_block:
                return None
            if not any(property_value(p, _TRAN_NEEDLE) == b"true" for p in batch.properties):
                return None
        if len(batch.bodies) != 1:
            raise MessageIllegalError(
                "a transactional message cannot be sent in a batch: send a transactional batch "
                f"as one prepared message with {PROPERTY_TRANSACTION_BATCH}=<count> whose body "
                "packs the messages (docs/transactions.md)"
            )
        if self.config.enforce_topic_message_type and topic.message_type != (
            MESSAGE_TYPE_TRANSACTION
        ):
            raise TransactionTypeMismatchError(
                f"topic {batch.topic} has message type {topic.message_type}, "
                f"not {MESSAGE_TYPE_TRANSACTION}: transactional sends are refused"
            )
        props = decode_properties(batch.properties[0])
        group = props.get(PROPERTY_PRODUCER_GROUP, "")
        if not group:
            raise MessageIllegalError(
                f"a transactional message needs a {PROPERTY_PRODUCER_GROUP} property "
                "(its producer group, which answers check-backs)"
            )
        validate_group(group)
        msg_id = props.get(PROPERTY_UNIQ_KEY, "")
        immunity_ms = 0
        with contextlib.suppress(ValueError):
            immunity_ms = max(0, int(props.get(PROPERTY_CHECK_IMMUNITY_S, "0")) * 1000)
        body = bytes(batch.bodies[0])
        count = 0
        if PROPERTY_TRANSACTION_BATCH in props:
            count = self._check_packed(body, props[PROPERTY_TRANSACTION_BATCH], batch.sys_flag)
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_REAL_TOPIC] = batch.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(batch.queue_id)
        half = MessageBatch(
            HALF_TOPIC,
            0,
            [body],
            [encode_properties(props)],
            flag=batch.flag,
            sys_flag=(batch.sys_flag & ~TX_TYPE_MASK) | SYSFLAG_TRANSACTION_PREPARED,
            born_timestamp_ms=batch.born_timestamp_ms,
            born_host=batch.born_host,
            reconsume_times=batch.reconsume_times,
        )
        return HalfRequest(
            half,
            group,
            msg_id,
            props.get(PROPERTY_TRANSACTION_ID) or msg_id,
            batch.topic,
            batch.queue_id,
            immunity_ms,
            count,
        )

    def _check_packed(self, body: bytes, count_text: str, sys_flag: int) -> int:
        """Validate a half batch's packed body now, so that its commit cannot fail on it later;
        returns the message count. Vectorized over the batch: a few array operations and one
        substring search per reserved name, whatever the count."""
        try:
            count = int(count_text)
        except ValueError:
            count = -1
        if count < 1:
            raise MessageIllegalError(
                f"{PROPERTY_TRANSACTION_BATCH} must be a message count >= 1, not {count_text[:20]!r}"
            )
        if sys_flag & SYSFLAG_COMPRESSED:
            raise MessageIllegalError(
                "a transactional batch is sent uncompressed (its body is the packed messages)"
            )
        try:
            send = decode_send_body(body)
        except ProtocolError as exc:
            raise MessageIllegalError(f"transactional batch body: {exc}") from None
        if len(send.bodies) != count:
            raise MessageIllegalError(
                f"transactional batch body packs {len(send.bodies)} messages, "
                f"{PROPERTY_TRANSACTION_BATCH} says {count}"
            )
        if int(send.body_lengths.min()) == 0:
            raise EmptyBodyError(
                f"message {int(send.body_lengths.argmin())} of the transactional batch is empty"
            )
        limit = self.config.store.max_properties_size
        if int(send.properties_lengths.max()) > limit:
            raise PropertiesTooLargeError(
                f"message {int(send.properties_lengths.argmax())} of the transactional batch has "
                f"{int(send.properties_lengths.max())} bytes of properties, limit {limit}"
            )
        block = send.properties_block
        for needle in _RESERVED_IN_BATCH:
            if needle in block and _names_property(block, send.properties_starts.tolist(), needle):
                raise MessageIllegalError(
                    f"a message in a transactional batch may not carry {needle[:-1].decode()} "
                    "(the batch's own properties carry the transaction)"
                )
        return count

    async def put_half(self, req: HalfRequest) -> AppendResult:
        """Store a half message (durable as any send) and track it.

        A half batch repeating one still in the window (same group and transaction id, same
        real queue: a producer's retry after a lost answer) is answered with the first half
        instead of storing a second, which a check-back could commit too (a duplicate). Only
        batches: their transaction id is made per call, while a single half message's is its
        message id, which a caller reusing a Message object repeats for new content."""
        key = (req.group, req.msg_id)
        dedup = bool(req.msg_id) and req.batch_size > 0
        if dedup:
            first = await self._same_half(key, req)
            if first is not None:
                return first
        done: asyncio.Event | None = None
        if dedup:
            done = self._sending[key] = asyncio.Event()
        self._halves_in_flight += 1
        try:
            try:
                result = await self.bridge.put(req.batch)
            except FlushTimeoutError as exc:
                if isinstance(exc.result, AppendResult):
                    self._track(req, exc.result)  # stored, only not fsynced yet
                raise
            self._track(req, result)
            return result
        finally:
            self._halves_in_flight -= 1
            if done is not None:
                if self._sending.get(key) is done:
                    del self._sending[key]
                done.set()  # a waiting repeat looks again: at the tracked half, or appends

    async def _same_half(self, key: tuple[str, str], req: HalfRequest) -> AppendResult | None:
        while (under_way := self._sending.get(key)) is not None:
            await under_way.wait()
        half = self.state.by_id.get(key)
        if half is None or (half.topic, half.queue_id, half.batch_size) != (
            req.topic,
            req.queue_id,
            req.batch_size,
        ):
            return None
        log.info(
            "prepared send of %s repeated: answered with its half at %d", req.msg_id, half.phys
        )
        return AppendResult(HALF_TOPIC, 0, half.qoffset, [half.phys], [0], 0, half.store_ms)

    def _track(self, req: HalfRequest, result: AppendResult) -> None:
        self.state.add(
            Half(
                phys=result.physical_offsets[0],
                qoffset=result.first_queue_offset,
                store_ms=now_ms(),
                group=req.group,
                msg_id=req.msg_id,
                transaction_id=req.transaction_id,
                topic=req.topic,
                queue_id=req.queue_id,
                immunity_ms=req.immunity_ms,
                batch_size=req.batch_size,
                size=result.sizes[0],
            )
        )

    # ------------------------------------------------------------------ END_TRANSACTION

    async def end_transaction(self, frame: Frame) -> Reply:
        group = get_str(frame, "producer_group")
        validate_group(group)
        decision = get_str(frame, "tran_state")
        if decision not in DECISIONS:
            raise MessageIllegalError(
                f"tran_state {decision[:40]!r} is not one of {', '.join(DECISIONS)}"
            )
        offset = get_int(frame, "commit_log_offset", lo=0)
        msg_id = get_str(frame, "msg_id")
        from_check = _bool_field(frame, "from_check")
        half = self.state.by_phys.get(offset)
        if half is None:
            return await self._end_outside_window(frame, offset, msg_id, group, decision)
        if half.msg_id != msg_id or half.group != group:
            raise TransactionNotFoundError(
                f"the half message at offset {offset} is not message {msg_id[:64]} "
                f"of producer group {group}"
            )
        if decision == "UNKNOWN":
            log.debug(
                "transaction %s of %s: state unknown (from_check=%s)", msg_id, group, from_check
            )
            return frame.reply(ResponseCode.SUCCESS, fields={"state": half.status.value})
        if decision == "COMMIT":
            await self.commit(half)
        else:
            await self.rollback(half)
        return frame.reply(ResponseCode.SUCCESS, fields={"state": half.status.value})

    async def _end_outside_window(
        self, frame: Frame, offset: int, msg_id: str, group: str, decision: str
    ) -> Reply:
        """A decision for a half message the window no longer (or never) held: one decided and
        pruned answers as decided; anything else is TRANSACTION_NOT_FOUND."""
        msg = await self.bridge.read(self.store.get_message, offset)
        if (
            msg is None
            or msg.topic != HALF_TOPIC
            or msg.msg_id != msg_id
            or msg.properties.get(PROPERTY_PRODUCER_GROUP) != group
        ):
            raise TransactionNotFoundError(
                f"no half message {msg_id[:64]} of producer group {group} at offset {offset}"
            )
        if msg.queue_offset >= self.state.floor_q:
            raise TransactionNotFoundError(f"half message {msg_id[:64]} is not tracked")
        status = self.state.recent.get(offset)
        if status is not None and decision != "UNKNOWN":
            _check_conflict(status, decision, msg_id)
        remark = f"transaction {msg_id} was resolved earlier"
        fields = {"state": status.value if status is not None else "RESOLVED"}
        return frame.reply(ResponseCode.SUCCESS, remark, fields=fields)

    async def _wait_idle(self, half: Half) -> None:
        while half.busy is not None:
            await asyncio.shield(half.busy)

    async def commit(self, half: Half) -> None:
        """Apply COMMIT once (see the module docstring); a duplicate is a no-op."""
        await self._wait_idle(half)
        if half.status is TxStatus.COMMITTED:
            return
        _check_conflict(half.status, "COMMIT", half.msg_id)
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
        copies = await self.bridge.read(_read_copies, self.store, half)  # unpacked off the loop
        if copies is None:
            raise TransactionNotFoundError(
                f"half message {half.msg_id} at offset {half.phys} is gone from the store"
            )
        present = await self.bridge.read(_count_copies, self.store, half) if verify else 0
        if present >= len(copies):
            log.info("transaction %s: the copy is stored already, not copied again", half.msg_id)
        else:
            if present:
                log.info("transaction %s: %d of %d copies are stored already; appending the rest",
                         half.msg_id, present, len(copies))  # fmt: skip
                copies = _tail(copies, present)
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
        _check_conflict(half.status, "ROLLBACK", half.msg_id)
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
        batch = MessageBatch(OP_TOPIC, 0, [encode_ops(ops)], [b""], born_timestamp_ms=now_ms())
        floor = self.store.max_offset(OP_TOPIC, 0)
        self._op_floors.append(floor)
        try:
            try:
                result = await self.bridge.put(batch)
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

    # ------------------------------------------------------------------ check-back

    async def _run(self) -> None:
        interval = max(0.01, self.config.transaction_check_interval_ms / 1000)
        tick = min(interval, CHECKPOINT_INTERVAL_S)
        next_check = time.monotonic() + interval
        while not self._stopping.is_set():
            try:
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + interval
                    await self.check_once()
                self.state.prune(self._halves_in_flight > 0)
                await self.write_checkpoint()
            except Exception:  # checking must go on; the halves stay pending
                log.exception("transaction check pass failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(tick, next_check - time.monotonic()))):
                    await self._stopping.wait()

    async def check_once(self, now: int | None = None) -> int:
        """One pass: finish commits cut short, discard halves checked ``transaction_check_max``
        times, check back the others old enough. Returns the check-backs sent."""
        now = now_ms() if now is None else now
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
            conns = self.broker.consumers.producer_connections(half.group)
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
        records = await self.bridge.read(_read_records, self.store, [h.phys for h in halves])
        sent = 0
        for (half, conn), raw in zip(targets, records, strict=True):
            half.checks += 1
            if raw is None:
                log.warning("transaction %s: half message unreadable at %d", half.msg_id, half.phys)
                continue
            fields = {
                "producer_group": half.group,
                "commit_log_offset": half.phys,
                "tran_state_table_offset": half.qoffset,
                "msg_id": half.msg_id,
                "transaction_id": half.transaction_id,
                "topic": half.topic,
                "queue_id": half.queue_id,
                "check_times": half.checks,
            }
            if half.batch_size:
                fields["batch_count"] = half.batch_size
            try:
                conn.send_oneway(
                    Frame(RequestCode.CHECK_TRANSACTION_STATE, fields=fields, body=raw)
                )
            except MQError as exc:
                log.info("transaction check-back to %s failed: %s", conn.peer, exc)
                continue
            sent += 1
        self.checks_sent += sent
        return sent

    # ------------------------------------------------------------------ restart

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
            op_floor = self.store.max_offset(OP_TOPIC, 0)
        if self._op_floors:
            op_floor = min(op_floor, *self._op_floors)
        if (half_floor, op_floor) == self._written:
            return
        self._last_checkpoint = now
        data = json.dumps(
            {"half_offset": half_floor, "op_offset": op_floor, "written_at_ms": now_ms()}
        )
        await asyncio.to_thread(write_atomically, self.path, data.encode())
        self._written = (half_floor, op_floor)

    async def recover(self) -> None:
        """Rebuild the state from the half and op topics, then finish commits cut short."""
        store, bridge = self.store, self.bridge
        await bridge.call(store.wait_for_dispatch)
        half_start, op_start = self._read_checkpoint()
        began = time.monotonic()
        half_start = max(half_start, store.min_offset(HALF_TOPIC, 0))
        state = self.state = TxState(half_start)
        halves = 0
        async for view in self._replay(HALF_TOPIC, half_start):
            half = _half_of_record(decode(view))
            if half is not None:
                state.add(half)
                halves += 1
        ops = bad = 0
        op_start = max(op_start, store.min_offset(OP_TOPIC, 0))
        async for view in self._replay(OP_TOPIC, op_start):
            record = decode(view)
            try:
                entry = decode_ops(record.body)
            except RecordCodecError as exc:
                bad += 1
                log.warning("transaction op record %d ignored: %s", record.queue_offset, exc)
                continue
            ops += 1
            for op in entry:
                _apply(state, op, record.queue_offset)
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
        end = self.store.max_offset(topic, 0)
        while offset < end:
            res = await self.bridge.read(
                self.store.get_messages, topic, 0, offset, REPLAY_CHUNK, 16 * 1024 * 1024, None
            )
            if res.status is GetStatus.FOUND:
                for view in res.messages:
                    yield view
            if res.next_begin_offset <= offset:
                break
            offset = res.next_begin_offset


def _check_conflict(status: TxStatus, decision: str, msg_id: str) -> None:
    agrees = {
        "COMMIT": (TxStatus.PENDING, TxStatus.COMMITTING, TxStatus.COMMITTED),
        "ROLLBACK": (TxStatus.PENDING, TxStatus.ROLLED_BACK, TxStatus.DISCARDED),
    }[decision]
    if status not in agrees:
        raise TransactionStateConflictError(
            f"transaction {msg_id} is {status.value.lower().replace('_', ' ')}: {decision} refused"
        )


def _apply(state: TxState, op: Op, op_q: int) -> None:
    if isinstance(op, Checked):
        for phys in op.halves:
            half = state.by_phys.get(phys)
            if half is not None:
                half.checks += 1
                state.note_op(half, op_q)
        return
    half = state.by_phys.get(op.half)
    if half is None:
        return  # about a half message before the window: decided long ago
    state.note_op(half, op_q)
    if isinstance(op, CommitBegin):
        if half.status is TxStatus.PENDING:
            half.status = TxStatus.COMMITTING
            half.commit_floor = op.floor
    elif isinstance(op, Committed):
        half.status = TxStatus.COMMITTED
    elif isinstance(op, RolledBack):
        half.status = TxStatus.ROLLED_BACK
    elif isinstance(op, Discarded):
        half.status = TxStatus.DISCARDED


def _half_of_record(msg: StoredMessage) -> Half | None:
    props = msg.properties
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, ""))
    except ValueError:
        queue_id = -1
    topic = props.get(PROPERTY_REAL_TOPIC, "")
    if not topic or queue_id < 0:
        log.warning("half message at %d has no real topic/queue; ignored", msg.physical_offset)
        return None
    immunity_ms = 0
    with contextlib.suppress(ValueError):
        immunity_ms = max(0, int(props.get(PROPERTY_CHECK_IMMUNITY_S, "0")) * 1000)
    msg_id = msg.msg_id or ""
    batch_size = 0
    with contextlib.suppress(ValueError):
        batch_size = max(0, int(props.get(PROPERTY_TRANSACTION_BATCH, "0")))
    return Half(
        phys=msg.physical_offset,
        qoffset=msg.queue_offset,
        size=msg.total_size,
        store_ms=msg.store_timestamp_ms,
        group=props.get(PROPERTY_PRODUCER_GROUP, ""),
        msg_id=msg_id,
        transaction_id=props.get(PROPERTY_TRANSACTION_ID) or msg_id,
        topic=topic,
        queue_id=queue_id,
        immunity_ms=immunity_ms,
        batch_size=batch_size,
    )


def _names_property(block: bytes, starts: list[int], needle: bytes) -> bool:
    """Does ``needle`` (``name\x01``) start a property somewhere in ``block``, not merely occur
    inside another name? (A value cannot hold \x01, so only names can end with it.)"""
    heads = set(starts)
    at = block.find(needle)
    while at >= 0:
        if at in heads or block[at - 1] == 2:
            return True
        at = block.find(needle, at + 1)
    return False


def _copy_of(msg: StoredMessage, half: Half) -> MessageBatch:
    """The committed message(s): the half's body and properties, in its real topic and queue,
    normal messages (transaction type COMMIT, no TRAN_MSG), pointing back at the half. A half
    batch gives all its packed messages, each with its own properties as sent (validated at
    send, so no per-message work here)."""
    if half.batch_size:
        try:
            send = decode_send_body(msg.body)
        except ProtocolError as exc:  # validated at send: only a damaged record gets here
            raise MessageIllegalError(
                f"half batch {half.msg_id} at {half.phys} does not unpack: {exc}"
            ) from None
        bodies: list[bytes] = send.bodies  # type: ignore[assignment]  # views, appended as is
        properties = send.properties
    else:
        props = {k: v for k, v in msg.properties.items() if k not in _STRIPPED_ON_COMMIT}
        bodies, properties = [msg.body], [encode_properties(props)]
    return MessageBatch(
        half.topic,
        half.queue_id,
        bodies,
        properties,
        flag=msg.flag,
        sys_flag=(msg.sys_flag & ~TX_TYPE_MASK) | SYSFLAG_TRANSACTION_COMMIT,
        born_timestamp_ms=msg.born_timestamp_ms,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=half.phys,
    )


def _read_copies(store: MessageStore, half: Half) -> MessageBatch | None:
    """On a reader thread: the commit's copies of the half at ``half.phys`` (None: gone)."""
    msg = store.get_message(half.phys)
    return None if msg is None else _copy_of(msg, half)


def _tail(batch: MessageBatch, start: int) -> MessageBatch:
    return dataclasses.replace(
        batch, bodies=batch.bodies[start:], properties=batch.properties[start:]
    )


def _count_copies(store: MessageStore, half: Half) -> int:
    """On a reader thread: how many of the commit's copies are in the real queue (from its
    floor on)? They were one append, so they are consecutive there, and a crash keeps a prefix
    of them: counting is enough to know which are missing."""
    store.wait_for_dispatch()
    want = max(1, half.batch_size)
    found = 0
    offset = half.commit_floor
    while offset < store.max_offset(half.topic, half.queue_id):
        res = store.get_messages(half.topic, half.queue_id, offset, SCAN_CHUNK, 16 * 1024 * 1024)
        if res.status is GetStatus.FOUND:
            for view in res.messages:
                if decode(view).prepared_transaction_offset == half.phys:
                    found += 1
                    if found == want:
                        return found
                elif found:
                    return found  # the run of copies ended
        if res.next_begin_offset <= offset:
            break
        offset = res.next_begin_offset
    return found


def _read_records(store: MessageStore, phys: list[int]) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in phys:
        view = store.read_record(p)
        out.append(bytes(view) if view is not None else None)
    return out
