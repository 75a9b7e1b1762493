"""What push send-back and Pop revive share: the properties of a retry or dead-letter copy,
the dead-letter rule, and the group's dead-letter topic.

A failed message is copied, never moved: the original stays where it was (its queue's offset
moves past it), the copy goes either to a retry topic through the timer (due after the group's
backoff) or, once it has been redelivered ``retry_max_times`` times, to ``%DLQ%<group>``.

The DLQ topic is created on demand with one queue and **write permission only** (RocketMQ's
choice): a consumer that subscribes to it gets NO_PERMISSION on pull and pop, so nothing drains
it by accident. Admin tools read it with GET_DLQ_MESSAGES, which ignores the read permission;
an operator who wants to consume it normally grants read with ``orbitmq topic update``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from orbitmq.common.errors import DeadLetterNotWritableError
from orbitmq.common.message import (
    DELIVERY_PROPERTIES,
)
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.bodies import PERM_WRITE, TopicConfig
from orbitmq.protocol.consumer import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
)
from orbitmq.protocol.group_config import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
)

if TYPE_CHECKING:
    from orbitmq.broker.controller import BrokerController

log = logging.getLogger(__name__)

DLQ_PERM = PERM_WRITE
"""Permission of an auto-created DLQ topic: appendable by the broker, not pullable."""

DROPPED_ON_COPY = DELIVERY_PROPERTIES | {PROPERTY_POP_CK}
"""Properties that described the original delivery (its delay, the timer's bookkeeping, its
transaction, its Pop handle), not the copy's: the timer sets its own for the retry."""


def first_topic(msg: StoredMessage, fallback: str | None = None) -> str:
    """The topic a message (or any retry copy of it) was first sent to."""
    return msg.properties.get(PROPERTY_RETRY_TOPIC) or fallback or msg.topic


def copy_properties(
    msg: StoredMessage, origin_topic: str, *, dlq_reason: str | None = None
) -> dict[str, str]:
    """Properties of a retry copy (``dlq_reason`` None) or a dead-letter copy of ``msg``.

    RETRY_TOPIC and ORIGIN_MESSAGE_ID name the first topic and the first id (kept when already
    set: a retry of a retry still names the original); a DLQ copy adds DLQ_ORIGIN_TOPIC,
    DLQ_ORIGIN_MESSAGE_ID and DLQ_REASON. The unique id (UNIQ_KEY) stays the same throughout.
    """
    props = {k: v for k, v in msg.properties.items() if k not in DROPPED_ON_COPY}
    props[PROPERTY_RETRY_TOPIC] = origin_topic
    if msg.msg_id:
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.msg_id)
    if dlq_reason is not None:
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = origin_topic
        origin_id = props.get(PROPERTY_ORIGIN_MESSAGE_ID)
        if origin_id:
            props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
        props[PROPERTY_DLQ_REASON] = dlq_reason
    return props


def exhausted(reconsume_times: int, max_times: int) -> bool:
    """A message delivered ``reconsume_times`` times after its first delivery that failed again
    has used up its retries (RocketMQ: ``reconsumeTimes >= maxReconsumeTimes``)."""
    return reconsume_times >= max_times


async def ensure_dlq_topic(broker: BrokerController, group: str) -> TopicConfig:
    """The group's DLQ topic, created (1 queue, write-only) if missing."""
    name = dlq_topic(group)
    config = broker.topics.get(name)
    if config is None:
        config = TopicConfig(topic_name=name, read_queue_nums=1, write_queue_nums=1, perm=DLQ_PERM)
        config = await asyncio.to_thread(broker.topics.upsert, config)
        broker.apply_retention(config)
        broker.topics_changed()
        log.info("created dead-letter topic %s", name)
    if not config.perm & PERM_WRITE or not broker.writable:
        raise DeadLetterNotWritableError(f"dead-letter topic {name} is not writable here")
    return config
