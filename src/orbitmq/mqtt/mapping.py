"""MQTT <-> OrbitMQ: which OrbitMQ topic an MQTT topic lives in, and how a PUBLISH becomes
message properties and back.

- **Topic**: the first level of the MQTT topic (``plant`` for ``plant/line1/temp``) when it is
  a valid OrbitMQ topic name, else the configured fallback topic (``MQTT``): ``/a``, ``$x/y``
  and ``caf\u00e9/x`` all land there. A filter whose first level is a wildcard reads every
  user topic.
- **Properties** (every stored MQTT message has the first two; names usable in SQL92
  filters, e.g. ``MQTT_TOPIC = 'plant/line1/temp'``): :data:`MQTT_TOPIC` the full MQTT topic,
  :data:`MQTT_QOS` the publish QoS, ``MQTT_RETAIN`` "1" when published retained,
  ``MQTT_CLIENT_ID`` the publisher (no-local), ``MQTT_EXPIRY_AT`` the epoch ms a 5.0 Message
  Expiry Interval ends at, ``MQTT_CONTENT_TYPE``, ``MQTT_RESPONSE_TOPIC``,
  ``MQTT_CORRELATION_DATA`` (base64), ``MQTT_PAYLOAD_FORMAT`` ("1": UTF-8) and
  ``MQTT_USER_PROPERTIES`` (a JSON list of [name, value] pairs, order kept). An empty payload
  is stored as one zero byte with ``MQTT_EMPTY`` "1" (the store refuses empty bodies).
- **Key**: the full MQTT topic is also the message key (``KEYS``) when it holds no space (the
  key separator): a Kafka consumer of ``plant`` sees it as the record key, and a query by key
  finds a device's messages.
- **Back to MQTT**: a message without ``MQTT_TOPIC`` (sent natively, by Kafka, by Spark) is
  delivered under its OrbitMQ topic name, or under the ``MQTT_TOPIC`` the sender set; its QoS is
  the subscription's (a stored message is as durable as QoS 2 asks). A compressed body is
  inflated.

The message property format separates pairs with \\x01 and \\x02, so an MQTT topic or client id
holding either byte cannot be stored: such a PUBLISH is refused (Topic Name Invalid).
"""

from __future__ import annotations

import base64
import contextlib
import re
from dataclasses import dataclass

import msgspec

from orbitmq.client._codec import decompress  # the one body inflater (zstd, RocketMQ's zlib)
from orbitmq.common.message import KEY_SEPARATOR, PROPERTY_KEYS, encode_properties
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.mqtt.packets import Publish
from orbitmq.protocol.mqtt.properties import Prop, Properties

MQTT_TOPIC = "MQTT_TOPIC"
MQTT_QOS = "MQTT_QOS"
MQTT_RETAIN = "MQTT_RETAIN"
MQTT_CLIENT_ID = "MQTT_CLIENT_ID"
MQTT_EXPIRY_AT = "MQTT_EXPIRY_AT"
MQTT_CONTENT_TYPE = "MQTT_CONTENT_TYPE"
MQTT_RESPONSE_TOPIC = "MQTT_RESPONSE_TOPIC"
MQTT_CORRELATION_DATA = "MQTT_CORRELATION_DATA"
MQTT_PAYLOAD_FORMAT = "MQTT_PAYLOAD_FORMAT"
MQTT_USER_PROPERTIES = "MQTT_USER_PROPERTIES"
MQTT_EMPTY = "MQTT_EMPTY"
MQTT_PACKET_ID = "MQTT_PACKET_ID"
"""On QoS 2 publishes: the client's packet id, with MQTT_CLIENT_ID what finds a stored copy
after a crash (exactly once inbound)."""
EMPTY_BODY = b"\x00"
"""The body an empty MQTT payload is stored with (the store refuses empty bodies), marked
``MQTT_EMPTY=1``; delivered over MQTT as the empty payload it was."""

_TOPIC_RE = re.compile(r"[A-Za-z0-9%|_+\-]{1,127}")
_SYSTEM_PREFIXES = ("rmq_sys_", "RMQ_SYS_", "%RETRY%", "%DLQ%", "SCHEDULE_TOPIC", "TBW102")


class MappingError(ValueError):
    """A PUBLISH that cannot become an OrbitMQ message (Topic Name Invalid)."""


def orbit_topic(mqtt_topic: str, fallback: str) -> str:
    """The OrbitMQ topic an MQTT topic name (or a filter's first level) is stored in."""
    first = mqtt_topic.partition("/")[0]
    return first if _TOPIC_RE.fullmatch(first) else fallback


def is_user_topic(topic: str) -> bool:
    """Topics a first-level wildcard reads: not the broker's system, retry or DLQ topics."""
    return not topic.startswith(_SYSTEM_PREFIXES)


def _clean(value: str) -> bool:
    return "\x01" not in value and "\x02" not in value


def publish_properties(
    publish: Publish, client_id: str, now_ms: int, *, retain: bool | None = None
) -> bytes:
    """The encoded OrbitMQ properties of an inbound PUBLISH (``retain``: the flag to record,
    default the packet's)."""
    if not _clean(publish.topic):
        raise MappingError("topic holds a \\x01 or \\x02 byte")
    props = {MQTT_TOPIC: publish.topic, MQTT_QOS: str(publish.qos)}
    if KEY_SEPARATOR not in publish.topic:
        props[PROPERTY_KEYS] = publish.topic
    if not publish.payload:
        props[MQTT_EMPTY] = "1"
    if publish.retain if retain is None else retain:
        props[MQTT_RETAIN] = "1"
    if client_id and _clean(client_id):
        props[MQTT_CLIENT_ID] = client_id
        if publish.qos == 2 and publish.packet_id is not None:
            props[MQTT_PACKET_ID] = str(publish.packet_id)
    p = publish.properties
    expiry = p.get(Prop.MESSAGE_EXPIRY_INTERVAL)
    if isinstance(expiry, int):
        props[MQTT_EXPIRY_AT] = str(now_ms + expiry * 1000)
    for prop, name in (
        (Prop.CONTENT_TYPE, MQTT_CONTENT_TYPE),
        (Prop.RESPONSE_TOPIC, MQTT_RESPONSE_TOPIC),
    ):
        value = p.get(prop)
        if isinstance(value, str) and _clean(value):
            props[name] = value
    data = p.get(Prop.CORRELATION_DATA)
    if isinstance(data, bytes):
        props[MQTT_CORRELATION_DATA] = base64.b64encode(data).decode()
    if p.get(Prop.PAYLOAD_FORMAT_INDICATOR) == 1:
        props[MQTT_PAYLOAD_FORMAT] = "1"
    users = p.get(Prop.USER_PROPERTY)
    if users:
        # JSON escapes every control character, so the separators cannot appear.
        props[MQTT_USER_PROPERTIES] = msgspec.json.encode([list(u) for u in users]).decode()
    return encode_properties(props)


@dataclass(slots=True)
class Outbound:
    """A stored message as an MQTT PUBLISH would carry it (before QoS and aliases)."""

    topic: str
    payload: bytes
    qos: int
    """The publish QoS (2 for a message sent by another protocol)."""
    retain: bool
    properties: Properties
    publisher: str | None
    expiry_at: int | None


def outbound(msg: StoredMessage) -> Outbound:
    """The MQTT view of a stored message (its body inflated when compressed)."""
    props = msg.properties
    body = b"" if props.get(MQTT_EMPTY) == "1" else decompress(msg.body, msg.sys_flag)
    return outbound_from(props.get(MQTT_TOPIC) or msg.topic, body, props)


def outbound_from(topic: str, payload: bytes, props: dict[str, str]) -> Outbound:
    """The MQTT view of a payload and its OrbitMQ properties."""
    qos_text = props.get(MQTT_QOS, "2")
    qos = int(qos_text) if qos_text in ("0", "1", "2") else 2
    out: Properties = {}
    if MQTT_CONTENT_TYPE in props:
        out[Prop.CONTENT_TYPE] = props[MQTT_CONTENT_TYPE]
    if MQTT_RESPONSE_TOPIC in props:
        out[Prop.RESPONSE_TOPIC] = props[MQTT_RESPONSE_TOPIC]
    if MQTT_CORRELATION_DATA in props:
        with contextlib.suppress(ValueError):
            out[Prop.CORRELATION_DATA] = base64.b64decode(props[MQTT_CORRELATION_DATA])
    if props.get(MQTT_PAYLOAD_FORMAT) == "1":
        out[Prop.PAYLOAD_FORMAT_INDICATOR] = 1
    if MQTT_USER_PROPERTIES in props:
        try:
            pairs = msgspec.json.decode(props[MQTT_USER_PROPERTIES], type=list[tuple[str, str]])
            out[Prop.USER_PROPERTY] = tuple(pairs)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
    expiry_text = props.get(MQTT_EXPIRY_AT, "")
    return Outbound(
        topic=topic,
        payload=payload,
        qos=qos,
        retain=props.get(MQTT_RETAIN) == "1",
        properties=out,
        publisher=props.get(MQTT_CLIENT_ID),
        expiry_at=int(expiry_text) if expiry_text.isdigit() else None,
    )
