"""The broker requests behind the proxy's consumer RPCs, and the pieces those RPCs share.

:class:`ConsumerCalls` owns the proxy's consumer-side connection to the brokers and sends the
requests more than one RPC needs (CHANGE_MESSAGE_INVISIBLETIME, BATCH_ACK_MESSAGE, ACK_MESSAGE,
CONSUMER_SEND_MSG_BACK ``to_dlq``), each header built with its class from
``orbitmq.protocol.requests``. Receive (receive.py), auto-renew (renew.py), ack / change /
forward (consumer_service.py) and pull / offsets (pull_service.py) all go through it, so a
broker request is written once. A refused request raises the error class of the broker's code
(``error_for``); :class:`Answer` ends an RPC early with a gRPC status of its own (a validation failure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, ProtocolError, error_for
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.consumer import AckResults, ReceiptHandleList
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import (
    AckMessageRequest,
    BatchAckRequest,
    ChangeInvisibleTimeRequest,
    Header,
    SendMessageBackRequest,
)
from orbitmq.protocol.signature import Signer
from orbitmq.proxy import receipt, status

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 3.0
"""A broker request's time on top of its long poll."""
NACK_MS = 1_000
"""Invisible time given back to messages the client never got, or held by a client that left."""


class Answer(Exception):
    """Ends an RPC early with this status (a validation failure)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status.make(code, message)


@dataclass(slots=True)
class Held:
    """A message a push consumer holds, kept invisible by the proxy until acked."""

    client_id: str
    group: str
    topic: str
    broker_name: str
    broker_handle: str
    deadline_ms: int
    first_ms: int
    renewing: asyncio.Task[None] | None = None
    failures: int = 0


class ConsumerCalls:
    """The consumer-side broker requests of the proxy (one RemotingClient, started with it)."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        self.timeout_s = BROKER_TIMEOUT_S
        self.remoting: RemotingClient | None = None

    async def start(self) -> None:
        if self.remoting is None:
            cfg = self.ctx.config
            signer = None if not cfg.access_key else Signer(cfg.access_key, cfg.secret_key or "")
            self.remoting = RemotingClient(name="proxy-consumer", signer=signer)

    async def close(self) -> None:
        if self.remoting is not None:
            await self.remoting.close()
            self.remoting = None

    async def invoke(self, addr: str, frame: Frame, timeout_s: float) -> Frame:
        """One request; the answer whatever its code."""
        if self.remoting is None:
            raise ClientError("the proxy's consumer service is not started")
        try:
            resp = await self.remoting.invoke(addr, frame, timeout_s)
        except MQError as exc:
            self.ctx.routes.master_failed(addr, exc)  # a lost master: find the group's next one
            raise
        if resp.code == ResponseCode.NO_PERMISSION:
            self.ctx.routes.master_failed(addr, error_for(resp.code, resp.remark))
        return resp

    async def call(
        self,
        addr: str,
        header: Header,
        body: bytes = b"",
        *,
        timeout_s: float | None = None,
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
    ) -> Frame:
        """One request; RemoteError unless the answer's code is in ``ok``."""
        resp = await self.invoke(addr, header.frame(body), timeout_s or self.timeout_s)
        if resp.code not in ok:
            raise error_for(resp.code, resp.remark)
        return resp

    async def broker_addr(self, topic: str, broker_name: str) -> str:
        return await self.ctx.broker_addr(topic, broker_name)

    async def handle_addr(self, topic: str, broker_name: str) -> str:
        """The address of the broker a receipt handle names; a broker the topic's route does
        not list means the handle is not one we gave out for this topic."""
        try:
            return await self.ctx.broker_addr(topic, broker_name)
        except TopicRouteNotFoundError:
            raise
        except ClientError as exc:
            raise receipt.MalformedHandleError(
                f"the receipt handle names broker {broker_name[:60]!r}, which serves no queue "
                f"of {topic}"
            ) from exc

    async def change_invisible(
        self, group: str, topic: str, broker_name: str, broker_handle: str, invisible_ms: int
    ) -> tuple[str, int]:
        """CHANGE_MESSAGE_INVISIBLETIME: the new broker handle and deadline (wall-clock ms)."""
        addr = await self.handle_addr(topic, broker_name)
        request = ChangeInvisibleTimeRequest(
            group=group, topic=topic, invisible_time_ms=invisible_ms, handle=broker_handle
        )
        resp = await self.call(addr, request)
        handle = resp.fields.get("handle")
        if not isinstance(handle, str) or not handle:
            raise ProtocolError(f"broker {broker_name} sent no new receipt handle")
        pop_time = resp.fields.get("pop_time_ms")
        start = pop_time if isinstance(pop_time, int) else now_ms()
        return handle, start + invisible_ms

    async def nack_many(self, held: list[Held]) -> None:
        """Best effort: make each message visible again after NACK_MS."""

        async def one(h: Held) -> None:
            try:
                await self.change_invisible(h.group, h.topic, h.broker_name, h.broker_handle,
                                            NACK_MS)  # fmt: skip
            except MQError as exc:
                log.debug("nack of a held message failed: %s", exc)

        await asyncio.gather(*(one(h) for h in held))

    async def batch_ack(
        self, addr: str, group: str, topic: str, handles: list[str]
    ) -> list[tuple[int, str]]:
        """BATCH_ACK_MESSAGE: (code, remark) per handle."""
        body = encode_body(ReceiptHandleList(group=group, topic=topic, handles=handles))
        resp = await self.call(addr, BatchAckRequest(), body)
        try:
            acks = decode_body(bytes(resp.body), AckResults)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"malformed batch ack answer: {exc}") from exc
        if len(acks.codes) != len(handles):
            raise ProtocolError(f"{len(acks.codes)} ack codes for {len(handles)} handles")
        remarks = acks.remarks + [""] * (len(handles) - len(acks.remarks))
        return list(zip(acks.codes, remarks, strict=False))

    async def ack(self, addr: str, group: str, topic: str, handle: str) -> None:
        """ACK_MESSAGE of one broker handle."""
        await self.call(addr, AckMessageRequest(group=group, topic=topic, handle=handle))

    async def to_dlq(
        self, addr: str, group: str, topic: str, physical_offset: int, reconsume_times: int
    ) -> None:
        """CONSUMER_SEND_MSG_BACK ``to_dlq``: a copy of the message in the group's DLQ."""
        request = SendMessageBackRequest(
            group=group,
            offset=physical_offset,
            origin_topic=topic,
            to_dlq=True,
            reconsume_times=max(0, reconsume_times),
        )
        await self.call(addr, request)
