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

The producer is composed of an :class:`~orbitmq.client.producer.AsyncProducer` (its routing,
retries and options); check-backs arrive on that producer's connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client.consumer_types import new_client_id
from orbitmq.client.producer import AsyncProducer, SendResult, SendStatus
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, RemoteError
from orbitmq.common.ids import default_generator
from orbitmq.common.message import PROPERTY_UNIQ_KEY, Message
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_group
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records

log = logging.getLogger(__name__)

__all__ = [
    "AsyncTransactionProducer",
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
_HALF_ONLY = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)


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


def _as_state(value: object, what: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    log.warning("%s returned %r, not a LocalTransactionState: taken as UNKNOWN", what, value)
    return LocalTransactionState.UNKNOWN


class AsyncTransactionProducer:
    """The asyncio transactional producer. ``listener`` answers check-backs (and runs local
    transactions when send_in_transaction gets no ``local_tx``). ``topics``: topics whose
    brokers learn of this producer from the start (a restarted producer must be reachable for
    check-backs before it sends anything). Other options are AsyncProducer's."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        group: str,
        listener: TransactionListener,
        *,
        topics: Sequence[str] = (),
        heartbeat_interval_s: float = 10.0,
        check_concurrency: int = 16,
        end_timeout_s: float = 3.0,
        client_id: str | None = None,
        **options: Any,
    ) -> None:
        validate_group(group)
        if heartbeat_interval_s <= 0 or check_concurrency < 1 or end_timeout_s <= 0:
            raise ClientError("heartbeat_interval_s, check_concurrency, end_timeout_s must be > 0")
        self.group = group
        self.listener = listener
        self.client_id = client_id or new_client_id()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.end_timeout_s = end_timeout_s
        self.producer = AsyncProducer(namesrv_addrs, group=group, **options)
        self.producer.remoting.handler = self._on_request  # check-backs come on its connections
        self._topics: list[str] = list(dict.fromkeys(topics))
        self._beaten: set[str] = set()
        self._check_slots = asyncio.Semaphore(check_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
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
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
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
        if msg.topic not in self._topics:
            self._topics.append(msg.topic)
        addr = self.producer.routes.master_addr(result.message_queue.broker_name)
        if addr and addr not in self._beaten:
            await self._beat(addr)  # so this broker can reach us for check-backs
        return result

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
        frame = self._end_frame(result.offset, result.msg_id, state, from_check=False)
        try:
            resp = await self.producer.remoting.invoke(addr, frame, self.end_timeout_s)
        except MQError as exc:
            tx.end_error = exc
        else:
            if resp.code != ResponseCode.SUCCESS:
                tx.end_error = RemoteError(resp.code, resp.remark)
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
        task = asyncio.get_running_loop().create_task(self._answer_check(frame, conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
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
        **options: Any,
    ) -> None:
        self._thread = LoopThread("orbitmq-tx-producer")
        self._closed = False
        try:
            self._async = self._thread.run(_make(namesrv_addrs, group, listener, options))
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


async def _make(
    namesrv_addrs: str | Sequence[str],
    group: str,
    listener: TransactionListener,
    options: dict[str, Any],
) -> AsyncTransactionProducer:
    # Made on the loop thread: its asyncio objects belong to that loop.
    return AsyncTransactionProducer(namesrv_addrs, group, listener, **options)


async def _await(value: Awaitable[Any]) -> Any:
    return await value
