"""Turning a Message into what goes on the wire: validated, with its unique id, maybe compressed.

Every message gets its unique id (UNIQ_CLIENT_MESSAGE_ID_KEYIDX) here, before it is sent, so a
SendResult's ``msg_id`` is the id the broker stores and indexes. A body larger than
``compress_over_bytes`` is zstd-compressed and flagged ``SYSFLAG_COMPRESSED |
SYSFLAG_COMPRESSION_ZSTD``; the flag is per send frame, so compressed and plain messages never
share a batch.

Pure and thread-safe: the blocking Producer prepares in the caller's thread, so a bad message
raises there and compression runs off the I/O thread. ``make`` lets it build its own subclass
(a PreparedMessage that is also the message's future, :mod:`.handoff`): one object per message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orbitmq.client import _codec
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import (
    EmptyBodyError,
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from orbitmq.common.ids import default_generator
from orbitmq.common.message import PROPERTY_UNIQ_KEY, Message, encode_properties
from orbitmq.common.validation import DEFAULT_MAX_PROPERTIES_SIZE, validate_topic

__all__ = ["MessagePreparer", "PreparedMessage"]

_SEND_ITEM_OVERHEAD = 6  # u32 body length + u16 properties length in a send body
_UNIQ_PREFIX = PROPERTY_UNIQ_KEY.encode() + b"\x01"


@dataclass(slots=True)
class PreparedMessage:
    """A message ready for the wire. ``msg`` is the user's Message until the accumulator has
    routed it (a selector may need it), then None: an unanswered message then holds no object
    the cyclic GC must walk but this one (the producer's buffer may hold tens of thousands)."""

    msg: Message | None
    body: bytes
    props: bytes
    msg_id: str
    sys_flag: int
    topic: str
    flag: int

    @property
    def size(self) -> int:
        return len(self.body) + len(self.props) + _SEND_ITEM_OVERHEAD


class MessagePreparer:
    """Validates and encodes messages under one producer's config."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._valid_topics: set[str] = set()

    def prepare(
        self,
        msg: Message,
        *,
        compress: bool | None = None,
        make: Callable[..., PreparedMessage] = PreparedMessage,
    ) -> PreparedMessage:
        """Validate, assign the unique id, encode properties and maybe compress
        (``compress``: None by size, True always, False never); ``make`` builds the result from
        PreparedMessage's fields (a subclass's constructor)."""
        topic = msg.topic
        if topic not in self._valid_topics:
            validate_topic(topic)
            if len(self._valid_topics) < 10_000:
                self._valid_topics.add(topic)
        body = msg.body if type(msg.body) is bytes else bytes(msg.body)
        if not body:
            raise EmptyBodyError("a message must carry a body of at least one byte")
        threshold = self.config.compress_over_bytes
        limit = self.config.max_message_size
        if not (msg.properties or msg.tags or msg.keys or compress) and (
            threshold < 0 or len(body) <= threshold
        ):
            # The common case, kept short: only the unique id to encode.
            if len(body) > limit:
                raise MessageTooLargeError(f"body is {len(body)} bytes, limit {limit}")
            new_id = default_generator.next_id()
            props = _UNIQ_PREFIX + new_id.encode() + b"\x02"
            return make(msg, body, props, new_id, 0, topic, msg.flag)
        props_map = msg.system_properties()
        msg_id = props_map.get(PROPERTY_UNIQ_KEY)
        if not msg_id:
            msg_id = props_map[PROPERTY_UNIQ_KEY] = default_generator.next_id()
        props = encode_properties(props_map)
        n = len(props_map)
        if props.count(b"\x01") != n or props.count(b"\x02") != n:
            raise MessageIllegalError("property names and values may not contain \\x01 or \\x02")
        if len(props) > DEFAULT_MAX_PROPERTIES_SIZE:
            raise PropertiesTooLargeError(
                f"properties are {len(props)} bytes encoded, limit {DEFAULT_MAX_PROPERTIES_SIZE}"
            )
        item = make(msg, body, props, msg_id, 0, topic, msg.flag)
        if compress or (compress is None and 0 <= threshold < len(body)):
            self.compress(item, force=bool(compress))
        if len(item.body) > limit:
            raise MessageTooLargeError(
                f"body is {len(item.body)} bytes"
                f"{' compressed' if item.sys_flag else ''}, limit {limit}"
            )
        return item

    def compress(self, item: PreparedMessage, *, force: bool) -> None:
        """zstd the body in place (``force``: even when it does not get smaller)."""
        packed = _codec.compress(item.body, self.config.compress_level)
        if force or len(packed) < len(item.body):
            item.body = packed
            item.sys_flag |= _codec.ZSTD_FLAGS
