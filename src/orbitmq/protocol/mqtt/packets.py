"""The MQTT control packets of 3.1.1 and 5.0 as typed dataclasses.

One class per packet type serves both versions; fields only 5.0 has (``properties``, the
reason codes of acks, DISCONNECT and AUTH) are left at their defaults under 3.1.1, where the
encoder does not write them. ``qos`` is 0, 1 or 2; ``packet_id`` is 1..65535 where the
packet has one (a QoS 0 PUBLISH has ``packet_id`` None). In 3.1.1 a CONNACK's
``reason_code`` is the 3.1.1 return code (0..5) and a SUBACK's codes are 0, 1, 2 or 0x80.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orbitmq.protocol.mqtt.codes import MQTT_5, PacketType
from orbitmq.protocol.mqtt.properties import Properties


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    TYPE = PacketType.CONNECT
    client_id: str = ""
    protocol_level: int = MQTT_5
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connack:
    TYPE = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    TYPE = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubAck:
    TYPE = PacketType.PUBACK
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRec:
    TYPE = PacketType.PUBREC
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRel:
    TYPE = PacketType.PUBREL
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubComp:
    TYPE = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE and its options (5.0 §3.8.3.1)."""

    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    """0 send retained at subscribe, 1 only if the subscription is new, 2 never."""


@dataclass(slots=True)
class Subscribe:
    TYPE = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    TYPE = PacketType.SUBACK
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    TYPE = PacketType.UNSUBSCRIBE
    packet_id: int
    filters: tuple[str, ...]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    TYPE = PacketType.UNSUBACK
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    """5.0 only; 3.1.1's UNSUBACK carries none."""
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    TYPE = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    TYPE = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    TYPE = PacketType.DISCONNECT
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """5.0 only (§3.15)."""

    TYPE = PacketType.AUTH
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | Connack
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
