"""PullMessage and the offset RPCs of the gRPC proxy: PULL_MESSAGE and the offset requests.

=================================  ==========================================================
RPC                                OrbitMQ
=================================  ==========================================================
PullMessage                        PULL_MESSAGE (with TAG / SQL92 filter, long poll)
UpdateOffset / GetOffset           UPDATE_CONSUMER_OFFSET / QUERY_CONSUMER_OFFSET
QueryOffset                        GET_MIN_OFFSET / GET_MAX_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP
=================================  ==========================================================

A pull consumer keeps its own offsets, so none of this touches Pop state; the queue a request
names (topic, broker, id) is the broker it goes to. Business errors are answered in the
response's ``status``, never as gRPC errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, ProtocolError
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.limits import MAX_PULL_MESSAGES
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import (
    GetMaxOffsetRequest,
    GetMinOffsetRequest,
    Header,
    PullMessageRequest,
    QueryConsumerOffsetRequest,
    SearchOffsetRequest,
    UpdateConsumerOffsetRequest,
)
from orbitmq.proxy import status
from orbitmq.proxy.consumer_calls import Answer, ConsumerCalls
from orbitmq.proxy.convert import FILTER_TYPES, to_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.receive import POLL_RESERVE_S

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

MAX_PULL_BATCH = MAX_PULL_MESSAGES
"""Messages one PullMessage asks a broker for at most (a filtered pull's limit)."""
MAX_PULL_BYTES = 4 * 1024 * 1024


class PullRpcs:
    """PullMessage, UpdateOffset, GetOffset, QueryOffset."""

    def __init__(self, ctx: ProxyContext, calls: ConsumerCalls) -> None:
        self.ctx = ctx
        self.calls = calls
        self.long_polling_max_s = ctx.config.long_polling_max_s

    async def _queue_addr(self, mq: pb.MessageQueue) -> tuple[str, str]:
        topic = self.ctx.name_of(mq.topic)
        if not mq.topic.name:
            raise Answer(pb.ILLEGAL_TOPIC, "the topic is missing")
        if mq.id < 0:
            raise Answer(pb.BAD_REQUEST, f"queue id {mq.id} < 0")
        if not mq.broker.name:
            raise Answer(pb.BAD_REQUEST, "the queue names no broker")
        return topic, await self.calls.broker_addr(topic, mq.broker.name)

    async def pull_message(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[svc.PullMessageResponse]:
        """Status, the messages (no receipt handles: offsets are the client's), next offset."""
        try:
            topic, addr = await self._queue_addr(request.message_queue)
            if request.offset < 0:
                raise Answer(pb.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
            kind = FILTER_TYPES.get(request.filter_expression.type)
            if kind is None:
                raise Answer(pb.ILLEGAL_FILTER_EXPRESSION, "unknown filter type")
            poll_s = min(request.long_polling_timeout.ToMilliseconds() / 1000,
                         self.long_polling_max_s)  # fmt: skip
            remaining = context.time_remaining()
            if remaining is not None:
                poll_s = min(poll_s, remaining - POLL_RESERVE_S)
            poll_s = max(0.0, poll_s)
            batch = request.batch_size if request.batch_size > 0 else 32
            pull = PullMessageRequest(
                topic=topic,
                queue_id=request.message_queue.id,
                queue_offset=request.offset,
                max_msg_nums=min(batch, MAX_PULL_BATCH),
                max_bytes=MAX_PULL_BYTES,
                expression_type=kind,
                expression=request.filter_expression.expression.strip() or "*",
                suspend_timeout_ms=int(poll_s * 1000),
                group=self.ctx.name_of(request.group) if request.group.name else "",
            )
            resp = await self.calls.call(
                addr,
                pull,
                timeout_s=poll_s + self.calls.timeout_s,
                ok=(
                    ResponseCode.SUCCESS,
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ResponseCode.PULL_OFFSET_MOVED,
                ),
            )
            nxt = resp.fields.get("next_begin_offset")
            next_offset = nxt if isinstance(nxt, int) else request.offset
            out: list[svc.PullMessageResponse] = []
            if resp.code == ResponseCode.SUCCESS:
                mq_topic = request.message_queue.topic
                out = [_pulled(rec, mq_topic) for rec in decode_records(memoryview(resp.body))]
                head = status.ok()
            elif resp.code == ResponseCode.PULL_OFFSET_MOVED:
                head = status.make(pb.ILLEGAL_OFFSET, resp.remark or "offset moved")
            else:
                head = status.make(pb.MESSAGE_NOT_FOUND, "no new message")
        except Answer as exc:
            yield svc.PullMessageResponse(status=exc.status)
            return
        except MQError as exc:
            yield svc.PullMessageResponse(status=status.from_error(exc))
            return
        yield svc.PullMessageResponse(status=head)
        for msg in out:
            yield msg
        yield svc.PullMessageResponse(next_offset=next_offset)

    async def update_offset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.UpdateOffsetResponse:
        try:
            if not request.group.name:
                raise Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
            topic, addr = await self._queue_addr(request.message_queue)
            update = UpdateConsumerOffsetRequest(
                group=self.ctx.name_of(request.group),
                topic=topic,
                queue_id=request.message_queue.id,
                offset=request.offset,
            )
            await self.calls.call(addr, update)
        except Answer as exc:
            return svc.UpdateOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.UpdateOffsetResponse(status=status.from_error(exc))
        return svc.UpdateOffsetResponse(status=status.ok())

    async def get_offset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.GetOffsetResponse:
        try:
            if not request.group.name:
                raise Answer(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is missing")
            topic, addr = await self._queue_addr(request.message_queue)
            query = QueryConsumerOffsetRequest(
                group=self.ctx.name_of(request.group),
                topic=topic,
                queue_id=request.message_queue.id,
                set_zero_if_not_found=False,
            )
            resp = await self.calls.call(
                addr,
                query,
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
            )
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                raise Answer(pb.OFFSET_NOT_FOUND, "the group has no offset for this queue")
            return svc.GetOffsetResponse(status=status.ok(), offset=_int(resp, "offset"))
        except Answer as exc:
            return svc.GetOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.GetOffsetResponse(status=status.from_error(exc))

    async def query_offset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> svc.QueryOffsetResponse:
        try:
            topic, addr = await self._queue_addr(request.message_queue)
            queue_id = request.message_queue.id
            policy = request.query_offset_policy
            header: Header
            if policy == pb.BEGINNING:
                header = GetMinOffsetRequest(topic=topic, queue_id=queue_id)
            elif policy == pb.END:
                header = GetMaxOffsetRequest(topic=topic, queue_id=queue_id)
            elif policy == pb.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise Answer(pb.BAD_REQUEST, "policy TIMESTAMP needs a timestamp")
                timestamp = max(0, request.timestamp.ToMilliseconds())
                header = SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp=timestamp)
            else:
                raise Answer(pb.BAD_REQUEST, f"unknown query offset policy {policy}")
            resp = await self.calls.call(addr, header)
            return svc.QueryOffsetResponse(status=status.ok(), offset=_int(resp, "offset"))
        except Answer as exc:
            return svc.QueryOffsetResponse(status=exc.status)
        except MQError as exc:
            return svc.QueryOffsetResponse(status=status.from_error(exc))


def _pulled(rec: StoredMessage, topic: pb.Resource) -> svc.PullMessageResponse:
    resp = svc.PullMessageResponse()
    to_pb_message(rec, topic, delivery_attempt=rec.reconsume_times + 1, out=resp.message)
    return resp


def _int(resp: Frame, name: str) -> int:
    value = resp.fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"broker answer field {name!r} is not an integer: {value!r:.40}")
    return value
