from __future__ import annotations

import pytest

from orbitmq.common.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from orbitmq.common.validation import (
    GROUP_MAX_LENGTH,
    validate_bodies_and_properties,
    validate_group,
    validate_topic,
)

# "." and ".." pass the character rule but would be this or the parent directory in the store
_NOT_A_NAME = ["", ".", "..", "a/b", "../a", "a\\b", "a\0b", "has space", "é", "a:b"]


@pytest.mark.parametrize("topic", [*_NOT_A_NAME, "a" * 128])
def test_bad_topics(topic: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic(topic)


# dots are allowed (Kafka names: docs/kafka.md), unlike RocketMQ
@pytest.mark.parametrize(
    "topic", ["a", "a" * 127, "%RETRY%group", "A-b_c|9", "dot.ted", "orders.v1", "...", ".a", "a."]
)
def test_good_topics(topic: str) -> None:
    validate_topic(topic)


@pytest.mark.parametrize("group", [*_NOT_A_NAME, "a+b", "a" * (GROUP_MAX_LENGTH + 1)])
def test_bad_groups(group: str) -> None:
    with pytest.raises(MessageIllegalError):
        validate_group(group)


@pytest.mark.parametrize("group", ["g", "my.app", "A-b_c|9%", "a" * GROUP_MAX_LENGTH, "..."])
def test_good_groups_and_their_retry_topics(group: str) -> None:
    validate_group(group)
    validate_topic("%RETRY%" + group)
    validate_topic("%DLQ%" + group)


def test_body_and_properties_limits() -> None:
    with pytest.raises(EmptyBodyError):
        validate_bodies_and_properties([b"x", b""], [b"", b""])
    with pytest.raises(MessageTooLargeError):
        validate_bodies_and_properties([b"x" * 11], [b""], max_message_size=10)
    with pytest.raises(PropertiesTooLargeError):
        validate_bodies_and_properties([b"x"], [b"p" * 11], max_properties_size=10)
    assert issubclass(MessageTooLargeError, MessageIllegalError)
    validate_bodies_and_properties([b"x" * 10], [b"p" * 10], 10, 10)
