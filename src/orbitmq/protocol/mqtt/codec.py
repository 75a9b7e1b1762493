"""MQTT 3.1.1 / 5.0 codec, sans-IO: :func:`encode` packet -> bytes, :class:`MqttDecoder`
bytes -> packets.

A packet is a fixed header (type << 4 | flags, then the Remaining Length as a Variable Byte
Integer) and that many bytes. The flags of every type but PUBLISH are fixed (0b0010 for
PUBREL, SUBSCRIBE, UNSUBSCRIBE, else 0); anything else is a Malformed Packet, as is a PUBLISH
with QoS 3 (§2.1.3). The version matters only inside packets: a decoder built without one
learns it from the CONNECT it decodes (protocol level 4 = 3.1.1, 5 = 5.0), which is how a
server's per-connection decoder knows its version after CONNECT. Levels other than 4 and 5
(3.1's "MQIsdp" included) are refused with Unsupported Protocol Version.

Every way bytes can be wrong ends in :class:`MqttProtocolError`, never another exception;
its ``reason`` is Malformed Packet (0x81), Protocol Error (0x82), Packet Too Large (0x95,
raised as soon as the fixed header announces a packet over ``max_packet_size``, before its
bytes are buffered) or Unsupported Protocol Version (0x84). After one the connection must be
closed. Encoding an invalid packet (a value out of range, a 5.0-only packet under 3.1.1) is
a programming error: ValueError.
"""

from __future__ import annotations

from orbitmq.protocol.mqtt.codes import (
    MQTT_5,
    MQTT_311,
    MqttProtocolError,
    PacketType,
    ReasonCode,
    malformed,
    protocol_error,
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
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from orbitmq.protocol.mqtt.properties import WILL, Properties, decode_properties, encode_properties
from orbitmq.protocol.mqtt.wire import (
    MAX_VARINT,
    Reader,
    decode_varint,
    encode_binary,
    encode_string,
    encode_varint,
    u16,
)

DEFAULT_MAX_PACKET_SIZE = 1024 * 1024
"""What a server accepts unless configured otherwise (5.0 allows up to 268,435,460)."""
MAX_PACKET_SIZE = 1 + 4 + MAX_VARINT
_PROTOCOL_NAME = b"\x00\x04MQTT"
_FIXED_FLAGS: dict[int, int] = {
    PacketType.PUBREL: 2,
    PacketType.SUBSCRIBE: 2,
    PacketType.UNSUBSCRIBE: 2,
}
_ACK_TYPES: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {
    PacketType.PUBACK: PubAck,
    PacketType.PUBREC: PubRec,
    PacketType.PUBREL: PubRel,
    PacketType.PUBCOMP: PubComp,
}


# --- encoding ------------------------------------------------------------------------------


def _packet_id(value: int | None) -> bytes:
    if value is None or not 1 <= value <= 0xFFFF:
        raise ValueError(f"packet identifier {value} outside 1..65535")
    return u16(value)


def _props(version: int, props: Properties, packet: int) -> bytes:
    return encode_properties(props, packet) if version == MQTT_5 else b""


def _check_reasons(ptype: int, codes: tuple[int, ...], version: int) -> bytes:
    for code in codes:
        if not reason_allowed(ptype, code, version):
            raise ValueError(f"reason code 0x{code:02X} is not one of packet type {ptype}")
    return bytes(codes)


def _qos(qos: int) -> int:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS {qos} is not 0, 1 or 2")
    return qos


def _connect(p: Connect, version: int) -> bytes:
    if p.protocol_level not in (MQTT_311, MQTT_5):
        raise ValueError(f"protocol level {p.protocol_level} is not 4 or 5")
    version = p.protocol_level
    flags = 0x02 if p.clean_start else 0
    payload = bytearray(encode_string(p.client_id))
    if p.will is not None:
        w = p.will
        flags |= 0x04 | _qos(w.qos) << 3 | (0x20 if w.retain else 0)
        payload += _props(version, w.properties, WILL)
        payload += encode_string(w.topic) + encode_binary(w.payload)
    if p.username is not None:
        flags |= 0x80
        payload += encode_string(p.username)
    if p.password is not None:
        if version == MQTT_311 and p.username is None:
            raise ValueError("3.1.1 allows a password only with a user name")
        flags |= 0x40
        payload += encode_binary(p.password)
    head = _PROTOCOL_NAME + bytes((version, flags)) + u16(p.keep_alive)
    return head + _props(version, p.properties, PacketType.CONNECT) + bytes(payload)


def _body(p: Packet, version: int) -> tuple[int, bytes]:
    """(flags, variable header + payload)."""
    if isinstance(p, Publish):
        flags = _qos(p.qos) << 1 | (8 if p.dup else 0) | (1 if p.retain else 0)
        if p.qos == 0 and (p.dup or p.packet_id is not None):
            raise ValueError("a QoS 0 PUBLISH has no packet identifier and no DUP")
        body = encode_string(p.topic) + (_packet_id(p.packet_id) if p.qos else b"")
        return flags, body + _props(version, p.properties, PacketType.PUBLISH) + bytes(p.payload)
    if isinstance(p, PubAck | PubRec | PubRel | PubComp):
        body = _packet_id(p.packet_id)
        if version == MQTT_5 and (p.reason_code or p.properties):
            body += _check_reasons(p.TYPE, (p.reason_code,), version)
            if p.properties:
                body += encode_properties(p.properties, p.TYPE)
        return _FIXED_FLAGS.get(p.TYPE, 0), body
    if isinstance(p, Connect):
        return 0, _connect(p, version)
    if isinstance(p, Connack):
        head = bytes((1 if p.session_present else 0,))
        head += _check_reasons(p.TYPE, (p.reason_code,), version)
        return 0, head + _props(version, p.properties, PacketType.CONNACK)
    if isinstance(p, Subscribe):
        if not p.subscriptions:
            raise ValueError("SUBSCRIBE needs at least one subscription")
        body = _packet_id(p.packet_id) + _props(version, p.properties, PacketType.SUBSCRIBE)
        for s in p.subscriptions:
            opts = _qos(s.qos)
            if version == MQTT_5:
                if s.retain_handling not in (0, 1, 2):
                    raise ValueError(f"retain handling {s.retain_handling} is not 0, 1 or 2")
                opts |= (4 if s.no_local else 0) | (8 if s.retain_as_published else 0)
                opts |= s.retain_handling << 4
            body += encode_string(s.filter) + bytes((opts,))
        return 2, body
    if isinstance(p, Suback):
        body = _packet_id(p.packet_id) + _props(version, p.properties, PacketType.SUBACK)
        return 0, body + _check_reasons(p.TYPE, p.reason_codes, version)
    if isinstance(p, Unsubscribe):
        if not p.filters:
            raise ValueError("UNSUBSCRIBE needs at least one topic filter")
        body = _packet_id(p.packet_id) + _props(version, p.properties, PacketType.UNSUBSCRIBE)
        return 2, body + b"".join(encode_string(f) for f in p.filters)
    if isinstance(p, Unsuback):
        body = _packet_id(p.packet_id)
        if version == MQTT_5:
            body += encode_properties(p.properties, PacketType.UNSUBACK)
            body += _check_reasons(p.TYPE, p.reason_codes, version)
        return 0, body
    if isinstance(p, PingReq | PingResp):
        return 0, b""
    if isinstance(p, Disconnect | Auth):
        if version != MQTT_5:
            if isinstance(p, Auth):
                raise ValueError("AUTH exists only in MQTT 5.0")
            return 0, b""
        if not p.reason_code and not p.properties:
            return 0, b""
        # like an ack's, the Property Length may be left out when there are none (§3.14.2.2)
        props = encode_properties(p.properties, p.TYPE) if p.properties else b""
        return 0, _check_reasons(p.TYPE, (p.reason_code,), version) + props
    raise TypeError(f"not an MQTT packet: {p!r}")


def encode(packet: Packet, version: int = MQTT_5) -> bytes:
    """The packet's bytes under protocol level ``version`` (a CONNECT uses its own level)."""
    if version not in (MQTT_311, MQTT_5):
        raise ValueError(f"protocol level {version} is not 4 or 5")
    flags, body = _body(packet, version)
    return bytes((packet.TYPE << 4 | flags,)) + encode_varint(len(body)) + body


# --- decoding ------------------------------------------------------------------------------


def _decode_connect(r: Reader) -> Connect:
    name = r.binary()
    level = r.byte()
    if name != b"MQTT" or level not in (MQTT_311, MQTT_5):
        if name in (b"MQTT", b"MQIsdp"):
            raise MqttProtocolError(
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol level {level}"
            )
        raise malformed(f"protocol name {name!r}")
    flags = r.byte()
    if flags & 0x01:
        raise malformed("CONNECT reserved flag is set")
    will_flag, will_qos, will_retain = flags & 0x04, flags >> 3 & 3, bool(flags & 0x20)
    if will_qos == 3 or (not will_flag and (will_qos or will_retain)):
        raise malformed("will QoS/retain set wrongly")
    has_user, has_password = flags & 0x80, flags & 0x40
    if level == MQTT_311 and has_password and not has_user:
        raise malformed("3.1.1: password flag without user name flag")
    keep_alive = r.u16()
    props = decode_properties(r, PacketType.CONNECT) if level == MQTT_5 else {}
    client_id = r.string()
    will = None
    if will_flag:
        will_props = decode_properties(r, WILL) if level == MQTT_5 else {}
        will = Will(r.string(), r.binary(), will_qos, will_retain, will_props)
    username = r.string() if has_user else None
    password = r.binary() if has_password else None
    r.done()
    return Connect(
        client_id, level, bool(flags & 0x02), keep_alive, username, password, will, props
    )


def _reason(r: Reader, ptype: int, version: int = MQTT_5) -> int:
    code = r.byte()
    if not reason_allowed(ptype, code, version):
        raise malformed(f"reason code 0x{code:02X} is not one of packet type {ptype}")
    return code


def _reasons(r: Reader, ptype: int, version: int) -> tuple[int, ...]:
    codes = tuple(r.rest())
    for code in codes:
        if not reason_allowed(ptype, code, version):
            raise malformed(f"reason code 0x{code:02X} is not one of packet type {ptype}")
    return codes


def _nonzero_id(r: Reader) -> int:
    pid = r.u16()
    if pid == 0:
        raise malformed("packet identifier 0")
    return pid


def _decode_subscribe(r: Reader, version: int) -> Subscribe:
    pid = _nonzero_id(r)
    props = decode_properties(r, PacketType.SUBSCRIBE) if version == MQTT_5 else {}
    if len(props.get(0x0B, ())) > 1:
        raise protocol_error("SUBSCRIBE with more than one subscription identifier")
    subs: list[Subscription] = []
    while r.remaining:
        topic = r.string()
        opts = r.byte()
        qos, handling = opts & 3, opts >> 4 & 3
        if qos == 3 or handling == 3 or opts & 0xC0 or (version == MQTT_311 and opts & 0xFC):
            raise malformed(f"subscription options 0x{opts:02X}")
        subs.append(Subscription(topic, qos, bool(opts & 4), bool(opts & 8), handling))
    if not subs:
        raise protocol_error("SUBSCRIBE without a topic filter")
    return Subscribe(pid, tuple(subs), props)


def _decode_body(ptype: int, flags: int, r: Reader, version: int) -> Packet:
    v5 = version == MQTT_5
    if ptype == PacketType.PUBLISH:
        qos = flags >> 1 & 3
        topic = r.string()
        pid = _nonzero_id(r) if qos else None
        props = decode_properties(r, PacketType.PUBLISH) if v5 else {}
        return Publish(topic, r.rest(), qos, bool(flags & 1), bool(flags & 8), pid, props)
    if ptype in _ACK_TYPES:
        pid = _nonzero_id(r)
        code, props = 0, {}
        if v5 and r.remaining:
            code = _reason(r, ptype)
            if r.remaining:
                props = decode_properties(r, ptype)
        r.done()
        return _ACK_TYPES[ptype](pid, code, props)
    if ptype == PacketType.CONNACK:
        ack_flags = r.byte()
        if ack_flags & 0xFE:
            raise malformed("CONNACK reserved flags are set")
        code = _reason(r, ptype, version)
        props = decode_properties(r, PacketType.CONNACK) if v5 else {}
        r.done()
        return Connack(bool(ack_flags), code, props)
    if ptype == PacketType.SUBSCRIBE:
        return _decode_subscribe(r, version)
    if ptype == PacketType.SUBACK:
        pid = _nonzero_id(r)
        props = decode_properties(r, PacketType.SUBACK) if v5 else {}
        codes = _reasons(r, ptype, version)
        return Suback(pid, codes, props)
    if ptype == PacketType.UNSUBSCRIBE:
        pid = _nonzero_id(r)
        props = decode_properties(r, PacketType.UNSUBSCRIBE) if v5 else {}
        filters: list[str] = []
        while r.remaining:
            filters.append(r.string())
        if not filters:
            raise protocol_error("UNSUBSCRIBE without a topic filter")
        return Unsubscribe(pid, tuple(filters), props)
    if ptype == PacketType.UNSUBACK:
        pid = _nonzero_id(r)
        if not v5:
            r.done()
            return Unsuback(pid)
        props = decode_properties(r, PacketType.UNSUBACK)
        codes = _reasons(r, ptype, version)
        return Unsuback(pid, codes, props)
    if ptype in (PacketType.PINGREQ, PacketType.PINGRESP):
        r.done()
        return PingReq() if ptype == PacketType.PINGREQ else PingResp()
    # DISCONNECT, AUTH
    code, props = 0, {}
    if v5 and r.remaining:
        code = _reason(r, ptype)
        if r.remaining:
            props = decode_properties(r, ptype)
    r.done()
    return Disconnect(code, props) if ptype == PacketType.DISCONNECT else Auth(code, props)


class MqttDecoder:
    """Feed it bytes as they arrive, split anywhere; it returns every complete packet.

    ``version`` None (a server before CONNECT) is learnt from the first CONNECT; until then
    only a CONNECT can be decoded (anything else is a Protocol Error). ``max_packet_size``
    bounds the whole packet, fixed header included (5.0 §3.1.2.11.4).
    """

    def __init__(
        self, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE, version: int | None = None
    ) -> None:
        if version not in (None, MQTT_311, MQTT_5):
            raise ValueError(f"protocol level {version} is not 4 or 5")
        self.max_packet_size = min(max_packet_size, MAX_PACKET_SIZE)
        self.version = version
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        buf = self._buf
        buf += data
        packets: list[Packet] = []
        pos = 0
        try:
            while len(buf) - pos >= 2:
                got = decode_varint(buf, pos + 1)
                if got is None:
                    break
                length, start = got
                if start - pos + length > self.max_packet_size:
                    raise MqttProtocolError(
                        ReasonCode.PACKET_TOO_LARGE,
                        f"packet of {start - pos + length} bytes over {self.max_packet_size}",
                    )
                if len(buf) - start < length:
                    break
                packets.append(self._decode(buf[pos], bytes(buf[start : start + length])))
                pos = start + length
        except MqttProtocolError as exc:
            exc.decoded = list(packets)  # a CONNECT before the bad bytes says how to answer
            raise
        finally:
            if pos:
                del buf[:pos]
        return packets

    def _decode(self, first: int, body: bytes) -> Packet:
        ptype, flags = first >> 4, first & 0x0F
        if ptype == 0 or (ptype == PacketType.AUTH and self.version == MQTT_311):
            raise malformed(f"reserved packet type {ptype}")
        if ptype == PacketType.PUBLISH:
            if flags & 0x06 == 0x06:
                raise malformed("PUBLISH with QoS 3")
            if not flags & 0x06 and flags & 0x08:
                raise malformed("QoS 0 PUBLISH with DUP set")
        elif flags != _FIXED_FLAGS.get(ptype, 0):
            raise malformed(f"packet type {ptype} with flags 0b{flags:04b}")
        if ptype == PacketType.CONNECT:
            connect = _decode_connect(Reader(body))
            if self.version is None:
                self.version = connect.protocol_level
            return connect
        if self.version is None:
            raise protocol_error(f"packet type {ptype} before CONNECT")
        return _decode_body(ptype, flags, Reader(body), self.version)


def decode_one(data: bytes, version: int = MQTT_5) -> Packet:
    """The single packet that ``data`` holds exactly (for tests and tools)."""
    decoder = MqttDecoder(MAX_PACKET_SIZE, version)
    packets = decoder.feed(data)
    if len(packets) != 1 or decoder.buffered:
        raise malformed("not exactly one packet")
    return packets[0]
