"""Producer, consumers and admin client. Talks to services only through protocol and net.

The blocking classes (:class:`Producer`, :class:`PushConsumer`, :class:`LitePullConsumer`,
:class:`SimpleConsumer`, :class:`BlockingAdminClient`) run their async counterparts
(:class:`AsyncProducer`, :class:`AsyncPushConsumer`, :class:`AsyncLitePullConsumer`,
:class:`AsyncSimpleConsumer`, :class:`AdminClient`) on a private event loop thread.
"""

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
from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
from orbitmq.client.simple_consumer import (
    AsyncSimpleConsumer,
    ExpiredReceiptHandleError,
    InvalidReceiptHandleError,
    SimpleConsumer,
)
from orbitmq.common.message import Message

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
    "BlockingAdminClient",
    "ConsumeFromWhere",
    "ConsumeResult",
    "ConsumedMessage",
    "ExpiredReceiptHandleError",
    "FaultStrategy",
    "HeartbeatService",
    "InvalidReceiptHandleError",
    "InvalidSubscriptionError",
    "LitePullConsumer",
    "LocalOffsetStore",
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
    "hash_selector",
    "new_client_id",
]
