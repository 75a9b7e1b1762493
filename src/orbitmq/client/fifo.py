"""FIFO message groups on the producer side (docs/fifo.md).

A message group (RocketMQ 5's ``messageGroup``, the ``__SHARDINGKEY`` property) names the
messages that must be consumed in the order they were sent. The broker keeps that order per
queue, so every message of a group has to land in the same queue: a producer sending a message
that carries a group, with no explicit queue or selector, picks the queue with
:func:`message_group_selector` (CRC32C of the group modulo the number of writable queues,
stable across processes and runs, and the same as ``hash_selector`` with the group as key).

The order of a group is the order of its sends *from one producer*, one at a time or through
``send_async`` (which keeps one batch per queue in flight). While the topic's queue count
stays the same a group keeps its queue; changing the number of queues moves groups (as in
RocketMQ), so do that while no group has messages in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import crc32c

from orbitmq.client.route import MessageQueue
from orbitmq.common.errors import ClientError, MessageIllegalError
from orbitmq.common.message import PROPERTY_SHARDING_KEY, Message

__all__ = [
    "MAX_MESSAGE_GROUP_LENGTH",
    "check_batch_groups",
    "fifo_message",
    "message_group_of",
    "message_group_selector",
    "selector_for",
    "set_message_group",
]

MAX_MESSAGE_GROUP_LENGTH = 64
"""RocketMQ 5's default ``maxMessageGroupSize``."""


def _check_group(group: object) -> str:
    if not isinstance(group, str) or not group:
        raise MessageIllegalError("a message group is a non-empty string")
    if len(group) > MAX_MESSAGE_GROUP_LENGTH:
        raise MessageIllegalError(
            f"message group is {len(group)} characters, the limit is {MAX_MESSAGE_GROUP_LENGTH}"
        )
    if any(ord(c) < 0x20 for c in group):
        raise MessageIllegalError("a message group may not contain control characters")
    return group


def set_message_group(msg: Message, group: str) -> Message:
    """Put ``msg`` in message group ``group`` (the ``__SHARDINGKEY`` property); returns it."""
    msg.properties[PROPERTY_SHARDING_KEY] = _check_group(group)
    return msg


def fifo_message(
    topic: str,
    body: bytes,
    *,
    message_group: str,
    tags: str | None = None,
    keys: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
) -> Message:
    """A :class:`Message` in ``message_group``: ``producer.send(fifo_message("T", b"..",
    message_group="order-42"))`` goes to the group's queue."""
    msg = Message(topic, body, tags=tags, keys=keys, properties=dict(properties or {}))
    return set_message_group(msg, message_group)


def message_group_of(msg: Message) -> str | None:
    return msg.properties.get(PROPERTY_SHARDING_KEY) or None


def message_group_selector(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """The queue of the message's group (``arg`` overrides the group when given)."""
    key = arg if arg is not None else message_group_of(msg)
    if key is None:
        raise ClientError("message_group_selector needs a message group (or an arg)")
    if not queues:
        raise ClientError(f"topic {msg.topic!r} has no writable queue")
    data = bytes(key) if isinstance(key, bytes | bytearray) else str(key).encode()
    return queues[int(crc32c.crc32c(data)) % len(queues)]


GroupSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def selector_for(msg: Message) -> GroupSelector | None:
    """The selector a send without queue or selector uses: the group's, or None (any queue)."""
    props = msg.properties
    return message_group_selector if props and props.get(PROPERTY_SHARDING_KEY) else None


def check_batch_groups(msgs: Iterable[Message]) -> None:
    """A batch goes to one queue: its messages must share one message group (or have none)."""
    groups = {message_group_of(m) for m in msgs}
    if len(groups) > 1:
        named = sorted(g for g in groups if g is not None)
        raise ClientError(
            f"send_batch: messages of different message groups ({', '.join(named[:5])}"
            f"{'' if None not in groups else ', and none'}) cannot share a batch: a batch goes "
            "to one queue, each group to its own"
        )
