"""Producer, consumers and admin client. Talks to services only through protocol and net.

The blocking classes (:class:`Producer`, :class:`BlockingAdminClient`) run their async
counterparts (:class:`AsyncProducer`, :class:`AdminClient`) on a private event loop thread.
"""

from orbitmq.client.admin import (
    AdminClient,
    BlockingAdminClient,
    PullResult,
    PullStatus,
    TopicDescription,
)
from orbitmq.client.fault import FaultStrategy
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
from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
from orbitmq.common.message import Message

__all__ = [
    "AdminClient",
    "AsyncProducer",
    "BlockingAdminClient",
    "FaultStrategy",
    "Message",
    "MessageQueue",
    "MessageQueueSelector",
    "Producer",
    "ProducerConfig",
    "PullResult",
    "PullStatus",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "TopicDescription",
    "TopicPublishInfo",
    "TopicRouteCache",
    "hash_selector",
]
