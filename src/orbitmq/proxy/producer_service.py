"""SendMessage, EndTransaction and RecallMessage: the producer side of the proxy.

The send path is the hot one (the target is < 1 ms over a native send): per call it validates
the message, reads the topic's type from a cache, and hands the message to the one shared
AsyncProducer, which already holds the routes and the broker connections. No network lookups
happen on the send path once a topic has been seen, and the body is passed on as received.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from orbitmq.client.recall import recall_message
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, RemoteError
from orbitmq.proxy import status
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import (
    DELAY,
    FIFO,
    NORMAL,
    TRANSACTION,
    SendSpec,
    from_pb_message,
    resource_name,
)
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.status import ProxyError
from orbitmq.proxy.transactions import TransactionRelay, encode_transaction_id

log = logging.getLogger(__name__)

Code = pb.Code
MT = pb.MessageType
MAX_MESSAGES_PER_SEND = 1024
RECALL_TRIES = 5

ACCEPT_TYPES: dict[str, tuple[int, ...]] = {
    "NORMAL": (MT.NORMAL,),
    "FIFO": (MT.FIFO,),
    "DELAY": (MT.DELAY,),
    "TRANSACTION": (MT.TRANSACTION,),
    "MIXED": (MT.NORMAL, MT.FIFO, MT.DELAY, MT.TRANSACTION),
}
"""What a topic of each OrbitMQ message_type accepts (advertised in routes, enforced on send)."""

_RECALL_VERSION = "r1"
_OK = status.ok()


def encode_recall_handle(broker_name: str, message_id: str) -> str:
    return f"{_RECALL_VERSION}|{broker_name}|{message_id}"


def decode_recall_handle(handle: str) -> tuple[str, str]:
    parts = handle.split("|")
    if len(parts) != 3 or parts[0] != _RECALL_VERSION or not parts[1] or not parts[2]:
        raise ProxyError(Code.BAD_REQUEST, "malformed recall handle")
    return parts[1], parts[2]


class ProducerRpcs:
    def __init__(self, ctx: ProxyContext, relay: TransactionRelay) -> None:
        self.ctx = ctx
        self.relay = relay

    # ------------------------------------------------------------------ SendMessage

    async def send_message(
        self, request: svc.SendMessageRequest, client_id: Callable[[], str]
    ) -> svc.SendMessageResponse:
        """``client_id`` is called only when a message needs it (transactions): reading the
        call's metadata costs more than the rest of a plain send's own work."""
        messages = request.messages
        if not messages:
            return svc.SendMessageResponse(status=status.make(Code.BAD_REQUEST, "no message"))
        if len(messages) > MAX_MESSAGES_PER_SEND:
            return svc.SendMessageResponse(
                status=status.make(
                    Code.BAD_REQUEST, f"more than {MAX_MESSAGES_PER_SEND} messages in one send"
                )
            )
        # Entries are filled in place inside the response (no sub-messages built and copied).
        resp = svc.SendMessageResponse()
        if len(messages) == 1:
            entry = resp.entries.add()
            await self._send_one(messages[0], client_id, entry)
            resp.status.CopyFrom(entry.status)
            return resp
        entries = [resp.entries.add() for _ in messages]
        await asyncio.gather(
            *(self._send_one(m, client_id, e) for m, e in zip(messages, entries, strict=True))
        )
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            resp.status.CopyFrom(entries[0].status)
        else:
            resp.status.CopyFrom(
                status.make(Code.MULTIPLE_RESULTS, "messages have different results")
            )
        return resp

    async def _send_one(
        self, m: pb.Message, client_id: Callable[[], str], entry: svc.SendResultEntry
    ) -> None:
        cfg = self.ctx.config
        try:
            spec = from_pb_message(m, max_body=cfg.max_message_size, max_delay_s=cfg.max_delay_s)
            topic = spec.message.topic
            types = self.ctx.topic_types
            declared = types.cached(topic)
            if declared is None:
                declared = await types.get(topic)
            _check_type(topic, declared, spec)
            if spec.kind == TRANSACTION:
                self.relay.prepare(spec.message.properties, topic)
                self.relay.remember_sender(spec.message_id, client_id())
            if spec.kind == NORMAL or spec.kind == FIFO:
                # Sends that arrive together (many clients, many threads) leave as one batch
                # frame per queue; while the proxy's send batches are in flight
                # (send_batches_in_flight), later sends wait in one open batch.
                result = await self.ctx.producer.send_async(spec.message)
            else:  # timers and half messages are sent one by one, as brokers expect them
                result = await self.ctx.producer.send(spec.message)
        except MQError as exc:
            entry.status.CopyFrom(status.from_error(exc))
            entry.message_id = m.system_properties.message_id
            return
        mq: MessageQueue = result.message_queue
        name = result.status.name
        entry.status.CopyFrom(_OK if name == "SEND_OK" else send_status(name))
        entry.message_id = spec.message_id
        entry.offset = result.queue_offset
        if spec.kind == TRANSACTION:
            entry.transaction_id = encode_transaction_id(mq.broker_name, result.offset)
            self.relay.after_half_sent(topic, mq.broker_name)
        elif spec.kind == DELAY:
            entry.recall_handle = encode_recall_handle(mq.broker_name, spec.message_id)

    # ------------------------------------------------------------------ EndTransaction

    async def end_transaction(
        self, request: svc.EndTransactionRequest
    ) -> svc.EndTransactionResponse:
        try:
            await self.relay.end(request)
        except MQError as exc:
            log.info(
                "end transaction %s of %s: %s", request.transaction_id[:80], request.message_id, exc
            )
            return svc.EndTransactionResponse(status=status.from_error(exc))
        return svc.EndTransactionResponse(status=status.ok())

    # ------------------------------------------------------------------ RecallMessage

    async def recall(self, request: svc.RecallMessageRequest) -> svc.RecallMessageResponse:
        try:
            if not request.topic.name:
                raise ProxyError(Code.ILLEGAL_TOPIC, "recall names no topic")
            broker_name, message_id = decode_recall_handle(request.recall_handle)
            topic = resource_name(request.topic)
            for attempt in range(RECALL_TRIES):
                try:
                    await recall_message(self.ctx.admin, topic, message_id, broker_name=broker_name)
                    break
                except RemoteError as exc:
                    # The broker finds the timer through its message index, which trails the
                    # send by moments: a recall right after the send may not see it yet.
                    if exc.code != ResponseCode.TIMER_MESSAGE_NOT_FOUND or (
                        attempt == RECALL_TRIES - 1
                    ):
                        raise
                    await asyncio.sleep(0.05 * 2**attempt)
        except MQError as exc:
            return svc.RecallMessageResponse(status=status.from_error(exc))
        return svc.RecallMessageResponse(status=status.ok(), message_id=message_id)


def _check_type(topic: str, declared: str, spec: SendSpec) -> None:
    """Refuse a message of a type its topic does not accept (``declared``: the topic's type)."""
    accepted = ACCEPT_TYPES.get(declared, ACCEPT_TYPES["MIXED"])
    if spec.kind not in accepted:
        raise ProxyError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"topic {topic} accepts {declared} messages, not {MT.Name(spec.kind)}",
        )


def send_status(name: str) -> pb.Status:
    if name == "SEND_OK":
        return status.ok()
    return status.from_response_code(ResponseCode[name], f"stored, but {name}")
