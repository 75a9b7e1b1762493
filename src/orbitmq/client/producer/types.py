"""What a send returns and how a queue is chosen: SendResult, SendStatus, the selectors."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import crc32c

from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, registered_codes
from orbitmq.common.message import PROPERTY_SHARDING_KEY, Message

__all__ = [
    "STATUS_BY_CODE",
    "MessageQueueSelector",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "hash_selector",
]


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    """Stored, but not fsynced within the broker's sync-flush timeout."""
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


STATUS_BY_CODE: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    **{
        code: SendStatus[ResponseCode(code).name]  # a stored code without a status fails here
        for code, cls in registered_codes().items()
        if cls.stored
    },
}
"""Answers that mean the message is stored (SUCCESS, and every code whose error class is
``stored``), and the status each gives its SendResult."""


@dataclass(slots=True)
class SendResult:
    """The outcome of a send. Treat it as read-only. (Not a frozen dataclass on purpose: an
    automatic batch resolves hundreds per frame, and frozen construction costs 5x more.)"""

    status: SendStatus
    msg_id: str
    """The message's unique id (UNIQ_CLIENT_MESSAGE_ID_KEYIDX); for send_batch, all of the
    batch's ids joined with commas, as RocketMQ reports them."""
    message_queue: MessageQueue
    queue_offset: int
    """Offset in the queue's ConsumeQueue (send_batch: of the first message)."""
    offset: int
    """CommitLog offset (send_batch: of the first message). For the second and later messages
    of an automatic batch it is derived from record sizes, unless the broker reports each one;
    it is exact unless the batch crossed a CommitLog segment end."""
    msg_ids: tuple[str, ...] = ()
    """Every id of the send (one for a single message)."""


class MessageQueueSelector(Protocol):
    """Chooses the queue for a message: ``selector(queues, msg, arg) -> queue``.

    ``queues`` are the topic's writable queues, sorted by broker name and queue id, so a
    deterministic selector sends equal keys to the same queue while the route stays the same.
    """

    def __call__(
        self, queues: Sequence[MessageQueue], msg: Message, arg: Any, /
    ) -> MessageQueue: ...


def hash_selector(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Same sharding key -> same queue: CRC32C of the key modulo the number of queues.

    The key is ``arg``, else the message's ``__SHARDINGKEY`` property, else its first key.
    Stable across processes and runs (unlike ``hash()``).
    """
    key: Any = arg
    if key is None:
        key = msg.properties.get(PROPERTY_SHARDING_KEY) or (msg.keys[0] if msg.keys else None)
    if key is None:
        raise ClientError("hash_selector needs an arg, a __SHARDINGKEY property or a key")
    if not queues:
        raise ClientError(f"topic {msg.topic!r} has no writable queue")
    data = bytes(key) if isinstance(key, bytes | bytearray) else str(key).encode()
    return queues[int(crc32c.crc32c(data)) % len(queues)]


SendCallback = Callable[[SendResult | None, BaseException | None], None]
"""``callback(result, error)``: exactly one of the two is None."""
