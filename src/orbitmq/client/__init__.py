"""Producer, consumers and admin client. Talks to services only through protocol and net.

The blocking classes (:class:`Producer`, :class:`PushConsumer`, :class:`LitePullConsumer`,
:class:`SimpleConsumer`, :class:`BlockingAdminClient`) run their async counterparts
(:class:`AsyncProducer`, :class:`AsyncPushConsumer`, :class:`AsyncLitePullConsumer`,
:class:`AsyncSimpleConsumer`, :class:`AdminClient`) on a private event loop thread.

Names are imported on first use (PEP 562): a process that needs only the route cache or the
admin client (a Spark worker, the streaming runner Spark starts per query) does not pay for
importing every consumer. ``from orbitmq.client import Producer`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbitmq.client.admin import (
        AdminClient,
        BlockingAdminClient,
        PullResult,
        PullStatus,
        TopicDescription,
    )
    from orbitmq.client.allocate import (
        AllocateAveragely,
        AllocateAveragelyByCircle,
        AllocateByConfig,
        AllocateConsistentHash,
        AllocateStrategy,
    )
    from orbitmq.client.consumer_types import (
        ConsumedMessage,
        ConsumeFromWhere,
        ConsumeResult,
        MessageModel,
        ReceivedMessage,
        new_client_id,
    )
    from orbitmq.client.fault import FaultStrategy
    from orbitmq.client.fifo import fifo_message, message_group_selector, set_message_group
    from orbitmq.client.heartbeat import HeartbeatService, InvalidSubscriptionError
    from orbitmq.client.lite_pull_consumer import AsyncLitePullConsumer, LitePullConsumer
    from orbitmq.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
    from orbitmq.client.process_queue import ProcessQueue
    from orbitmq.client.producer import (
        AsyncProducer,
        MessageQueueSelector,
        Producer,
        ProducerConfig,
        SendCallback,
        SendResult,
        SendStatus,
        hash_selector,
    )
    from orbitmq.client.push_consumer import AsyncPushConsumer, PushConsumer
    from orbitmq.client.rebalance import RebalanceService
    from orbitmq.client.recall import recall_message
    from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
    from orbitmq.client.simple_consumer import (
        AsyncSimpleConsumer,
        ExpiredReceiptHandleError,
        InvalidReceiptHandleError,
        SimpleConsumer,
    )
    from orbitmq.client.transaction import (
        AsyncTransactionProducer,
        EndResult,
        HalfBatchResult,
        LocalTransactionState,
        TransactionListener,
        TransactionProducer,
        TransactionSendResult,
    )
    from orbitmq.common.message import Message

_WHERE: dict[str, str] = {
    "AdminClient": "orbitmq.client.admin",
    "AllocateAveragely": "orbitmq.client.allocate",
    "AllocateAveragelyByCircle": "orbitmq.client.allocate",
    "AllocateByConfig": "orbitmq.client.allocate",
    "AllocateConsistentHash": "orbitmq.client.allocate",
    "AllocateStrategy": "orbitmq.client.allocate",
    "AsyncLitePullConsumer": "orbitmq.client.lite_pull_consumer",
    "AsyncProducer": "orbitmq.client.producer",
    "AsyncPushConsumer": "orbitmq.client.push_consumer",
    "AsyncSimpleConsumer": "orbitmq.client.simple_consumer",
    "AsyncTransactionProducer": "orbitmq.client.transaction",
    "BlockingAdminClient": "orbitmq.client.admin",
    "ConsumeFromWhere": "orbitmq.client.consumer_types",
    "ConsumeResult": "orbitmq.client.consumer_types",
    "ConsumedMessage": "orbitmq.client.consumer_types",
    "EndResult": "orbitmq.client.transaction",
    "ExpiredReceiptHandleError": "orbitmq.client.simple_consumer",
    "FaultStrategy": "orbitmq.client.fault",
    "HalfBatchResult": "orbitmq.client.transaction",
    "HeartbeatService": "orbitmq.client.heartbeat",
    "InvalidReceiptHandleError": "orbitmq.client.simple_consumer",
    "InvalidSubscriptionError": "orbitmq.client.heartbeat",
    "LitePullConsumer": "orbitmq.client.lite_pull_consumer",
    "LocalOffsetStore": "orbitmq.client.offset_store",
    "LocalTransactionState": "orbitmq.client.transaction",
    "Message": "orbitmq.common.message",
    "MessageModel": "orbitmq.client.consumer_types",
    "MessageQueue": "orbitmq.client.route",
    "MessageQueueSelector": "orbitmq.client.producer",
    "OffsetStore": "orbitmq.client.offset_store",
    "ProcessQueue": "orbitmq.client.process_queue",
    "Producer": "orbitmq.client.producer",
    "ProducerConfig": "orbitmq.client.producer",
    "PullResult": "orbitmq.client.admin",
    "PullStatus": "orbitmq.client.admin",
    "PushConsumer": "orbitmq.client.push_consumer",
    "RebalanceService": "orbitmq.client.rebalance",
    "ReceivedMessage": "orbitmq.client.consumer_types",
    "RemoteOffsetStore": "orbitmq.client.offset_store",
    "SendCallback": "orbitmq.client.producer",
    "SendResult": "orbitmq.client.producer",
    "SendStatus": "orbitmq.client.producer",
    "SimpleConsumer": "orbitmq.client.simple_consumer",
    "TopicDescription": "orbitmq.client.admin",
    "TopicPublishInfo": "orbitmq.client.route",
    "TopicRouteCache": "orbitmq.client.route",
    "TransactionListener": "orbitmq.client.transaction",
    "TransactionProducer": "orbitmq.client.transaction",
    "TransactionSendResult": "orbitmq.client.transaction",
    "fifo_message": "orbitmq.client.fifo",
    "hash_selector": "orbitmq.client.producer",
    "message_group_selector": "orbitmq.client.fifo",
    "new_client_id": "orbitmq.client.consumer_types",
    "recall_message": "orbitmq.client.recall",
    "set_message_group": "orbitmq.client.fifo",
}
"""Each public name -> the module that defines it."""

__all__ = [
    "AdminClient",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "AsyncLitePullConsumer",
    "AsyncProducer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "AsyncTransactionProducer",
    "BlockingAdminClient",
    "ConsumeFromWhere",
    "ConsumeResult",
    "ConsumedMessage",
    "EndResult",
    "ExpiredReceiptHandleError",
    "FaultStrategy",
    "HalfBatchResult",
    "HeartbeatService",
    "InvalidReceiptHandleError",
    "InvalidSubscriptionError",
    "LitePullConsumer",
    "LocalOffsetStore",
    "LocalTransactionState",
    "Message",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "OffsetStore",
    "ProcessQueue",
    "Producer",
    "ProducerConfig",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "RebalanceService",
    "ReceivedMessage",
    "RemoteOffsetStore",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TopicDescription",
    "TopicPublishInfo",
    "TopicRouteCache",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "fifo_message",
    "hash_selector",
    "message_group_selector",
    "new_client_id",
    "recall_message",
    "set_message_group",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
