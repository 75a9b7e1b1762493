"""MQTT packet types, 5.0 reason codes (OASIS MQTT 5.0 §2.4) and the codec's error.

One enum serves both versions: 3.1.1 has no reason codes outside CONNACK's return codes
(0..5, :class:`ConnectReturnCode`) and SUBACK's (0, 1, 2, 0x80), which are numerically a
subset of the 5.0 codes. :class:`MqttProtocolError` is a ProtocolError that says which reason
code the connection must close with (5.0: DISCONNECT with it first; 3.1.1: just close).
"""

from __future__ import annotations

from enum import IntEnum

from orbitmq.common.errors import ProtocolError

MQTT_311 = 4
"""Protocol level of MQTT 3.1.1."""
MQTT_5 = 5
"""Protocol level of MQTT 5.0."""


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(IntEnum):
    SUCCESS = 0x00  # also Normal disconnection, Granted QoS 0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnectReturnCode(IntEnum):
    """CONNACK return codes of MQTT 3.1.1 (§3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


_PUB_ACK = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
_RELEASE = frozenset((0x00, 0x92))
_CONNACK = frozenset(
    (0x00, *range(0x80, 0x8B), 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
)
# 0x8C: Table 2-6 names DISCONNECT for it though §3.14.2.1's list does not; accepted.
_DISCONNECT = frozenset(
    (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, *range(0x8C, 0x91), *range(0x93, 0xA3))
)
REASONS: dict[int, frozenset[int]] = {
    PacketType.CONNACK: _CONNACK,
    PacketType.PUBACK: _PUB_ACK,
    PacketType.PUBREC: _PUB_ACK,
    PacketType.PUBREL: _RELEASE,
    PacketType.PUBCOMP: _RELEASE,
    PacketType.SUBACK: frozenset(
        (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
    ),
    PacketType.UNSUBACK: frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    PacketType.DISCONNECT: _DISCONNECT,
    PacketType.AUTH: frozenset((0x00, 0x18, 0x19)),
}
"""5.0 §2.4 Table 2-6: the reason codes each packet type may carry."""
REASONS_311: dict[int, frozenset[int]] = {
    PacketType.CONNACK: frozenset(int(c) for c in ConnectReturnCode),
    PacketType.SUBACK: frozenset((0x00, 0x01, 0x02, 0x80)),
}
"""3.1.1: CONNACK return codes (§3.2.2.3) and SUBACK return codes (§3.9.3)."""


def reason_allowed(packet: int, code: int, version: int = MQTT_5) -> bool:
    table = REASONS if version == MQTT_5 else REASONS_311
    return code in table.get(packet, ())


class MqttProtocolError(ProtocolError):
    """Bytes that break MQTT; ``reason`` is the 5.0 reason code to close with.

    ``reason`` is an instance attribute, not ``code``: ``code`` is OrbitMQ's ResponseCode,
    inherited from ProtocolError.
    """

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(f"{reason.name}: {message}")
        self.reason = reason
        self.decoded: list[object] = []
        """Packets the decoder completed in the same ``feed`` before the bad bytes."""


def malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def protocol_error(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.PROTOCOL_ERROR, message)
