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
import inspect
import logging
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from orbitmq.client._settings import resolve_config
from orbitmq.client.consumer_types import new_client_id
from orbitmq.client.fifo import check_batch_groups
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.client.route import MessageQueue
from orbitmq.client.transaction.halves import (
    NO_PROPS,
    UNIQ_PREFIX,
    checked_message,
    pack_columns,
    topic_of,
)
from orbitmq.client.transaction.types import (
    HALF_ONLY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_PREPARED,
    RESERVED_BATCH_LEVEL,
    EndResult,
    HalfBatchResult,
    LocalTransaction,
    LocalTransactionState,
    TransactionConfig,
    TransactionListener,
    TransactionSendResult,
    as_state,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    MQError,
    error_for,
)
from orbitmq.common.ids import default_generator
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_PREPARED,
    Message,
)
from orbitmq.common.tasks import TaskSet
from orbitmq.common.validation import validate_group
from orbitmq.net.connection import Connection, Reply
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.requests import (
    EndTransactionRequest,
    HeartbeatRequest,
    UnregisterClientRequest,
)

log = logging.getLogger(__name__)

__all__ = ["AsyncTransactionProducer"]


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
        **overrides: Any,
    ) -> None:
        validate_group(group)
        if config is None:
            config = TransactionConfig(group=group)
        cfg = resolve_config(TransactionConfig, config, overrides, "AsyncTransactionProducer")
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
                addr, HeartbeatRequest().frame(body), self.end_timeout_s
            )
        except MQError as exc:
            log.info("transaction producer heartbeat to %s failed: %s", addr, exc)
            return
        if resp.code == ResponseCode.SUCCESS:
            self._beaten.add(addr)
        else:
            log.warning("broker %s refused the heartbeat: %s", addr, resp.remark)

    async def _unregister(self) -> None:
        header = UnregisterClientRequest(client_id=self.client_id, group=self.group)

        async def one(addr: str) -> None:
            frame = header.frame()
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
        if any(k in msg.properties for k in HALF_ONLY[1:]):
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
        bodies, props, ids = pack_columns(messages)
        if len(ids) > 1 and any(p is not NO_PROPS for p in props):
            check_batch_groups(messages)
        packed = encode_send_body(
            bodies,
            [p or UNIQ_PREFIX + i.encode() + b"\x02" for p, i in zip(props, ids, strict=True)],
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
        if not RESERVED_BATCH_LEVEL.isdisjoint(batch_props):
            names = sorted(RESERVED_BATCH_LEVEL.intersection(batch_props))
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
        for topic in {topic_of(h) for h in halves}:
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
            return "", error_for(resp.code, resp.remark)
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
        return as_state(value, "the local transaction")

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
        header = EndTransactionRequest(
            producer_group=self.group,
            tran_state=state.value,
            commit_log_offset=offset,
            msg_id=msg_id,
            transaction_id=msg_id,
            from_check=from_check,
        )
        return header.frame()

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
            msg, offset = checked_message(frame)
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
                state = as_state(value, "check_local_transaction")
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
