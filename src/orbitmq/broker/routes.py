"""The broker's route table: every request code it answers and the handler that answers it.

This is the one place to look up "which code does what" (RocketMQ's ``registerProcessor``
calls, in one table): `build_routes` maps each :class:`~orbitmq.protocol.codes.RequestCode` to a
bound method of a processor; every handler takes ``(frame, conn)`` and returns a reply (and,
for reads, the record views that follow it). `Dispatcher.handle` is what the
:class:`~orbitmq.net.server.RemotingServer` calls for each request: it counts the request,
answers REQUEST_CODE_NOT_SUPPORTED for a code not in the table, and turns an exception from the
error hierarchy (or a body that does not decode) into its response code, so handlers raise
rather than build error frames.

It is also the broker's one point of authentication and authorization: with ``auth`` given,
every request, whatever its code, first passes ``ServerAuth.before`` (orbitmq.auth), which
refuses it (NO_PERMISSION) or answers the user/ACL admin codes itself; no handler checks
permissions on its own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from orbitmq.auth.server import ServerAuth
from orbitmq.broker.consumer_processor import ConsumerProcessor
from orbitmq.broker.group_config_processor import GroupConfigProcessor
from orbitmq.broker.metrics import BrokerMetrics
from orbitmq.broker.pop.processor import PopProcessor
from orbitmq.broker.processor import BrokerProcessor
from orbitmq.broker.runtime_config import RuntimeConfigProcessor
from orbitmq.broker.timer_processor import TimerProcessor
from orbitmq.broker.transaction.processor import TransactionProcessor
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, ProtocolError
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame

if TYPE_CHECKING:
    from prometheus_client import Counter

    from orbitmq.net.connection import Connection, Reply

Handler = Callable[[Frame, "Connection"], Awaitable["Reply"]]
"""``await handler(frame, conn)``: the reply to one request (``conn`` is the connection it came
on: heartbeats bind consumers to it, a send records its peer as BORN_HOST)."""


def build_routes(
    messages: BrokerProcessor,
    consumers: ConsumerProcessor,
    group_configs: GroupConfigProcessor,
    pop: PopProcessor,
    timers: TimerProcessor,
    transactions: TransactionProcessor,
    runtime_config: RuntimeConfigProcessor,
) -> dict[RequestCode, Handler]:
    """Every request code the broker answers, with its handler (docs/protocol.md)."""
    return {
        # producing (processor.py)
        RequestCode.SEND_MESSAGE: messages.send,
        RequestCode.SEND_BATCH_MESSAGE: messages.send,
        RequestCode.END_TRANSACTION: transactions.end_transaction,  # transaction/processor.py
        RequestCode.RECALL_MESSAGE: timers.recall,  # timer_processor.py
        # pulling and reading (processor.py)
        RequestCode.PULL_MESSAGE: messages.pull,
        RequestCode.GET_MAX_OFFSET: messages.max_offset,
        RequestCode.GET_MIN_OFFSET: messages.min_offset,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: messages.offset_by_time,
        RequestCode.QUERY_MESSAGE: messages.query_message,
        RequestCode.VIEW_MESSAGE_BY_ID: messages.view_message,
        # topics and the broker (processor.py)
        RequestCode.UPDATE_AND_CREATE_TOPIC: messages.update_topic,
        RequestCode.DELETE_TOPIC_IN_BROKER: messages.delete_topic,
        RequestCode.GET_ALL_TOPIC_CONFIG: messages.all_topics,
        RequestCode.GET_TOPIC_STATS: messages.topic_stats,
        RequestCode.GET_BROKER_RUNTIME_INFO: messages.runtime_info,
        RequestCode.UPDATE_BROKER_CONFIG: runtime_config.update,  # runtime_config.py: allowlist
        RequestCode.GET_BROKER_CONFIG: runtime_config.get,
        # Pop consumption (pop/processor.py)
        RequestCode.POP_MESSAGE: pop.pop,
        RequestCode.ACK_MESSAGE: pop.ack,
        RequestCode.BATCH_ACK_MESSAGE: pop.batch_ack,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME: pop.change_invisible_time,
        # consumer groups: membership, offsets, locks, send-back, stats (consumer_processor.py)
        RequestCode.HEART_BEAT: consumers.heartbeat,
        RequestCode.UNREGISTER_CLIENT: consumers.unregister,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumers.consumer_list,
        RequestCode.GET_CONSUMER_CONNECTION_LIST: consumers.connection_list,
        RequestCode.GET_CONSUMER_GROUP_LIST: consumers.group_list,
        RequestCode.QUERY_CONSUMER_OFFSET: consumers.query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: consumers.update_offset,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: consumers.reset_offset,
        RequestCode.LOCK_BATCH_MQ: consumers.lock_batch,
        RequestCode.UNLOCK_BATCH_MQ: consumers.unlock_batch,
        RequestCode.CONSUMER_SEND_MSG_BACK: consumers.send_back,
        RequestCode.GET_CONSUME_STATS: consumers.consume_stats,
        # consumer-group configs and dead-letter reads (group_config_processor.py)
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: group_configs.update,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: group_configs.get_all,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: group_configs.delete,
        RequestCode.GET_DLQ_MESSAGES: group_configs.dlq_messages,
    }


EAGER_CODES = frozenset(
    int(c)
    for c in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE, RequestCode.PULL_MESSAGE)
)
"""The hot requests whose handlers start in the connection's read callback, without a task
(orbitmq.net.connection): their paths wait only on futures (the append, the fsync, replication,
the long poll, reader threads), never on ``asyncio.timeout`` or the current task."""


class Dispatcher:
    """Calls a request's handler from the route table; the one place errors become codes."""

    def __init__(
        self,
        routes: dict[RequestCode, Handler],
        metrics: BrokerMetrics,
        auth: ServerAuth | None = None,
    ) -> None:
        self.routes: dict[int, Handler] = {int(code): h for code, h in routes.items()}
        self.metrics = metrics
        self.auth = auth
        self.rmq = metrics.rmq
        self.watermark = metrics.watermark
        self._counted: dict[int, Counter] = {}
        """Request code -> its child of ``metrics.requests`` (``labels()`` costs more than the
        increment, on every request)."""

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        counter = self._counted.get(frame.code)
        if counter is None:
            counter = self._counted[frame.code] = self.metrics.requests.labels(str(frame.code))
        counter.inc()
        started = time.perf_counter()
        slot = self.watermark.enter(frame.code)
        try:
            if self.auth is not None:
                answer = self.auth.before(frame, conn)
                if answer is not None:
                    if answer.code != ResponseCode.SUCCESS:
                        self.metrics.errors.labels(str(int(answer.code))).inc()
                        await self.auth.penalize(answer, conn)
                    return answer
            handler = self.routes.get(frame.code)
            if handler is None:
                return frame.reply(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f"request code {frame.code} not supported",
                )
            reply = await handler(frame, conn)
        except (MQError, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            code = exc.code if isinstance(exc, MQError) else ResponseCode.MESSAGE_ILLEGAL
            if isinstance(exc, ProtocolError):
                code = ResponseCode.MESSAGE_ILLEGAL
            self.metrics.errors.labels(str(int(code))).inc()
            reply = frame.reply(code, str(exc) or type(exc).__name__)
        finally:
            self.watermark.leave(slot)
            held = id(frame) in self.rmq.suspended  # long-polled (unmarked even if cancelled)
            self.rmq.suspended.discard(id(frame))
        if reply is not None:  # a oneway request has no response code
            answer = reply[0] if isinstance(reply, tuple) else reply
            self.rmq.on_rpc(frame.code, answer.code, (time.perf_counter() - started) * 1000, held)
        return reply
