"""Limits of request fields (one home each) and the annotated field types that carry them.

The typed headers (``orbitmq.protocol.requests``) declare their fields with these types, so a limit
is written once and read by the client that builds a request, the server that checks it and the
generated tables of docs/protocol.md. Limits on bodies (batch ack, offsets, lock) live here too,
beside the header limits, for the handlers that check a body.
"""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta

from orbitmq.common.errors import InvalidTopicError
from orbitmq.common.validation import validate_topic
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.header import I64_MAX, I64_MIN

# ---------------------------------------------------------------------- limits (one home each)

I32_MAX = 2**31 - 1
MAX_QUEUE_ID = 1 << 30
"""Queue ids in a send, pull, pop or DLQ read are at most this."""
MAX_PULL_MESSAGES_UNFILTERED = 16384
MAX_PULL_MESSAGES = 1024
"""A filtered pull (tags or expression) returns at most this many records, whatever it asks."""
MAX_PULL_BYTES = 16 * 1024 * 1024
DEFAULT_PULL_BYTES = 4 * 1024 * 1024
MAX_QUERY_MESSAGES = 1024
MAX_POP_MESSAGES = 1024
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_POLL_MS = 2**31
MAX_BATCH_ACK = 4096
"""Receipt handles in one BATCH_ACK_MESSAGE body."""
MAX_DLQ_READ = 256
MAX_OFFSETS_PER_COMMIT = 65_536
"""Offsets in one UPDATE_CONSUMER_OFFSET body."""
MAX_LOCK_QUEUES = 4_096
"""Queues in one LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body."""
MAX_MSG_ID_LENGTH = 128
NAME_MAX_LENGTH = 127
MAX_BROKER_ID = 2**63 - 1
FAR_FUTURE_MS = 2**62

# ---------------------------------------------------------------------- field types

_NAME_RE = re.compile(r"[A-Za-z0-9._%|:@+-]+")
_HOST_RE = re.compile(r"[A-Za-z0-9._:\[\]-]{1,253}")
_PORT_RE = re.compile(r"[0-9]{1,5}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_name(field: str, value: str) -> None:
    if len(value) > NAME_MAX_LENGTH or not _NAME_RE.fullmatch(value):
        raise FieldError(
            f"field {field!r} = {_short(value)} must be 1-{NAME_MAX_LENGTH} characters"
            " from [A-Za-z0-9._%|:@+-]"
        )


def _check_addr(field: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if (
        not sep
        or not _HOST_RE.fullmatch(host)
        or not _PORT_RE.fullmatch(port)
        or not 0 < int(port) < 65536
    ):
        raise FieldError(f"field {field!r} = {_short(value)} is not host:port")


def _check_topic(_field: str, value: str) -> None:
    try:
        validate_topic(value)
    except InvalidTopicError as exc:  # the same code and remark, as the FieldError decode raises
        raise FieldError(str(exc)) from None


Name = Annotated[
    str, Meta(extra={"check": _check_name}, description="1-127 of [A-Za-z0-9._%|:@+-]")
]
Addr = Annotated[str, Meta(extra={"check": _check_addr}, description="host:port, port 1-65535")]
Topic = Annotated[str, Meta(extra={"check": _check_topic}, description="a valid topic name")]
BrokerId = Annotated[int, Meta(ge=0, le=MAX_BROKER_ID, description="0 = master")]
QueueId = Annotated[int, Meta(ge=0, le=MAX_QUEUE_ID)]
AnyQueueId = Annotated[int, Meta(ge=-1, le=MAX_QUEUE_ID, description="any queue")]
I64 = Annotated[int, Meta(ge=I64_MIN, le=I64_MAX)]
"""Any msgpack signed integer: every int field states its bounds (header.py)."""
Offset = Annotated[int, Meta(ge=0, le=I64_MAX)]
Millis = Annotated[int, Meta(ge=0, le=I64_MAX)]
InvisibleMs = Annotated[int, Meta(ge=MIN_INVISIBLE_MS, le=MAX_INVISIBLE_MS)]
Times = Annotated[int, Meta(ge=-1, le=I32_MAX)]
