"""MQTT 5.0 properties (§2.2.2): the table of identifiers, their types and where they may go.

A property set is a plain dict ``{identifier: value}``. Two identifiers may repeat, User
Property (0x26) and Subscription Identifier (0x0B); their values are tuples (of
``(name, value)`` string pairs, of ints) in wire order. Every other identifier appears at
most once: a repeat is a Protocol Error (§2.2.2.2). An identifier that is unknown, or not
allowed in the packet at hand, is a Malformed Packet; so is a value of the wrong type. A
value outside what its property allows (Receive Maximum 0, a flag other than 0/1, ...) is a
Protocol Error (§3.1.2.11, §3.2.2.3). Encoding writes identifiers in ascending order, so
``decode(encode(p)) == p`` for every valid set.

3.1.1 has no properties: its packets are encoded without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from orbitmq.protocol.mqtt.codes import MqttProtocolError, PacketType, malformed, protocol_error
from orbitmq.protocol.mqtt.wire import (
    Reader,
    encode_binary,
    encode_string,
    encode_varint,
    u16,
    u32,
)

Properties = dict[int, Any]
"""identifier -> int | str | bytes | tuple[tuple[str, str], ...] (0x26) | tuple[int, ...] (0x0B)"""

WILL = 0
"""Pseudo packet type for the Will Properties of a CONNECT payload."""


class Prop(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropType(IntEnum):
    BYTE = 1
    U16 = 2
    U32 = 3
    VARINT = 4
    STRING = 5
    BINARY = 6
    PAIR = 7


P = PacketType
_ACKS = (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.SUBACK, P.UNSUBACK)
_ALL = (P.CONNECT, P.CONNACK, P.PUBLISH, *_ACKS, P.SUBSCRIBE, P.UNSUBSCRIBE, P.DISCONNECT, P.AUTH)

TABLE: dict[int, tuple[PropType, frozenset[int]]] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: (PropType.BYTE, frozenset((P.PUBLISH, WILL))),
    Prop.MESSAGE_EXPIRY_INTERVAL: (PropType.U32, frozenset((P.PUBLISH, WILL))),
    Prop.CONTENT_TYPE: (PropType.STRING, frozenset((P.PUBLISH, WILL))),
    Prop.RESPONSE_TOPIC: (PropType.STRING, frozenset((P.PUBLISH, WILL))),
    Prop.CORRELATION_DATA: (PropType.BINARY, frozenset((P.PUBLISH, WILL))),
    Prop.SUBSCRIPTION_IDENTIFIER: (PropType.VARINT, frozenset((P.PUBLISH, P.SUBSCRIBE))),
    Prop.SESSION_EXPIRY_INTERVAL: (
        PropType.U32,
        frozenset((P.CONNECT, P.CONNACK, P.DISCONNECT)),
    ),
    Prop.ASSIGNED_CLIENT_IDENTIFIER: (PropType.STRING, frozenset((P.CONNACK,))),
    Prop.SERVER_KEEP_ALIVE: (PropType.U16, frozenset((P.CONNACK,))),
    Prop.AUTHENTICATION_METHOD: (PropType.STRING, frozenset((P.CONNECT, P.CONNACK, P.AUTH))),
    Prop.AUTHENTICATION_DATA: (PropType.BINARY, frozenset((P.CONNECT, P.CONNACK, P.AUTH))),
    Prop.REQUEST_PROBLEM_INFORMATION: (PropType.BYTE, frozenset((P.CONNECT,))),
    Prop.WILL_DELAY_INTERVAL: (PropType.U32, frozenset((WILL,))),
    Prop.REQUEST_RESPONSE_INFORMATION: (PropType.BYTE, frozenset((P.CONNECT,))),
    Prop.RESPONSE_INFORMATION: (PropType.STRING, frozenset((P.CONNACK,))),
    Prop.SERVER_REFERENCE: (PropType.STRING, frozenset((P.CONNACK, P.DISCONNECT))),
    Prop.REASON_STRING: (
        PropType.STRING,
        frozenset((P.CONNACK, *_ACKS, P.DISCONNECT, P.AUTH)),
    ),
    Prop.RECEIVE_MAXIMUM: (PropType.U16, frozenset((P.CONNECT, P.CONNACK))),
    Prop.TOPIC_ALIAS_MAXIMUM: (PropType.U16, frozenset((P.CONNECT, P.CONNACK))),
    Prop.TOPIC_ALIAS: (PropType.U16, frozenset((P.PUBLISH,))),
    Prop.MAXIMUM_QOS: (PropType.BYTE, frozenset((P.CONNACK,))),
    Prop.RETAIN_AVAILABLE: (PropType.BYTE, frozenset((P.CONNACK,))),
    Prop.USER_PROPERTY: (PropType.PAIR, frozenset((*_ALL, WILL))),
    Prop.MAXIMUM_PACKET_SIZE: (PropType.U32, frozenset((P.CONNECT, P.CONNACK))),
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: (PropType.BYTE, frozenset((P.CONNACK,))),
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (PropType.BYTE, frozenset((P.CONNACK,))),
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: (PropType.BYTE, frozenset((P.CONNACK,))),
}

REPEATABLE = frozenset((Prop.USER_PROPERTY, Prop.SUBSCRIPTION_IDENTIFIER))
_FLAGS = frozenset(
    (
        Prop.PAYLOAD_FORMAT_INDICATOR,
        Prop.REQUEST_PROBLEM_INFORMATION,
        Prop.REQUEST_RESPONSE_INFORMATION,
        Prop.MAXIMUM_QOS,
        Prop.RETAIN_AVAILABLE,
        Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
        Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        Prop.SHARED_SUBSCRIPTION_AVAILABLE,
    )
)
_NON_ZERO = frozenset(
    (
        Prop.RECEIVE_MAXIMUM,
        Prop.MAXIMUM_PACKET_SIZE,
        Prop.TOPIC_ALIAS,
        Prop.SUBSCRIPTION_IDENTIFIER,
    )
)


def allowed(packet: int) -> frozenset[int]:
    """The identifiers allowed in ``packet`` (a PacketType or :data:`WILL`)."""
    return frozenset(pid for pid, (_, where) in TABLE.items() if packet in where)


def _check_value(pid: int, value: int) -> None:
    if pid in _FLAGS and value not in (0, 1):
        raise protocol_error(f"property 0x{pid:02X} must be 0 or 1, got {value}")
    if pid in _NON_ZERO and value == 0:
        raise protocol_error(f"property 0x{pid:02X} must not be 0")


def _encode_value(kind: PropType, value: Any) -> bytes:
    if kind is PropType.BYTE:
        return bytes((value,))
    if kind is PropType.U16:
        return u16(value)
    if kind is PropType.U32:
        return u32(value)
    if kind is PropType.VARINT:
        return encode_varint(value)
    if kind is PropType.STRING:
        return encode_string(value)
    return encode_binary(value)


def encode_properties(props: Mapping[int, Any], packet: int) -> bytes:
    """Property Length + properties. ValueError if a property is unknown, misplaced or out
    of range: the encoder refuses to write what a decoder would refuse to read."""
    out = bytearray()
    ok = allowed(packet)
    for pid in sorted(props):
        if pid not in ok:
            raise ValueError(f"property 0x{pid:02X} is not allowed in packet type {packet}")
        kind, _ = TABLE[pid]
        value = props[pid]
        if pid == Prop.USER_PROPERTY:
            for name, val in value:
                out.append(pid)
                out += encode_string(name) + encode_string(val)
            continue
        values = value if pid == Prop.SUBSCRIPTION_IDENTIFIER else (value,)
        for one in values:
            if kind is PropType.BYTE and not 0 <= one <= 0xFF:
                raise ValueError(f"property 0x{pid:02X}: byte {one} out of range")
            if isinstance(one, int):
                try:
                    _check_value(pid, one)
                except MqttProtocolError as exc:
                    raise ValueError(str(exc)) from None
            out.append(pid)
            out += _encode_value(kind, one)
    return encode_varint(len(out)) + bytes(out)


def decode_properties(reader: Reader, packet: int) -> Properties:
    length = reader.varint()
    if length > reader.remaining:
        raise malformed(f"property length {length} runs past the packet")
    end = reader.pos + length
    sub = Reader(reader.data, reader.pos, end)
    reader.pos = end
    ok = allowed(packet)
    props: Properties = {}
    pairs: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    while sub.remaining:
        pid = sub.varint()
        if pid not in ok:
            raise malformed(f"property 0x{pid:02X} is not valid in packet type {packet}")
        kind, _ = TABLE[pid]
        if pid == Prop.USER_PROPERTY:
            pairs.append((sub.string(), sub.string()))
            continue
        value: Any
        if kind is PropType.BYTE:
            value = sub.byte()
        elif kind is PropType.U16:
            value = sub.u16()
        elif kind is PropType.U32:
            value = sub.u32()
        elif kind is PropType.VARINT:
            value = sub.varint()
        elif kind is PropType.STRING:
            value = sub.string()
        else:
            value = sub.binary()
        if isinstance(value, int):
            _check_value(pid, value)
        if pid == Prop.SUBSCRIPTION_IDENTIFIER:
            sub_ids.append(value)
            continue
        if pid in props:
            raise protocol_error(f"property 0x{pid:02X} appears more than once")
        props[pid] = value
    if pairs:
        props[Prop.USER_PROPERTY] = tuple(pairs)
    if sub_ids:
        props[Prop.SUBSCRIPTION_IDENTIFIER] = tuple(sub_ids)
    return props
