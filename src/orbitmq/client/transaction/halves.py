"""Half messages on the wire: packing a transactional batch into one send body, and reading a
check-back's half message."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from orbitmq.client import _codec
from orbitmq.client.producer.types import SendResult
from orbitmq.client.transaction.types import (
    HALF_ONLY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    RESERVED_IN_BATCH,
    HalfBatchResult,
)
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    MessageIllegalError,
    PropertiesTooLargeError,
)
from orbitmq.common.ids import default_generator
from orbitmq.common.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    encode_properties,
)
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import DEFAULT_MAX_PROPERTIES_SIZE
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records

log = logging.getLogger(__name__)

__all__ = ["NO_PROPS", "UNIQ_PREFIX", "checked_message", "pack_columns", "topic_of"]

UNIQ_PREFIX = PROPERTY_UNIQ_KEY.encode() + b"\x01"
NO_PROPS = b""


def pack_columns(messages: Sequence[Message]) -> tuple[list[bytes], list[bytes], list[str]]:
    """Bodies, encoded properties and unique ids of a half batch's messages. Per message only
    what must be: ids come in one call, and a message without tags, keys or properties (the
    usual sink row) costs a list slot; its properties are just its id, added by the caller.
    Raises before anything is sent."""
    fresh = default_generator.next_ids(len(messages))
    bodies = [m.body if type(m.body) is bytes else bytes(m.body) for m in messages]
    if not all(bodies):
        raise EmptyBodyError(
            f"message {bodies.index(b'')} of the transactional batch has an empty body"
        )
    props: list[bytes] = [NO_PROPS] * len(messages)
    ids = fresh
    for k, m in enumerate(messages):
        if not (m.properties or m.tags or m.keys):
            continue
        if m.properties and not RESERVED_IN_BATCH.isdisjoint(m.properties):
            names = sorted(RESERVED_IN_BATCH.intersection(m.properties))
            raise ClientError(
                f"message {k} of a transactional batch carries {', '.join(names)}: "
                "the batch's own properties carry the transaction"
            )
        system = m.system_properties()
        given = system.get(PROPERTY_UNIQ_KEY)
        if given:
            ids[k] = given  # the caller's own id (a retried write keeps its ids)
        else:
            system[PROPERTY_UNIQ_KEY] = ids[k]
        encoded = encode_properties(system)
        n = len(system)
        if encoded.count(b"\x01") != n or encoded.count(b"\x02") != n:
            raise MessageIllegalError(
                f"message {k}: property names and values may not contain \\x01 or \\x02"
            )
        if len(encoded) > DEFAULT_MAX_PROPERTIES_SIZE:
            raise PropertiesTooLargeError(
                f"message {k}: properties are {len(encoded)} bytes encoded, "
                f"limit {DEFAULT_MAX_PROPERTIES_SIZE}"
            )
        props[k] = encoded
    return bodies, props, ids


def topic_of(half: HalfBatchResult | SendResult) -> str:
    return half.topic if isinstance(half, HalfBatchResult) else half.message_queue.topic


def checked_message(frame: Frame) -> tuple[StoredMessage, int]:
    """The half message of a check-back, as the listener sees it: real topic and queue, plain
    body, no broker-internal properties."""
    body = frame.body if isinstance(frame.body, bytes) else bytes(frame.body)
    records = decode_records(body)
    if len(records) != 1:
        raise ClientError(f"check-back carries {len(records)} records, not 1")
    half = _codec.plain(records[0])
    props = half.properties
    topic = props.get(PROPERTY_REAL_TOPIC) or str(frame.fields.get("topic", half.topic))
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, half.queue_id))
    except ValueError:
        queue_id = half.queue_id
    clean = {k: v for k, v in props.items() if k not in HALF_ONLY}
    offset = frame.fields.get("commit_log_offset", half.physical_offset)
    if not isinstance(offset, int):
        raise ClientError("commit_log_offset is not an integer")
    return dataclasses.replace(half, topic=topic, queue_id=queue_id, properties=clean), offset
