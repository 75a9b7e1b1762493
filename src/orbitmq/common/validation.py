"""Limits every entry point enforces before anything is written (RocketMQ's TopicValidator rules).

One difference from RocketMQ: topic and group names may contain '.', because Kafka names commonly
do (``orders.v1``, group ``my.app``) and Kafka clients reach the same topics and offsets through
the Kafka gateway (docs/kafka.md). A name is a directory name in the store
(``consumequeue/<topic>``), so the names ``.`` and ``..`` are refused, and no allowed character is
a path separator.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orbitmq.common.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)

TOPIC_MAX_LENGTH = 127
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
DEFAULT_MAX_PROPERTIES_SIZE = 32 * 1024
_TOPIC_RE = re.compile(r"[A-Za-z0-9%|_+.-]+")
_DOTS = (".", "..")
"""Legal by the character rules, but a path component meaning this or the parent directory."""
GROUP_MAX_LENGTH = TOPIC_MAX_LENGTH - len("%RETRY%")
"""So that the group's retry topic (``%RETRY%<group>``) is still a valid topic name."""
_GROUP_RE = re.compile(r"[A-Za-z0-9%|_.-]+")
"""RocketMQ's characters; no '+', which separates group and topic in Pop retry topics."""


def validate_topic(topic: str) -> None:
    if not topic:
        raise InvalidTopicError("topic is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidTopicError(
            f"topic is {len(topic)} characters, the limit is {TOPIC_MAX_LENGTH}"
        )
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicError(f"topic {topic[:60]!r} uses characters outside [A-Za-z0-9%|_+.-]")
    if topic in _DOTS:
        raise InvalidTopicError(f"topic {topic!r} is not allowed ('.' and '..' are path names)")


def validate_group(group: str) -> None:
    """RocketMQ's group name rules plus '.', with a length that leaves room for the retry topic
    prefix."""
    if not group:
        raise MessageIllegalError("group is empty")
    if len(group) > GROUP_MAX_LENGTH:
        raise MessageIllegalError(
            f"group is {len(group)} characters, the limit is {GROUP_MAX_LENGTH}"
        )
    if not _GROUP_RE.fullmatch(group):
        raise MessageIllegalError(f"group {group[:60]!r} uses characters outside [A-Za-z0-9%|_.-]")
    if group in _DOTS:
        raise MessageIllegalError(f"group {group!r} is not allowed ('.' and '..' are path names)")


def validate_bodies_and_properties(
    bodies: Sequence[bytes],
    properties: Sequence[bytes],
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    max_properties_size: int = DEFAULT_MAX_PROPERTIES_SIZE,
) -> None:
    """Check a batch's columns. Raises on the first violation; callers write nothing then."""
    if len(bodies) != len(properties):
        raise ValueError("bodies and properties differ in length")
    if not bodies:
        raise EmptyBodyError("batch holds no message")
    sizes = list(map(len, bodies))
    if min(sizes) == 0:
        raise EmptyBodyError(f"message {sizes.index(0)} has an empty body")
    biggest = max(sizes)
    if biggest > max_message_size:
        raise MessageTooLargeError(
            f"message {sizes.index(biggest)} body is {biggest} bytes, limit {max_message_size}"
        )
    prop_max = max(map(len, properties))
    if prop_max > max_properties_size:
        raise PropertiesTooLargeError(
            f"properties are {prop_max} bytes encoded, limit {max_properties_size}"
        )
