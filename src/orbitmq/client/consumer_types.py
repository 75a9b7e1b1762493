"""Types every consumer shares: what a listener returns, group settings, delivered messages,
and client ids.
"""

from __future__ import annotations

import enum
import os
import secrets
import socket
from dataclasses import dataclass

from orbitmq.client.route import MessageQueue
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.consumer import PROPERTY_RETRY_TOPIC

__all__ = [
    "ConsumeFromWhere",
    "ConsumeResult",
    "ConsumedMessage",
    "MessageModel",
    "ReceivedMessage",
    "new_client_id",
]


class ConsumeResult(enum.Enum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    """Concurrent listeners: send the messages back for another delivery (via the group's
    retry topic). Orderly listeners: suspend the queue a moment and retry in place."""


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    """Each message goes to one member of the group; offsets are kept by the broker."""
    BROADCASTING = "BROADCASTING"
    """Each member gets every message; offsets are kept locally by each client."""


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts in a queue."""

    LAST_OFFSET = "LAST_OFFSET"
    FIRST_OFFSET = "FIRST_OFFSET"
    TIMESTAMP = "TIMESTAMP"


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """A message handed to a listener or returned by poll."""

    message: StoredMessage
    queue: MessageQueue
    """Where it was read (for a retried message: the retry queue)."""

    @property
    def topic(self) -> str:
        """The topic it was sent to (a retried message reports its original topic)."""
        return self.message.properties.get(PROPERTY_RETRY_TOPIC) or self.message.topic

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def tags(self) -> str | None:
        return self.message.tags

    @property
    def keys(self) -> list[str]:
        return self.message.keys

    @property
    def properties(self) -> dict[str, str]:
        return self.message.properties

    @property
    def msg_id(self) -> str | None:
        return self.message.msg_id

    @property
    def queue_offset(self) -> int:
        return self.message.queue_offset

    @property
    def reconsume_times(self) -> int:
        return self.message.reconsume_times


@dataclass(frozen=True, slots=True)
class ReceivedMessage(ConsumedMessage):
    """A message received by a SimpleConsumer (Pop): acked, or changed, by its receipt handle."""

    receipt_handle: str
    broker_addr: str
    """The broker that handed it out: acks go there."""
    invisible_until_ms: int
    """Wall-clock time after which, unless acked, it is delivered again."""

    @property
    def delivery_attempt(self) -> int:
        return self.message.reconsume_times + 1


def new_client_id(instance_name: str | None = None) -> str:
    """A client id unique even across containers with the same hostname and pid 1.

    ``ip@pid@instance@random``: RocketMQ's ``ip@pid`` alone collides in Docker/Kubernetes
    (apache/rocketmq#1547), which breaks rebalancing; the random part makes it unique.
    """
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    name = instance_name or "DEFAULT"
    return f"{ip}@{os.getpid()}@{name}@{secrets.token_hex(4)}"
