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
