"""The server side of one MQTT connection, sans-IO (in the style of h11): bytes in, events out.

The gateway owns the socket, the clock and the store; this object owns the protocol rules of
one connection, for 3.1.1 and 5.0 alike:

- ``receive_data(data, now_ms)`` decodes what arrived and returns events: what the client
  asked for (:class:`ConnectRequested`, :class:`MessageReceived`, :class:`SubscribeRequested`,
  ...), what completed (:class:`Delivered`, :class:`Released`), bytes the protocol answers by
  itself (:class:`Send`: PINGRESP, the PUBREL after a PUBREC, the PUBCOMP after a PUBREL, a
  repeated PUBREC) and :class:`Closed` when the client broke the protocol: write its bytes
  (5.0: a DISCONNECT with the reason code, or a CONNACK before the session exists; 3.1.1:
  nothing) and close the socket.
- The gateway answers with ``accept``/``refuse`` (CONNACK), ``acknowledge`` (PUBACK or PUBREC
  once a received message is stored), ``publish`` (outbound PUBLISH: packet id, topic alias,
  receive maximum), ``send`` (SUBACK, UNSUBACK, AUTH) and ``close`` (server DISCONNECT).

QoS 2 inbound follows method B of 5.0 §4.3.3: the message is handed on at its first receipt
and only the packet id is kept until PUBREL, so a re-sent PUBLISH with that id is answered
with PUBREC and not handed on again. Packets sent before the CONNACK (5.0 §3.1.4 allows it)
are held and handled once the gateway accepts. Keep alive: a client silent for 1.5 times the
keep alive (the server's, if it imposes one) is closed with 0x8D (§3.1.2.10).

The will is the gateway's: it is published after :class:`Closed` or a DISCONNECT with reason
0x04, never after a normal DISCONNECT (§3.1.2.5). Persistent-session state (in-flight ids)
is the gateway's to store; ``restore`` puts it back after CONNACK on a resumed session.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import cast

from orbitmq.protocol.mqtt.codec import DEFAULT_MAX_PACKET_SIZE, MqttDecoder, encode
from orbitmq.protocol.mqtt.codes import (
    MQTT_5,
    MQTT_311,
    ConnectReturnCode,
    MqttProtocolError,
    PacketType,
    ReasonCode,
    reason_allowed,
)
from orbitmq.protocol.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from orbitmq.protocol.mqtt.properties import Prop, Properties
from orbitmq.protocol.mqtt.topics import parse_shared, validate_topic_name

DEFAULT_RECEIVE_MAXIMUM = 65_535
"""5.0 §3.1.2.11.3: what a peer that does not say allows."""


class State(Enum):
    AWAITING_CONNECT = 1
    CONNECTING = 2
    """CONNECT received, the gateway has not answered yet."""
    CONNECTED = 3
    CLOSED = 4


class WindowFullError(Exception):
    """``publish`` at QoS > 0 while the client's Receive Maximum is used up."""


# --- events -------------------------------------------------------------------------------


@dataclass(slots=True)
class Send:
    """Bytes the protocol answers by itself: write them."""

    data: bytes


@dataclass(slots=True)
class ConnectRequested:
    """Authenticate, set up the session, then ``accept`` or ``refuse``."""

    connect: Connect


@dataclass(slots=True)
class MessageReceived:
    """An application message (topic aliases resolved). QoS > 0: ``acknowledge`` it once
    stored."""

    publish: Publish


@dataclass(slots=True)
class Released:
    """Inbound QoS 2: the client released ``packet_id`` (PUBCOMP is already in a Send)."""

    packet_id: int


@dataclass(slots=True)
class Delivered:
    """Outbound QoS 1 acked or QoS 2 completed (or refused, reason >= 0x80): the id and
    its Receive Maximum slot are free."""

    packet_id: int
    reason_code: int = 0


@dataclass(slots=True)
class SubscribeRequested:
    """Answer with ``send(Suback(...))``, one reason code per subscription."""

    subscribe: Subscribe


@dataclass(slots=True)
class UnsubscribeRequested:
    unsubscribe: Unsubscribe


@dataclass(slots=True)
class AuthRequested:
    auth: Auth


@dataclass(slots=True)
class Disconnected:
    """The client said DISCONNECT; the will is due only if its reason is 0x04."""

    disconnect: Disconnect


@dataclass(slots=True)
class Closed:
    """The connection is over: write ``data`` (may be empty), then close the socket."""

    reason: ReasonCode
    data: bytes
    detail: str = ""


Event = (
    Send
    | ConnectRequested
    | MessageReceived
    | Released
    | Delivered
    | SubscribeRequested
    | UnsubscribeRequested
    | AuthRequested
    | Disconnected
    | Closed
)

_V4_CONNACK = {
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnectReturnCode.IDENTIFIER_REJECTED,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED: ConnectReturnCode.NOT_AUTHORIZED,
    ReasonCode.BANNED: ConnectReturnCode.NOT_AUTHORIZED,
}
_PUBACK, _PUBREC, _PUBCOMP = "puback", "pubrec", "pubcomp"


class ServerConnection:
    """One client connection, server side. Limits are what this server announces in its
    CONNACK (5.0): ``receive_maximum`` inbound QoS > 0 messages in flight, aliases up to
    ``topic_alias_maximum`` (0: none), packets up to ``max_packet_size`` bytes."""

    def __init__(
        self,
        *,
        receive_maximum: int = 32,
        topic_alias_maximum: int = 0,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        server_keep_alive: int | None = None,
    ) -> None:
        if not 1 <= receive_maximum <= 0xFFFF or not 0 <= topic_alias_maximum <= 0xFFFF:
            raise ValueError("receive_maximum 1..65535, topic_alias_maximum 0..65535")
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        self.server_keep_alive = server_keep_alive
        self.state = State.AWAITING_CONNECT
        self.version: int | None = None
        self.connect: Connect | None = None
        self.keep_alive = 0
        self.last_received_ms = 0
        self._decoder = MqttDecoder(max_packet_size)
        self._held: list[Packet] = []
        self.auth_method: str | None = None
        """The CONNECT's Authentication Method (5.0 enhanced authentication), if any."""
        self._auth_expected = False
        """We sent AUTH 0x18 (continue) and wait for the client's AUTH 0x18."""
        # client -> server
        self._in_qos1: set[int] = set()
        self._in_qos2: dict[int, bool] = {}  # packet id -> PUBREC sent
        self._in_aliases: dict[int, str] = {}
        # server -> client: the client's limits
        self.client_receive_maximum = DEFAULT_RECEIVE_MAXIMUM
        self.client_max_packet_size: int | None = None
        self.client_topic_alias_maximum = 0
        self._out: dict[int, str] = {}  # packet id -> the ack awaited
        self._next_id = 1
        self._out_aliases: dict[str, int] = {}

    # --- state a gateway reads ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def max_packet_size(self) -> int:
        return self._decoder.max_packet_size

    @property
    def inbound_in_flight(self) -> int:
        return len(self._in_qos1) + len(self._in_qos2)

    @property
    def outbound_in_flight(self) -> dict[int, str]:
        """packet id -> "puback" | "pubrec" | "pubcomp", the acknowledgement awaited."""
        return dict(self._out)

    @property
    def send_quota(self) -> int:
        """How many more QoS > 0 PUBLISH the client's Receive Maximum lets us send now."""
        return max(0, self.client_receive_maximum - len(self._out))

    def keep_alive_deadline_ms(self) -> int | None:
        """When the client must have sent something by, or None (keep alive 0)."""
        if self.state is not State.CONNECTED or not self.keep_alive:
            return None
        return self.last_received_ms + self.keep_alive * 1500

    # --- bytes in -----------------------------------------------------------------------------

    def receive_data(self, data: bytes, now_ms: int) -> list[Event]:
        if self.state is State.CLOSED:
            return []
        self.last_received_ms = now_ms
        try:
            packets = self._decoder.feed(data)
        except MqttProtocolError as exc:
            # Packets complete before the bad bytes (same read) still count: a CONNECT says
            # which version to answer in (5.0: CONNACK with the reason), and when connected
            # the packets are handled before the close.
            before: list[Event] = []
            for packet in exc.decoded:
                if self.state is State.AWAITING_CONNECT and isinstance(packet, Connect):
                    if packet.protocol_level in (MQTT_311, MQTT_5):
                        self.version = packet.protocol_level
                    break
                if self.state is State.CONNECTED and not self.closed:
                    before += self._handle(cast("Packet", packet))
            if self.closed:
                return before
            return [*before, self._fail(exc.reason, str(exc))]
        events: list[Event] = []
        for packet in packets:
            if self.closed:
                break
            if self.state is State.CONNECTING and not isinstance(packet, Connect | Auth):
                self._held.append(packet)
                continue
            events += self._handle(packet)
        return events

    def check_keep_alive(self, now_ms: int) -> Closed | None:
        """Closed (5.0: DISCONNECT 0x8D) if the keep-alive deadline has passed."""
        deadline = self.keep_alive_deadline_ms()
        if deadline is None or now_ms < deadline:
            return None
        return self._fail(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive expired")

    def _fail(self, reason: ReasonCode, detail: str) -> Closed:
        """The client broke the protocol: what to write before closing."""
        state, self.state = self.state, State.CLOSED
        data = b""
        if state is State.CONNECTED and self.version == MQTT_5:
            # e.g. 0x84 from a second CONNECT: not a DISCONNECT reason, but a protocol error
            code = reason if reason_allowed(PacketType.DISCONNECT, reason) else 0x82
            data = encode(Disconnect(code), MQTT_5)
        elif state in (State.AWAITING_CONNECT, State.CONNECTING):
            if self.version == MQTT_5:
                data = encode(Connack(False, reason), MQTT_5)
            elif reason in (
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            ):
                data = encode(Connack(False, _V4_CONNACK[reason]), MQTT_311)
        return Closed(reason, data, detail)

    def _handle(self, packet: Packet) -> list[Event]:
        if isinstance(packet, Connect):
            return self._on_connect(packet)
        if isinstance(packet, Publish):
            return self._on_publish(packet)
        if isinstance(packet, PubRel):
            return self._on_pubrel(packet)
        if isinstance(packet, PubAck | PubRec | PubComp):
            return self._on_ack(packet)
        if isinstance(packet, Subscribe):
            for sub in packet.subscriptions:
                try:
                    shared = parse_shared(sub.filter)
                except ValueError:
                    continue  # the gateway answers 0x8F for it in the SUBACK
                if shared is not None and sub.no_local:
                    return [self._fail(ReasonCode.PROTOCOL_ERROR, "no local on a shared filter")]
            return [SubscribeRequested(packet)]
        if isinstance(packet, Unsubscribe):
            return [UnsubscribeRequested(packet)]
        if isinstance(packet, PingReq):
            return [Send(encode(PingResp(), self._v))]
        if isinstance(packet, Disconnect):
            return self._on_disconnect(packet)
        if isinstance(packet, Auth):
            return self._on_auth(packet)
        return [self._fail(ReasonCode.PROTOCOL_ERROR, f"a client does not send {packet.TYPE.name}")]

    @property
    def _v(self) -> int:
        return self.version or MQTT_5

    def _on_connect(self, c: Connect) -> list[Event]:
        if self.state is not State.AWAITING_CONNECT:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, "second CONNECT")]
        self.version = c.protocol_level
        if c.protocol_level == MQTT_311 and not c.client_id and not c.clean_start:
            return [self._fail(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty id, clean 0")]
        if c.will is not None:
            try:
                validate_topic_name(c.will.topic)
            except ValueError as exc:
                return [self._fail(ReasonCode.TOPIC_NAME_INVALID, str(exc))]
        props = c.properties
        if Prop.AUTHENTICATION_DATA in props and Prop.AUTHENTICATION_METHOD not in props:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, "authentication data, no method")]
        method = props.get(Prop.AUTHENTICATION_METHOD)
        self.auth_method = method if isinstance(method, str) else None
        self.client_receive_maximum = props.get(Prop.RECEIVE_MAXIMUM, DEFAULT_RECEIVE_MAXIMUM)
        self.client_max_packet_size = props.get(Prop.MAXIMUM_PACKET_SIZE)
        self.client_topic_alias_maximum = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0)
        keep = self.server_keep_alive if c.protocol_level == MQTT_5 else None
        self.keep_alive = c.keep_alive if keep is None else keep
        self.connect = c
        self.state = State.CONNECTING
        return [ConnectRequested(c)]

    def _on_auth(self, a: Auth) -> list[Event]:
        """§4.12: AUTH only inside an exchange the CONNECT started with an Authentication
        Method, naming that method; a client sends 0x18 only in answer to our 0x18, and 0x19
        (re-authenticate) only when connected and no exchange is under way."""
        if self.auth_method is None:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, "AUTH without a method in CONNECT")]
        method = a.properties.get(Prop.AUTHENTICATION_METHOD)
        if method is None:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, "AUTH without a method")]
        if method != self.auth_method:
            return [self._fail(ReasonCode.BAD_AUTHENTICATION_METHOD, "AUTH with another method")]
        if a.reason_code == ReasonCode.CONTINUE_AUTHENTICATION:
            if not self._auth_expected:
                return [self._fail(ReasonCode.PROTOCOL_ERROR, "AUTH 0x18 not asked for")]
            self._auth_expected = False
        elif a.reason_code == ReasonCode.RE_AUTHENTICATE:
            if self.state is not State.CONNECTED or self._auth_expected:
                return [self._fail(ReasonCode.PROTOCOL_ERROR, "AUTH 0x19 during an exchange")]
        else:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, "a client sends AUTH 0x18 or 0x19")]
        return [AuthRequested(a)]

    def _on_publish(self, p: Publish) -> list[Event]:
        topic = p.topic
        if self.version == MQTT_5:
            if Prop.SUBSCRIPTION_IDENTIFIER in p.properties:  # §3.3.4: server -> client only
                return [self._fail(ReasonCode.PROTOCOL_ERROR, "subscription id from a client")]
            alias = p.properties.get(Prop.TOPIC_ALIAS)
            if alias is not None:
                if alias > self.topic_alias_maximum:
                    return [self._fail(ReasonCode.TOPIC_ALIAS_INVALID, f"alias {alias}")]
                if topic:
                    self._in_aliases[alias] = topic
                elif alias in self._in_aliases:
                    topic = self._in_aliases[alias]
                else:
                    return [self._fail(ReasonCode.PROTOCOL_ERROR, f"unknown alias {alias}")]
                props = {k: v for k, v in p.properties.items() if k != Prop.TOPIC_ALIAS}
                p = replace(p, topic=topic, properties=props)
        try:
            validate_topic_name(topic)
        except ValueError as exc:
            reason = ReasonCode.PROTOCOL_ERROR if not topic else ReasonCode.TOPIC_NAME_INVALID
            return [self._fail(reason, str(exc))]
        if p.qos == 0:
            return [MessageReceived(p)]
        pid = p.packet_id
        assert pid is not None  # the decoder gives QoS > 0 a packet id
        if p.qos == 2 and pid in self._in_qos2:
            if self._in_qos2[pid]:  # handed on already: only the PUBREC was lost
                return [Send(encode(PubRec(pid), self._v))]
            return []  # the gateway is storing it and will acknowledge
        if p.qos == 1 and pid in self._in_qos1:
            return []  # a resend of a message being stored: its PUBACK is coming
        if pid in self._in_qos1 or pid in self._in_qos2:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, f"packet id {pid} in use")]
        if self.version == MQTT_5 and self.inbound_in_flight >= self.receive_maximum:
            return [self._fail(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, f"over {self.receive_maximum}")]
        if p.qos == 1:
            self._in_qos1.add(pid)
        else:
            self._in_qos2[pid] = False
        return [MessageReceived(p)]

    def _on_pubrel(self, p: PubRel) -> list[Event]:
        sent = self._in_qos2.get(p.packet_id)
        if sent is None:
            code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if self.version == MQTT_5 else 0
            return [Send(encode(PubComp(p.packet_id, code), self._v))]
        if not sent:
            return [self._fail(ReasonCode.PROTOCOL_ERROR, f"PUBREL {p.packet_id} before PUBREC")]
        del self._in_qos2[p.packet_id]
        return [Send(encode(PubComp(p.packet_id), self._v)), Released(p.packet_id)]

    def _on_ack(self, p: PubAck | PubRec | PubComp) -> list[Event]:
        pid = p.packet_id
        awaited = self._out.get(pid)
        if isinstance(p, PubRec):
            if awaited == _PUBCOMP:  # our PUBREL was lost
                return [Send(encode(PubRel(pid), self._v))]
            if awaited != _PUBREC:
                code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if self.version == MQTT_5 else 0
                return [Send(encode(PubRel(pid, code), self._v))]
            if p.reason_code >= 0x80:
                del self._out[pid]
                return [Delivered(pid, p.reason_code)]
            self._out[pid] = _PUBCOMP
            return [Send(encode(PubRel(pid), self._v))]
        want = _PUBACK if isinstance(p, PubAck) else _PUBCOMP
        if awaited != want:
            return []  # a late or repeated ack: nothing is waiting for it
        del self._out[pid]
        return [Delivered(pid, p.reason_code)]

    def _on_disconnect(self, d: Disconnect) -> list[Event]:
        if self.connect is not None and self.version == MQTT_5:
            before = self.connect.properties.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
            if before == 0 and d.properties.get(Prop.SESSION_EXPIRY_INTERVAL, 0):
                return [self._fail(ReasonCode.PROTOCOL_ERROR, "session expiry set at DISCONNECT")]
        self.state = State.CLOSED
        return [Disconnected(d)]

    # --- the gateway's answers ----------------------------------------------------------------

    def accept(
        self, session_present: bool = False, properties: Properties | None = None
    ) -> list[Event]:
        """CONNACK success, then the events of packets the client sent before it."""
        if self.state is not State.CONNECTING:
            raise RuntimeError(f"accept in state {self.state.name}")
        props: Properties = {}
        if self.version == MQTT_5:
            if self.receive_maximum != DEFAULT_RECEIVE_MAXIMUM:
                props[Prop.RECEIVE_MAXIMUM] = self.receive_maximum
            if self.topic_alias_maximum:
                props[Prop.TOPIC_ALIAS_MAXIMUM] = self.topic_alias_maximum
            props[Prop.MAXIMUM_PACKET_SIZE] = self.max_packet_size
            if self.server_keep_alive is not None:
                props[Prop.SERVER_KEEP_ALIVE] = self.server_keep_alive
            props.update(properties or {})
        self.state = State.CONNECTED
        events: list[Event] = [Send(encode(Connack(session_present, 0, props), self._v))]
        held, self._held = self._held, []
        for packet in held:
            if self.closed:
                break
            events += self._handle(packet)
        return events

    def refuse(self, reason: ReasonCode, properties: Properties | None = None) -> bytes:
        """CONNACK failure (3.1.1: the nearest return code); then close the socket."""
        if self.state is not State.CONNECTING:
            raise RuntimeError(f"refuse in state {self.state.name}")
        self.state = State.CLOSED
        if self.version == MQTT_5:
            return encode(Connack(False, reason, properties or {}), MQTT_5)
        code = _V4_CONNACK.get(reason, ConnectReturnCode.SERVER_UNAVAILABLE)
        return encode(Connack(False, code), MQTT_311)

    def acknowledge(self, packet_id: int, reason_code: int = 0) -> bytes:
        """PUBACK (QoS 1) or PUBREC (QoS 2) for a received message, once it is stored."""
        if packet_id in self._in_qos1:
            self._in_qos1.discard(packet_id)
            return encode(PubAck(packet_id, reason_code), self._v)
        if self._in_qos2.get(packet_id) is False:
            if reason_code >= 0x80:  # refused: the flow ends here (5.0 §4.3.3)
                del self._in_qos2[packet_id]
            else:
                self._in_qos2[packet_id] = True
            return encode(PubRec(packet_id, reason_code), self._v)
        raise ValueError(f"no received message {packet_id} awaits an acknowledgement")

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        *,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> tuple[int | None, bytes] | None:
        """(packet id, bytes) of an outbound PUBLISH, or None if it is over the client's
        Maximum Packet Size (5.0 §3.1.2.11.4: then it is not sent, as if delivered).
        Raises WindowFullError at QoS > 0 when ``send_quota`` is 0."""
        if self.state is not State.CONNECTED:
            raise RuntimeError(f"publish in state {self.state.name}")
        props = dict(properties or {}) if self.version == MQTT_5 else {}
        pid = None
        if qos:
            if not self.send_quota:
                raise WindowFullError(f"client receive maximum {self.client_receive_maximum}")
            pid = self._allocate_id()
        wire_topic, new_alias = topic, False
        if self.version == MQTT_5 and self.client_topic_alias_maximum:
            alias = self._out_aliases.get(topic)
            if alias is not None:
                wire_topic = ""
            elif len(self._out_aliases) < self.client_topic_alias_maximum:
                alias, new_alias = len(self._out_aliases) + 1, True
            if alias is not None:
                props[Prop.TOPIC_ALIAS] = alias
        data = encode(Publish(wire_topic, payload, qos, retain, False, pid, props), self._v)
        if self.client_max_packet_size is not None and len(data) > self.client_max_packet_size:
            return None
        if new_alias:
            self._out_aliases[topic] = props[Prop.TOPIC_ALIAS]
        if pid is not None:
            self._out[pid] = _PUBACK if qos == 1 else _PUBREC
        return pid, data

    def _allocate_id(self) -> int:
        pid = self._next_id
        while pid in self._out:  # send_quota > 0 keeps a free id within reach
            pid = pid % 0xFFFF + 1
        self._next_id = pid % 0xFFFF + 1
        return pid

    def restore(
        self,
        unacked: Iterable[Publish] = (),
        released: Iterable[int] = (),
        inbound_qos2: Iterable[int] = (),
    ) -> bytes:
        """Puts a resumed session's in-flight state back (after ``accept``) and returns what
        to resend (5.0 §4.4): each unacknowledged PUBLISH with DUP=1, then a PUBREL for each
        outbound QoS 2 id awaiting PUBCOMP. ``inbound_qos2``: ids whose PUBREC was sent."""
        if self.state is not State.CONNECTED:
            raise RuntimeError(f"restore in state {self.state.name}")
        out = bytearray()
        for p in unacked:
            if p.packet_id is None or p.qos == 0:
                raise ValueError("only QoS > 0 messages with a packet id are in flight")
            self._out[p.packet_id] = _PUBACK if p.qos == 1 else _PUBREC
            out += encode(replace(p, dup=True), self._v)
        for pid in released:
            self._out[pid] = _PUBCOMP
            out += encode(PubRel(pid), self._v)
        for pid in inbound_qos2:
            self._in_qos2[pid] = True
        return bytes(out)

    def send(self, packet: Suback | Unsuback | Auth) -> bytes:
        if self.state not in (State.CONNECTED, State.CONNECTING):
            raise RuntimeError(f"send in state {self.state.name}")
        if isinstance(packet, Auth):
            self._auth_expected = packet.reason_code == ReasonCode.CONTINUE_AUTHENTICATION
        return encode(packet, self._v)

    def close(self, reason: ReasonCode = ReasonCode.SUCCESS) -> bytes:
        """A server-side DISCONNECT (5.0; 3.1.1 has none: empty); then close the socket."""
        was, self.state = self.state, State.CLOSED
        if was is State.CONNECTED and self.version == MQTT_5:
            return encode(Disconnect(reason), MQTT_5)
        return b""
