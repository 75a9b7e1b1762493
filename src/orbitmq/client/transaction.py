"""Transactional producer: a half message, the local transaction, then COMMIT or ROLLBACK.

``send_in_transaction(msg, local_tx, arg)``:

1. sends ``msg`` prepared (properties TRAN_MSG=true, PGROUP=group): the broker stores it as a
   half message, invisible to consumers;
2. runs the local transaction, ``local_tx(msg, arg)`` (or the listener's
   ``execute_local_transaction``), which returns a :class:`LocalTransactionState`; an exception
   counts as UNKNOWN;
3. tells the broker the outcome (END_TRANSACTION with COMMIT, ROLLBACK or UNKNOWN). COMMIT makes
   the message visible exactly once, ROLLBACK drops it.

When the outcome is UNKNOWN, or the END_TRANSACTION never arrives (the producer crashed, the
connection dropped), the broker asks later: it sends CHECK_TRANSACTION_STATE to one live
producer of the group, whose listener's ``check_local_transaction(msg)`` answers. Any producer
of the group may be asked, including a new process started after a crash, which is why the
listener must find the outcome from durable state (the transaction id is ``msg.msg_id``). To be
asked, a producer must be known to the broker: it heartbeats its group (HEART_BEAT with
``producer_groups``) to every broker of the topics given as ``topics=`` and of every topic it
has sent to.

**Transactional batches** (``send_half_batch`` / ``end_many``): n messages of one queue sent as
ONE prepared message whose body packs them (the send-body layout) and whose property TRAN_BATCH
is n. The broker stores one half record; one COMMIT appends all n to the queue, in order,
exactly once; ROLLBACK drops all. This is what an exactly-once sink needs at scale: per batch,
one request to send, one to decide, instead of per message. The halves of many batches are then
decided together with ``end_many`` (concurrent END_TRANSACTIONs), from any producer of the group.

The producer is composed of an :class:`~orbitmq.client.producer.producer.AsyncProducer` (its routing,
retries and options); check-backs arrive on that producer's connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client._settings import setting
from orbitmq.client.consumer_types import new_client_id
from orbitmq.client.fifo import check_batch_groups
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    MessageIllegalError,
    MQError,
    PropertiesTooLargeError,
    RemoteError,
)
from orbitmq.common.ids import default_generator
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_PREPARED,
    Message,
    decode_properties,
    encode_properties,
)
from orbitmq.common.record import StoredMessage
from orbitmq.common.tasks import TaskSet
from orbitmq.common.validation import DEFAULT_MAX_PROPERTIES_SIZE, validate_group
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records, decode_send_body, encode_send_body

log = logging.getLogger(__name__)

__all__ = [
    "PROPERTY_TRANSACTION_BATCH",
    "AsyncTransactionProducer",
    "EndResult",
    "HalfBatchResult",
    "LocalTransactionState",
    "TransactionConfig",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "half_batch_count",
    "unpack_half_batch",
]

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_BATCH = "TRAN_BATCH"
"""On a half batch: how many messages it packs (what a check-back's listener reads)."""
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID = "__transactionId__"
_HALF_ONLY = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)
_RESERVED_IN_BATCH = frozenset(
    {
        *_HALF_ONLY,
        PROPERTY_TRANSACTION_BATCH,
        PROPERTY_CHECK_IMMUNITY_S,
        PROPERTY_TRANSACTION_ID,
    }
)
"""Names a message inside a half batch may not carry (the broker refuses them too)."""
_RESERVED_BATCH_LEVEL = frozenset(
    {*_HALF_ONLY, PROPERTY_TRANSACTION_BATCH, PROPERTY_PRODUCER_GROUP, PROPERTY_UNIQ_KEY}
)
"""Names the producer sets on a half batch itself (the transaction id: ``transaction_id=``)."""


class LocalTransactionState(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"
    """Not decided yet: the broker checks back later."""


class TransactionListener(Protocol):
    """What a transactional producer calls. Either method may be ``async def`` (it then runs
    on the producer's event loop); a plain one runs in a worker thread (for the async producer
    and check-backs) or in the caller's thread (the blocking producer's send_in_transaction)."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
        """Run the local transaction for the half message ``msg``; return a
        LocalTransactionState (or an awaitable of one)."""

    def check_local_transaction(self, msg: StoredMessage) -> Any:
        """The broker asks for the outcome of an undecided transaction. ``msg`` is the half
        message as stored (topic and queue id are the real ones; ``msg.msg_id`` is the
        transaction id). Return a LocalTransactionState (or an awaitable of one)."""


LocalTransaction = Callable[[Message, Any], Any]
"""``local_tx(msg, arg) -> LocalTransactionState`` (or an awaitable of one)."""


@dataclass(slots=True)
class TransactionSendResult:
    send_result: SendResult
    """Where the half message went (queue_offset and offset are the half message's)."""
    local_transaction_state: LocalTransactionState
    transaction_id: str
    end_error: MQError | None = None
    """Why the decision may not have reached the broker (None: it did). The broker checks
    back then, so the outcome still holds."""

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


@dataclass(frozen=True, slots=True)
class HalfBatchResult:
    """A stored half batch: everything END_TRANSACTION needs, as plain fields, so that it can
    be pickled to another process of the producer group (a Spark driver deciding what its
    executors sent) and decided there."""

    topic: str
    queue_id: int
    """The real queue: all ``count`` messages go there on COMMIT."""
    broker_name: str
    broker_addr: str
    """The broker's address when the half was sent ("" if unknown); ``end_many`` prefers the
    current route's address for ``broker_name``."""
    offset: int
    """CommitLog offset of the half record: the handle END_TRANSACTION names."""
    queue_offset: int
    """The half record's offset in the half topic."""
    transaction_id: str
    """The half record's unique id; ``msg.msg_id`` in a check-back."""
    count: int
    msg_ids: tuple[str, ...]
    """Each message's own unique id, in order: the committed copies carry them."""
    status: SendStatus = SendStatus.SEND_OK
    """Not SEND_OK: stored, but not as safely as asked. Roll it back (RocketMQ does)."""

    @property
    def msg_id(self) -> str:
        return self.transaction_id


@dataclass(frozen=True, slots=True)
class EndResult:
    """The outcome of one END_TRANSACTION sent by ``end_many``."""

    transaction_id: str
    state: LocalTransactionState
    """The decision sent."""
    broker_state: str = ""
    """The broker's answer: COMMITTED, ROLLED_BACK, DISCARDED, PENDING (for UNKNOWN), RESOLVED
    (decided long ago, the exact outcome forgotten); "" when ``error`` is set."""
    error: MQError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def half_batch_count(msg: StoredMessage) -> int:
    """How many messages a half record (as a check-back's listener gets it) packs; 0 for a
    single half message."""
    try:
        return max(0, int(msg.properties.get(PROPERTY_TRANSACTION_BATCH, "0")))
    except ValueError:
        return 0


def unpack_half_batch(msg: StoredMessage) -> list[tuple[bytes, dict[str, str]]]:
    """The (body, properties) of each message packed in a half batch, in order. Rarely
    needed: a listener normally decides from the batch's own properties."""
    if not half_batch_count(msg):
        raise ClientError(f"message {msg.msg_id} is not a half batch")
    send = decode_send_body(msg.body)
    return [
        (bytes(body), decode_properties(props))
        for body, props in zip(send.bodies, send.properties, strict=True)
    ]


def _as_state(value: object, what: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    log.warning("%s returned %r, not a LocalTransactionState: taken as UNKNOWN", what, value)
    return LocalTransactionState.UNKNOWN


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionConfig(ProducerConfig):
    """A transactional producer's settings: the producer's (its ``group`` is replaced by the
    group the transactional producer is made for), and how check-backs are served."""

    heartbeat_interval_s: float = setting(10.0, lambda v: v > 0)
    check_concurrency: int = setting(16, lambda v: v >= 1)
    """Check-backs answered at once."""
    end_timeout_s: float = setting(3.0, lambda v: v > 0)
    client_id: str | None = None


class AsyncTransactionProducer:
    """The asyncio transactional producer. ``listener`` answers check-backs (and runs local
    transactions when send_in_transaction gets no ``local_tx``). ``topics``: topics whose
    brokers learn of this producer from the start (a restarted producer must be reachable for
    check-backs before it sends anything)."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        listener: TransactionListener,
        config: TransactionConfig | None = None,
        *,
        topics: Sequence[str] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        validate_group(group)
        cfg = TransactionConfig(group=group) if config is None else config
        if not isinstance(cfg, TransactionConfig):
            raise ClientError(f"config must be a TransactionConfig, not {type(cfg).__name__}")
        if cfg.group != group:
            cfg = dataclasses.replace(cfg, group=group)
        self.config = cfg
        self.group = group
        self.listener = listener
        self.client_id = cfg.client_id or new_client_id()
        self.heartbeat_interval_s = cfg.heartbeat_interval_s
        self.end_timeout_s = cfg.end_timeout_s
        self.producer = AsyncProducer(namesrv_addrs, cfg, ssl_context=ssl_context)
        self.producer.remoting.handler = self._on_request  # check-backs come on its connections
        self._topics: list[str] = list(dict.fromkeys(topics))
        self._beaten: set[str] = set()
        self._check_slots = asyncio.Semaphore(cfg.check_concurrency)
        self._tasks = TaskSet("transaction producer", logger=log)
        self._heartbeat: asyncio.Task[None] | None = None
        self.checks_answered = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncTransactionProducer:
        await self.producer.start()
        await self.beat_now()
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._beat_loop(), name=f"orbitmq-tx-heartbeat-{self.client_id}"
        )
        return self

    async def close(self) -> None:
        """Stop heartbeating, unregister from the brokers, wait for check answers under way,
        close the producer. Idempotent."""
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._tasks.wait()
        await self._unregister()
        await self.producer.close()

    async def __aenter__(self) -> AsyncTransactionProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ heartbeat

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                await self.beat_now()
            except Exception:  # the heartbeat must go on
                log.exception("transaction producer heartbeat failed")

    async def _broker_addrs(self) -> set[str]:
        addrs: set[str] = set()
        for topic in list(self._topics):
            try:
                info = await self.producer.routes.get(topic)
            except MQError as exc:
                log.info("transaction producer: no route for %r yet: %s", topic, exc)
                continue
            addrs.update(a for a in info.broker_addrs.values() if a)
        return addrs

    async def beat_now(self) -> None:
        """HEART_BEAT with this producer group to every broker of the known topics."""
        addrs = await self._broker_addrs()
        if addrs:
            await asyncio.gather(*(self._beat(a) for a in sorted(addrs)))

    async def _beat(self, addr: str) -> None:
        body = encode_body(HeartbeatData(client_id=self.client_id, producer_groups=[self.group]))
        try:
            resp = await self.producer.remoting.invoke(
                addr, Frame(RequestCode.HEART_BEAT, body=body), self.end_timeout_s
            )
        except MQError as exc:
            log.info("transaction producer heartbeat to %s failed: %s", addr, exc)
            return
        if resp.code == ResponseCode.SUCCESS:
            self._beaten.add(addr)
        else:
            log.warning("broker %s refused the heartbeat: %s", addr, resp.remark)

    async def _unregister(self) -> None:
        fields = {"client_id": self.client_id, "group": self.group}

        async def one(addr: str) -> None:
            frame = Frame(RequestCode.UNREGISTER_CLIENT, fields=fields)
            try:
                await self.producer.remoting.invoke(addr, frame, self.end_timeout_s)
            except MQError as exc:
                log.info("unregistering from %s failed: %s", addr, exc)

        try:
            async with asyncio.timeout(self.end_timeout_s):
                await asyncio.gather(*(one(a) for a in sorted(self._beaten)))
        except TimeoutError:
            log.info("unregistering the transaction producer timed out")

    # ------------------------------------------------------------------ sending

    async def send_in_transaction(
        self, msg: Message, local_tx: LocalTransaction | None = None, arg: Any = None
    ) -> TransactionSendResult:
        """Half message, local transaction (on the loop if ``async def``, else in a worker
        thread), decision. Raises when the half message could not be sent (then nothing ran)."""
        result = await self.send_half(msg)
        if result.status is not SendStatus.SEND_OK:
            # Stored, but not as safely as asked: RocketMQ rolls such a transaction back.
            state = LocalTransactionState.ROLLBACK
        else:
            state = await self._run_local(msg, local_tx, arg)
        return await self.end(result, state)

    async def send_half(self, msg: Message) -> SendResult:
        """Step 1: the prepared send. ``msg`` gets the TRAN_MSG and PGROUP properties, and its
        unique id (the transaction id) unless it has one."""
        if any(k in msg.properties for k in _HALF_ONLY[1:]):
            raise ClientError("REAL_TOPIC and REAL_QID are set by the broker, not by producers")
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        # The transaction id, known to the local transaction before it runs (it is what a
        # check-back names: msg.msg_id there).
        msg.properties.setdefault(PROPERTY_UNIQ_KEY, default_generator.next_id())
        result = await self.producer.send(msg)
        await self._after_half(result)  # so this broker can reach us for check-backs
        return result

    async def send_half_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_id: str | None = None,
    ) -> HalfBatchResult:
        """Send ``messages`` (one topic, n >= 1) prepared, as ONE half record for one queue:
        one request, one append on the broker. ``properties`` go on the half record (a check-back
        shows them; the committed messages do not carry them). Raises when nothing was stored
        for sure (bad input, a refusal, no answer after the producer's retries)."""
        if not messages:
            raise EmptyBodyError("a transactional batch holds at least one message")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ClientError("send_half_batch: all messages must have the same topic")
        bodies, props, ids = _pack_columns(messages)
        if len(ids) > 1 and any(p is not _NO_PROPS for p in props):
            check_batch_groups(messages)
        packed = encode_send_body(
            bodies,
            [p or _UNIQ_PREFIX + i.encode() + b"\x02" for p, i in zip(props, ids, strict=True)],
        )
        if queue is None:  # a FIFO message group picks its queue
            producer = self.producer
            loop = producer.check_running()
            deadline = loop.time() + producer.config.send_timeout_s
            queue = await producer.choose_fixed_queue(messages[0], None, None, None, deadline)
        return await self.send_packed_half_batch(
            topic,
            packed,
            ids,
            queue=queue,
            properties=properties,
            transaction_id=transaction_id,
            flag=messages[0].flag,
        )

    async def send_packed_half_batch(
        self,
        topic: str,
        packed: bytes,
        msg_ids: Sequence[str],
        *,
        queue: MessageQueue | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_id: str | None = None,
        flag: int = 0,
    ) -> HalfBatchResult:
        """:meth:`send_half_batch` for messages already packed in the send-body layout
        (:func:`orbitmq.protocol.messages.encode_send_body`), each with its UNIQ_KEY among its
        properties; ``msg_ids`` are those ids in order. For callers that build bodies in bulk
        (the Spark sink packs columns with pyarrow: a Message per row would cost more than the
        send). The broker checks the packed body before storing the half."""
        if not msg_ids:
            raise EmptyBodyError("a transactional batch holds at least one message")
        batch_props = dict(properties or {})
        if not _RESERVED_BATCH_LEVEL.isdisjoint(batch_props):
            names = sorted(_RESERVED_BATCH_LEVEL.intersection(batch_props))
            raise ClientError(
                f"properties {', '.join(names)} are set by the producer "
                "(pass the transaction id as transaction_id=)"
            )
        producer = self.producer
        loop = producer.check_running()
        tx_id = transaction_id or default_generator.next_id()
        batch_props[PROPERTY_TRANSACTION_PREPARED] = "true"
        batch_props[PROPERTY_PRODUCER_GROUP] = self.group
        batch_props[PROPERTY_UNIQ_KEY] = tx_id
        batch_props[PROPERTY_TRANSACTION_BATCH] = str(len(msg_ids))
        # Validates the packed size against max_message_size, and the batch's properties.
        half = producer.prepare(Message(topic, packed, properties=batch_props), compress=False)
        deadline = loop.time() + producer.config.send_timeout_s
        fixed = queue
        if fixed is None:
            # Pinned for the producer's retries too: a retry after a lost answer then reaches
            # the broker holding the first try, which answers with that half instead of
            # storing a second one (a second half, checked back by transaction id, could be
            # committed as well: duplicates).
            info = await producer.sender.route(topic, deadline - loop.time())
            fixed = producer.fault.select_queue(topic, info.write_queues)
        [result] = await producer.sender.send(
            topic, [half], SYSFLAG_TRANSACTION_PREPARED, flag, queue=fixed, deadline=deadline
        )
        addr = await self._after_half(result)
        mq = result.message_queue
        return HalfBatchResult(
            topic=topic,
            queue_id=mq.queue_id,
            broker_name=mq.broker_name,
            broker_addr=addr,
            offset=result.offset,
            queue_offset=result.queue_offset,
            transaction_id=tx_id,
            count=len(msg_ids),
            msg_ids=tuple(msg_ids),
            status=result.status,
        )

    async def _after_half(self, result: SendResult) -> str:
        """Make sure the broker holding a new half can reach this producer for check-backs;
        returns its address ("" if unknown)."""
        topic = result.message_queue.topic
        if topic not in self._topics:
            self._topics.append(topic)
        addr = self.producer.routes.master_addr(result.message_queue.broker_name)
        if addr and addr not in self._beaten:
            await self._beat(addr)
        return addr or ""

    async def end_many(
        self,
        halves: Sequence[HalfBatchResult | SendResult],
        state: LocalTransactionState,
        *,
        concurrency: int = 64,
    ) -> list[EndResult]:
        """Decide many halves: one END_TRANSACTION each, at most ``concurrency`` in flight per
        broker, results in the order of ``halves``. A failure is reported in its EndResult, not
        raised; deciding again is safe (the broker applies a decision once)."""
        if concurrency < 1:
            raise ClientError("concurrency must be >= 1")
        for topic in {_topic_of(h) for h in halves}:
            try:  # the current route: the address a half was sent to may be stale
                await self.producer.routes.get(topic)
            except MQError as exc:
                log.info("end_many: no route for %r: %s", topic, exc)
        slots: dict[str, asyncio.Semaphore] = {}

        async def one(half: HalfBatchResult | SendResult) -> EndResult:
            addr = self._addr_of(half)
            tx_id = half.transaction_id if isinstance(half, HalfBatchResult) else half.msg_id
            if not addr:
                err = ClientError(f"no address for the broker of transaction {tx_id}")
                return EndResult(tx_id, state, error=err)
            sem = slots.setdefault(addr, asyncio.Semaphore(concurrency))
            async with sem:
                answer, error = await self._send_end(addr, half.offset, tx_id, state)
            return EndResult(tx_id, state, answer, error)

        results = list(await asyncio.gather(*(one(h) for h in halves)))
        failed = [r for r in results if r.error is not None]
        if failed:
            log.warning("end_many %s: %d of %d failed (first: %s: %s)", state.value,
                        len(failed), len(results), failed[0].transaction_id, failed[0].error)  # fmt: skip
        return results

    def _addr_of(self, half: HalfBatchResult | SendResult) -> str:
        if isinstance(half, HalfBatchResult):
            return self.producer.routes.master_addr(half.broker_name) or half.broker_addr
        return self.producer.routes.master_addr(half.message_queue.broker_name) or ""

    async def _send_end(
        self, addr: str, offset: int, tx_id: str, state: LocalTransactionState
    ) -> tuple[str, MQError | None]:
        """One END_TRANSACTION; (the broker's state, None) or ("", why it failed)."""
        frame = self._end_frame(offset, tx_id, state, from_check=False)
        try:
            resp = await self.producer.remoting.invoke(addr, frame, self.end_timeout_s)
        except MQError as exc:
            return "", exc
        if resp.code != ResponseCode.SUCCESS:
            return "", RemoteError(resp.code, resp.remark)
        return str(resp.fields.get("state", "")), None

    async def _run_local(
        self, msg: Message, local_tx: LocalTransaction | None, arg: Any
    ) -> LocalTransactionState:
        fn = local_tx or self.listener.execute_local_transaction
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn(msg, arg)
            else:
                value = await asyncio.to_thread(fn, msg, arg)
                if inspect.isawaitable(value):
                    value = await value
        except Exception:
            log.exception("local transaction of %s raised: state UNKNOWN", msg.topic)
            return LocalTransactionState.UNKNOWN
        return _as_state(value, "the local transaction")

    async def end(self, result: SendResult, state: LocalTransactionState) -> TransactionSendResult:
        """Step 3: END_TRANSACTION to the broker holding the half message. A failure is kept in
        ``end_error`` (not raised): the broker checks back instead."""
        tx = TransactionSendResult(result, state, result.msg_id)
        addr = self.producer.routes.master_addr(result.message_queue.broker_name)
        if not addr:
            tx.end_error = ClientError(f"no address for broker {result.message_queue.broker_name}")
            return tx
        _, tx.end_error = await self._send_end(addr, result.offset, result.msg_id, state)
        if tx.end_error is not None:
            log.warning("END_TRANSACTION %s for %s: %s", state.value, result.msg_id, tx.end_error)
        return tx

    def _end_frame(
        self, offset: int, msg_id: str, state: LocalTransactionState, *, from_check: bool
    ) -> Frame:
        fields = {
            "producer_group": self.group,
            "tran_state": state.value,
            "commit_log_offset": offset,
            "msg_id": msg_id,
            "transaction_id": msg_id,
            "from_check": from_check,
        }
        return Frame(RequestCode.END_TRANSACTION, fields=fields)

    # ------------------------------------------------------------------ check-backs

    async def _on_request(self, frame: Frame, conn: Connection) -> Reply:
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            return frame.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {frame.code} not supported"
            )
        self._tasks.spawn(self._answer_check(frame, conn))
        return None  # oneway: the answer is an END_TRANSACTION of its own

    async def _answer_check(self, frame: Frame, conn: Connection) -> None:
        try:
            msg, offset = _checked_message(frame)
        except (MQError, ValueError, TypeError) as exc:
            log.warning("malformed CHECK_TRANSACTION_STATE from %s: %s", conn.peer, exc)
            return
        if frame.fields.get("producer_group", self.group) != self.group:
            log.warning(
                "check-back for group %r reached group %s",
                frame.fields.get("producer_group"),
                self.group,
            )
            return
        async with self._check_slots:
            fn = self.listener.check_local_transaction
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(msg)
                else:
                    value = await asyncio.to_thread(fn, msg)
                    if inspect.isawaitable(value):
                        value = await value
                state = _as_state(value, "check_local_transaction")
            except Exception:
                log.exception("check_local_transaction raised: state UNKNOWN")
                state = LocalTransactionState.UNKNOWN
        end = self._end_frame(offset, msg.msg_id or "", state, from_check=True)
        try:
            resp = await conn.request(end, self.end_timeout_s)
        except MQError as exc:
            log.info("answering the check-back of %s failed: %s", msg.msg_id, exc)
            return
        self.checks_answered += 1
        if resp.code != ResponseCode.SUCCESS:
            log.warning("broker refused the check answer for %s: %s", msg.msg_id, resp.remark)


_UNIQ_PREFIX = PROPERTY_UNIQ_KEY.encode() + b"\x01"
_NO_PROPS = b""


def _pack_columns(messages: Sequence[Message]) -> tuple[list[bytes], list[bytes], list[str]]:
    """Bodies, encoded properties and unique ids of a half batch's messages. Per message only
    what must be: ids come in one call, and a message without tags, keys or properties (the
    usual sink row) costs a list slot; its properties are just its id, added by the caller.
    Raises before anything is sent."""
    fresh = default_generator.next_ids(len(messages))
    bodies = [m.body if type(m.body) is bytes else bytes(m.body) for m in messages]
    if not all(bodies):
        raise EmptyBodyError(
            f"message {bodies.index(b'')} of the transactional batch has an empty body"
        )
    props: list[bytes] = [_NO_PROPS] * len(messages)
    ids = fresh
    for k, m in enumerate(messages):
        if not (m.properties or m.tags or m.keys):
            continue
        if m.properties and not _RESERVED_IN_BATCH.isdisjoint(m.properties):
            names = sorted(_RESERVED_IN_BATCH.intersection(m.properties))
            raise ClientError(
                f"message {k} of a transactional batch carries {', '.join(names)}: "
                "the batch's own properties carry the transaction"
            )
        system = m.system_properties()
        given = system.get(PROPERTY_UNIQ_KEY)
        if given:
            ids[k] = given  # the caller's own id (a retried write keeps its ids)
        else:
            system[PROPERTY_UNIQ_KEY] = ids[k]
        encoded = encode_properties(system)
        n = len(system)
        if encoded.count(b"\x01") != n or encoded.count(b"\x02") != n:
            raise MessageIllegalError(
                f"message {k}: property names and values may not contain \\x01 or \\x02"
            )
        if len(encoded) > DEFAULT_MAX_PROPERTIES_SIZE:
            raise PropertiesTooLargeError(
                f"message {k}: properties are {len(encoded)} bytes encoded, "
                f"limit {DEFAULT_MAX_PROPERTIES_SIZE}"
            )
        props[k] = encoded
    return bodies, props, ids


def _topic_of(half: HalfBatchResult | SendResult) -> str:
    return half.topic if isinstance(half, HalfBatchResult) else half.message_queue.topic


def _checked_message(frame: Frame) -> tuple[StoredMessage, int]:
    """The half message of a check-back, as the listener sees it: real topic and queue, plain
    body, no broker-internal properties."""
    body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
    records = decode_records(body)
    if len(records) != 1:
        raise ClientError(f"check-back carries {len(records)} records, not 1")
    half = _codec.plain(records[0])
    props = half.properties
    topic = props.get(PROPERTY_REAL_TOPIC) or str(frame.fields.get("topic", half.topic))
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, half.queue_id))
    except ValueError:
        queue_id = half.queue_id
    clean = {k: v for k, v in props.items() if k not in _HALF_ONLY}
    offset = frame.fields.get("commit_log_offset", half.physical_offset)
    if not isinstance(offset, int):
        raise ClientError("commit_log_offset is not an integer")
    return dataclasses.replace(half, topic=topic, queue_id=queue_id, properties=clean), offset


class TransactionProducer(BlockingFacade[AsyncTransactionProducer]):
    """The blocking transactional producer: an AsyncTransactionProducer on a private loop
    thread. ``send_in_transaction`` runs a plain ``local_tx`` in the caller's thread (so it may
    use the caller's database connection); check-backs run the listener in worker threads.

    ``with TransactionProducer(ns, "G", listener, topics=["T"]) as p: p.send_in_transaction(m, tx)``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        listener: TransactionListener,
        config: TransactionConfig | None = None,
        *,
        topics: Sequence[str] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._thread = LoopThread("orbitmq-tx-producer")
        self._closed = False
        make = _make(namesrv_addrs, group, listener, config, topics, ssl_context)
        try:
            self._async = self._thread.run(make)
            self._thread.run(self._async.start())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def async_producer(self) -> AsyncTransactionProducer:
        return self._async

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def send_in_transaction(
        self, msg: Message, local_tx: LocalTransaction | None = None, arg: Any = None
    ) -> TransactionSendResult:
        result = self._thread.run(self._async.send_half(msg))
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK
        else:
            fn = local_tx or self._async.listener.execute_local_transaction
            try:
                value = fn(msg, arg)
                if inspect.isawaitable(value):
                    value = self._thread.run(_await(value))
                state = _as_state(value, "the local transaction")
            except Exception:
                log.exception("local transaction of %s raised: state UNKNOWN", msg.topic)
                state = LocalTransactionState.UNKNOWN
        return self._thread.run(self._async.end(result, state))

    def send_half_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_id: str | None = None,
    ) -> HalfBatchResult:
        """See :meth:`AsyncTransactionProducer.send_half_batch`."""
        return self._thread.run(
            self._async.send_half_batch(
                messages, queue=queue, properties=properties, transaction_id=transaction_id
            )
        )

    def end_many(
        self,
        halves: Sequence[HalfBatchResult | SendResult],
        state: LocalTransactionState,
        *,
        concurrency: int = 64,
    ) -> list[EndResult]:
        """See :meth:`AsyncTransactionProducer.end_many`."""
        return self._thread.run(self._async.end_many(halves, state, concurrency=concurrency))


async def _make(
    namesrv_addrs: str | Sequence[str],
    group: str,
    listener: TransactionListener,
    config: TransactionConfig | None,
    topics: Sequence[str],
    ssl_context: ssl.SSLContext | None,
) -> AsyncTransactionProducer:
    # Made on the loop thread: its asyncio objects belong to that loop.
    return AsyncTransactionProducer(
        namesrv_addrs, group, listener, config, topics=topics, ssl_context=ssl_context
    )


async def _await(value: Awaitable[Any]) -> Any:
    return await value
