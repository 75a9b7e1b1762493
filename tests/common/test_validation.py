from __future__ import annotations

import pytest

from orbitmq.common.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from orbitmq.common.validation import validate_bodies_and_properties, validate_topic


@pytest.mark.parametrize("topic", ["", "a" * 128, "has space", "dot.ted", "é", "a/b"])
def test_bad_topics(topic: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic(topic)


@pytest.mark.parametrize("topic", ["a", "a" * 127, "%RETRY%group", "A-b_c|9"])
def test_good_topics(topic: str) -> None:
    validate_topic(topic)


def test_body_and_properties_limits() -> None:
    with pytest.raises(EmptyBodyError):
        validate_bodies_and_properties([b"x", b""], [b"", b""])
    with pytest.raises(MessageTooLargeError):
        validate_bodies_and_properties([b"x" * 11], [b""], max_message_size=10)
    with pytest.raises(PropertiesTooLargeError):
        validate_bodies_and_properties([b"x"], [b"p" * 11], max_properties_size=10)
    assert issubclass(MessageTooLargeError, MessageIllegalError)
    validate_bodies_and_properties([b"x" * 10], [b"p" * 10], 10, 10)
