"""Dead-letter messages as the admin client reads them, and how one is sent back.

A message lands in ``%DLQ%<group>`` when a consumer group failed it ``retry_max_times`` times
over (docs/retry-dlq.md). :meth:`orbitmq.client.AsyncAdminClient.dlq_messages` reads the DLQs of
every master; :meth:`DlqMessage.resend_message` is the message to send to its original topic
(what ``orbitmq dlq resend`` does with a producer).
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.errors import ClientError
from orbitmq.common.message import DELIVERY_PROPERTIES, PROPERTY_KEYS, PROPERTY_TAGS, Message
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.consumer import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC
from orbitmq.protocol.group_config import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
)

__all__ = ["DlqMessage"]

_NOT_RESENT = DELIVERY_PROPERTIES | {
    PROPERTY_TAGS,
    PROPERTY_KEYS,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_REASON,
    "POP_CK",
}
"""Bookkeeping of retries, the DLQ, the timer and transactions: not part of the message."""


@dataclass(frozen=True, slots=True)
class DlqMessage:
    """One dead-lettered copy, on the broker ``broker_name``."""

    broker_name: str
    message: StoredMessage

    @property
    def group(self) -> str:
        return self.message.topic.removeprefix("%DLQ%")

    @property
    def origin_topic(self) -> str:
        """The topic the message was first sent to ("" if the copy does not say)."""
        props = self.message.properties
        return props.get(PROPERTY_DLQ_ORIGIN_TOPIC) or props.get(PROPERTY_RETRY_TOPIC) or ""

    @property
    def origin_msg_id(self) -> str:
        """The message's id (the same across its deliveries and copies)."""
        props = self.message.properties
        return (
            props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID)
            or props.get(PROPERTY_ORIGIN_MESSAGE_ID)
            or self.message.msg_id
            or ""
        )

    @property
    def reconsume_times(self) -> int:
        """The reconsume count of the delivery that failed last."""
        return self.message.reconsume_times

    @property
    def reason(self) -> str:
        """max_reconsume_times | orderly | pop ("" for a copy made before reasons existed)."""
        return self.message.properties.get(PROPERTY_DLQ_REASON, "")

    @property
    def queue_offset(self) -> int:
        return self.message.queue_offset

    def resend_message(self) -> Message:
        """The message as it was sent: original topic, body, tags, keys and user properties,
        and the same unique id, so its trail (``message`` lookups, consumer logs) continues."""
        topic = self.origin_topic
        if not topic:
            raise ClientError(f"DLQ message {self.origin_msg_id} does not name its original topic")
        m = self.message
        props = {k: v for k, v in m.properties.items() if k not in _NOT_RESENT}
        return Message(topic, m.body, tags=m.tags, keys=m.keys, properties=props, flag=m.flag)
