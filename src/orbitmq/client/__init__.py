"""Producer, consumers and admin client. Talks to services only through protocol and net.

Every client comes as a pair named one way: ``AsyncX`` runs on the caller's event loop and ``X``
is the blocking one, the async one on a private event loop thread (``AsyncProducer`` /
``Producer``, ``AsyncPushConsumer`` / ``PushConsumer``, ``AsyncLitePullConsumer`` /
``LitePullConsumer``, ``AsyncSimpleConsumer`` / ``SimpleConsumer``,
``AsyncTransactionProducer`` / ``TransactionProducer``), except the admin client, whose wave-1
name stays: ``AdminClient`` is the async one (``AsyncAdminClient`` is the same class) and
``BlockingAdminClient`` the blocking one.
Both take the same config object (``ProducerConfig``, ``PushConfig``, ``LitePullConfig``,
``SimpleConfig``, ``TransactionConfig``, ``AdminConfig``) as ``config=``, or keyword overrides of
its fields (``AsyncProducer(ns, linger_ms=0)``; both: the config with those fields replaced); an
unknown keyword is a TypeError naming it.

Names are imported on first use (PEP 562): a process that needs only the route cache or the
admin client (a Spark worker, the streaming runner Spark starts per query) does not pay for
importing every consumer. ``from orbitmq.client import Producer`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbitmq.client.admin.client import AdminClient, AsyncAdminClient, BlockingAdminClient
    from orbitmq.client.admin.config import AdminConfig
    from orbitmq.client.admin.types import PullResult, PullStatus, TopicDescription
    from orbitmq.client.allocate import (
        AllocateAveragely,
        AllocateAveragelyByCircle,
        AllocateByConfig,
        AllocateConsistentHash,
        AllocateStrategy,
    )
    from orbitmq.client.consumer.config import (
        ConsumerConfig,
        LitePullConfig,
        PushConfig,
        SimpleConfig,
    )
    from orbitmq.client.consumer.lite_pull import AsyncLitePullConsumer, LitePullConsumer
    from orbitmq.client.consumer.push import AsyncPushConsumer, PushConsumer
    from orbitmq.client.consumer.simple import (
        AsyncSimpleConsumer,
        ExpiredReceiptHandleError,
        InvalidReceiptHandleError,
        SimpleConsumer,
    )
    from orbitmq.client.consumer.subscription import Subscription
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
    from orbitmq.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
    from orbitmq.client.process_queue import ProcessQueue
    from orbitmq.client.producer.blocking import Producer
    from orbitmq.client.producer.config import ProducerConfig
    from orbitmq.client.producer.producer import AsyncProducer
    from orbitmq.client.producer.types import (
        MessageQueueSelector,
        SendCallback,
        SendResult,
        SendStatus,
        hash_selector,
    )
    from orbitmq.client.rebalance import RebalanceService
    from orbitmq.client.recall import recall_message
    from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
    from orbitmq.client.transaction.blocking import TransactionProducer
    from orbitmq.client.transaction.producer import AsyncTransactionProducer
    from orbitmq.client.transaction.types import (
        EndResult,
        HalfBatchResult,
        LocalTransactionState,
        TransactionConfig,
        TransactionListener,
        TransactionSendResult,
    )
    from orbitmq.common.message import Message

_WHERE: dict[str, str] = {
    "AsyncAdminClient": "orbitmq.client.admin.client",
    "AllocateAveragely": "orbitmq.client.allocate",
    "AllocateAveragelyByCircle": "orbitmq.client.allocate",
    "AllocateByConfig": "orbitmq.client.allocate",
    "AllocateConsistentHash": "orbitmq.client.allocate",
    "AllocateStrategy": "orbitmq.client.allocate",
    "AsyncLitePullConsumer": "orbitmq.client.consumer.lite_pull",
    "AsyncProducer": "orbitmq.client.producer.producer",
    "AsyncPushConsumer": "orbitmq.client.consumer.push",
    "AsyncSimpleConsumer": "orbitmq.client.consumer.simple",
    "AsyncTransactionProducer": "orbitmq.client.transaction.producer",
    "BlockingAdminClient": "orbitmq.client.admin.client",
    "AdminClient": "orbitmq.client.admin.client",
    "AdminConfig": "orbitmq.client.admin.config",
    "ConsumeFromWhere": "orbitmq.client.consumer_types",
    "ConsumeResult": "orbitmq.client.consumer_types",
    "ConsumedMessage": "orbitmq.client.consumer_types",
    "ConsumerConfig": "orbitmq.client.consumer.config",
    "EndResult": "orbitmq.client.transaction.types",
    "ExpiredReceiptHandleError": "orbitmq.client.consumer.simple",
    "FaultStrategy": "orbitmq.client.fault",
    "HalfBatchResult": "orbitmq.client.transaction.types",
    "HeartbeatService": "orbitmq.client.heartbeat",
    "InvalidReceiptHandleError": "orbitmq.client.consumer.simple",
    "InvalidSubscriptionError": "orbitmq.client.heartbeat",
    "LitePullConfig": "orbitmq.client.consumer.config",
    "LitePullConsumer": "orbitmq.client.consumer.lite_pull",
    "LocalOffsetStore": "orbitmq.client.offset_store",
    "LocalTransactionState": "orbitmq.client.transaction.types",
    "Message": "orbitmq.common.message",
    "MessageModel": "orbitmq.client.consumer_types",
    "MessageQueue": "orbitmq.client.route",
    "MessageQueueSelector": "orbitmq.client.producer.types",
    "OffsetStore": "orbitmq.client.offset_store",
    "ProcessQueue": "orbitmq.client.process_queue",
    "Producer": "orbitmq.client.producer.blocking",
    "ProducerConfig": "orbitmq.client.producer.config",
    "PullResult": "orbitmq.client.admin.types",
    "PullStatus": "orbitmq.client.admin.types",
    "PushConfig": "orbitmq.client.consumer.config",
    "PushConsumer": "orbitmq.client.consumer.push",
    "RebalanceService": "orbitmq.client.rebalance",
    "ReceivedMessage": "orbitmq.client.consumer_types",
    "RemoteOffsetStore": "orbitmq.client.offset_store",
    "SendCallback": "orbitmq.client.producer.types",
    "SendResult": "orbitmq.client.producer.types",
    "SendStatus": "orbitmq.client.producer.types",
    "SimpleConfig": "orbitmq.client.consumer.config",
    "SimpleConsumer": "orbitmq.client.consumer.simple",
    "Subscription": "orbitmq.client.consumer.subscription",
    "TopicDescription": "orbitmq.client.admin.types",
    "TopicPublishInfo": "orbitmq.client.route",
    "TopicRouteCache": "orbitmq.client.route",
    "TransactionConfig": "orbitmq.client.transaction.types",
    "TransactionListener": "orbitmq.client.transaction.types",
    "TransactionProducer": "orbitmq.client.transaction.blocking",
    "TransactionSendResult": "orbitmq.client.transaction.types",
    "fifo_message": "orbitmq.client.fifo",
    "hash_selector": "orbitmq.client.producer.types",
    "message_group_selector": "orbitmq.client.fifo",
    "new_client_id": "orbitmq.client.consumer_types",
    "recall_message": "orbitmq.client.recall",
    "set_message_group": "orbitmq.client.fifo",
}
"""Each public name -> the module that defines it."""

__all__ = [
    "AdminClient",
    "AdminConfig",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "AsyncAdminClient",
    "AsyncLitePullConsumer",
    "AsyncProducer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "AsyncTransactionProducer",
    "BlockingAdminClient",
    "ConsumeFromWhere",
    "ConsumeResult",
    "ConsumedMessage",
    "ConsumerConfig",
    "EndResult",
    "ExpiredReceiptHandleError",
    "FaultStrategy",
    "HalfBatchResult",
    "HeartbeatService",
    "InvalidReceiptHandleError",
    "InvalidSubscriptionError",
    "LitePullConfig",
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
    "PushConfig",
    "PushConsumer",
    "RebalanceService",
    "ReceivedMessage",
    "RemoteOffsetStore",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "SimpleConfig",
    "SimpleConsumer",
    "Subscription",
    "TopicDescription",
    "TopicPublishInfo",
    "TopicRouteCache",
    "TransactionConfig",
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
