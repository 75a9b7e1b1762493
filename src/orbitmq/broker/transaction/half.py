"""HalfMessages: the send side of transactional messages (docs/transactions.md).

A prepared send (sys_flag PREPARED, or property TRAN_MSG=true; PGROUP names the producer group)
is stored as a *half message* in the half topic, invisible to consumers, with REAL_TOPIC /
REAL_QID saying where it belongs. :meth:`HalfMessages.half_of` tells a prepared send from any
other (one bit test and a substring search, on every send) and rewrites it for the half topic;
:meth:`HalfMessages.put_half` stores it and tracks it in the shared
:class:`~orbitmq.broker.transaction.state.TxState`, where the
:class:`~orbitmq.broker.transaction.service.TransactionService` decides and checks it back.

A prepared send whose property TRAN_BATCH=n says its body packs n messages of one queue is one
half record (a transactional batch); its packed body is validated here, so its commit cannot
fail on it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.transaction.records import (
    HALF_TOPIC,
    PROPERTY_CHECK_IMMUNITY_S,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
)
from orbitmq.broker.transaction.state import Half, TxState
from orbitmq.common.errors import (
    EmptyBodyError,
    FlushTimeoutError,
    MessageIllegalError,
    PropertiesTooLargeError,
    ProtocolError,
    TransactionTypeMismatchError,
)
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    SYSFLAG_TRANSACTION_PREPARED,
    MessageBatch,
    decode_properties,
    encode_properties,
    property_value,
)
from orbitmq.common.validation import validate_group
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.protocol.messages import SendBody, decode_send_body
from orbitmq.store.commit_log import AppendResult

log = logging.getLogger(__name__)

TX_TYPE_MASK = 0xC
"""The transaction-type bits of sys_flag (RocketMQ's MessageSysFlag)."""
MESSAGE_TYPE_TRANSACTION = "TRANSACTION"
_TRAN_TRUE = PROPERTY_TRANSACTION_PREPARED.encode() + b"\x01true"
_TRAN_NEEDLE = PROPERTY_TRANSACTION_PREPARED.encode() + b"\x01"
STRIPPED_ON_COMMIT = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_CHECK_IMMUNITY_S,
)
"""Properties of a half message its commit copy does not keep."""
_RESERVED_IN_BATCH = tuple(
    name.encode() + b"\x01"
    for name in (*STRIPPED_ON_COMMIT, PROPERTY_TRANSACTION_BATCH, PROPERTY_TRANSACTION_ID)
)
"""Properties a message packed in a half batch may not carry: its commit copy keeps its
properties byte for byte (no per-message re-encoding), so they are refused at send instead."""


@dataclass(slots=True)
class HalfRequest:
    """A prepared send rewritten for the half topic (see :meth:`HalfMessages.half_of`)."""

    batch: MessageBatch
    group: str
    msg_id: str
    transaction_id: str
    topic: str
    queue_id: int
    immunity_ms: int
    batch_size: int = 0
    """Messages packed in a half batch (0: a single half message)."""


class HalfMessages:
    """Stores prepared sends as half messages, tracked in ``state`` (the transaction
    service's)."""

    def __init__(self, ctx: BrokerContext, state: TxState) -> None:
        self.config = ctx.config
        self.system_log = ctx.log
        self.clock = ctx.clock
        self.state = state
        self._sending: dict[tuple[str, str], asyncio.Event] = {}
        """Half appends under way by (group, transaction id), for a retry that overtakes one."""

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
        self.state.halves_in_flight += 1
        try:
            try:
                result = await self.system_log.append(req.batch)
            except FlushTimeoutError as exc:
                if isinstance(exc.result, AppendResult):
                    self._track(req, exc.result)  # stored, only not fsynced yet
                raise
            self._track(req, result)
            return result
        finally:
            self.state.halves_in_flight -= 1
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
                store_ms=self.clock.now_ms(),
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
