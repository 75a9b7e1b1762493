"""The MQTT codec: round trips in both versions, spec vectors, any split, garbage -> errors."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.protocol.mqtt import packets as p
from orbitmq.protocol.mqtt.codec import MqttDecoder, decode_one, encode
from orbitmq.protocol.mqtt.codes import MQTT_5, MQTT_311, MqttProtocolError, ReasonCode
from orbitmq.protocol.mqtt.properties import Prop
from orbitmq.protocol.mqtt.wire import decode_varint, encode_string, encode_varint

from .strategies import packets

# No deadline: the machine is shared, and a slow example is not a wrong one.
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@FAST
@given(data=st.data())
def test_round_trip_every_packet(version: int, data: st.DataObject) -> None:
    packet = data.draw(packets(version))
    raw = encode(packet, version)
    assert decode_one(raw, version) == packet


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@FAST
@given(data=st.data())
def test_any_split_of_a_stream(version: int, data: st.DataObject) -> None:
    stream = data.draw(st.lists(packets(version), min_size=1, max_size=6))
    raw = b"".join(encode(x, version) for x in stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    decoder = MqttDecoder(version=version)
    got: list[p.Packet] = []
    last = 0
    for cut in [*cuts, len(raw)]:
        got += decoder.feed(raw[last:cut])
        last = cut
    assert got == stream and decoder.buffered == 0


# --- byte-exact vectors from the specifications ---------------------------------------------

# MQTT 3.1.1 §2.2.3 Table 2.4 (and 5.0 §1.5.5 Table 1-1): Remaining Length values.
VARINTS = [
    (0, "00"),
    (127, "7f"),
    (128, "8001"),
    (16_383, "ff7f"),
    (16_384, "808001"),
    (2_097_151, "ffff7f"),
    (2_097_152, "80808001"),
    (268_435_455, "ffffff7f"),
]


@pytest.mark.parametrize(("value", "hex_"), VARINTS)
def test_variable_byte_integer_vectors(value: int, hex_: str) -> None:
    assert encode_varint(value).hex() == hex_
    assert decode_varint(bytes.fromhex(hex_), 0) == (value, len(hex_) // 2)


def test_variable_byte_integer_limits() -> None:
    with pytest.raises(ValueError):
        encode_varint(268_435_456)
    with pytest.raises(MqttProtocolError) as err:
        decode_varint(bytes.fromhex("ffffffff7f"), 0)
    assert err.value.reason == ReasonCode.MALFORMED_PACKET
    assert decode_varint(bytes.fromhex("ff"), 0) is None  # incomplete, wait for more


def test_utf8_string_vector() -> None:
    # 3.1.1 §1.5.3 Figure 1.3 / 5.0 §1.5.4 Figure 1-1: "A\U0002A6D4"
    assert encode_string("A\U0002a6d4").hex() == "000541f0aa9b94"
    with pytest.raises(ValueError):
        encode_string("a\x00b")
    with pytest.raises(ValueError):
        encode_string("\ud800")
    with pytest.raises(ValueError):
        encode_string("x" * 65_536)


def test_string_rules_on_decode() -> None:
    # PUBLISH whose topic holds U+0000, then one with an encoded surrogate (ED A0 80)
    for topic in ("0001" + "00", "0003" + "eda080"):
        raw = bytes.fromhex("30" + f"{len(topic) // 2:02x}" + topic)
        with pytest.raises(MqttProtocolError) as err:
            decode_one(raw, MQTT_311)
        assert err.value.reason == ReasonCode.MALFORMED_PACKET


CONNECT_311 = (
    # 3.1.1 §3.1.2.10 Figure 3.6: name "MQTT", level 4, flags 0xCE (user name, password,
    # will QoS 1, will, clean session), keep alive 10; then the payload of §3.1.3 in order.
    "101900044d51545404ce000a00016300017700016d000175000170"
)
CONNECT_5 = (
    # 5.0 §3.1.2.12 Figure 3-7 (variable header example): level 5, flags 0xCE, keep alive 10,
    # properties of length 5 holding Session Expiry Interval (0x11) = 10.
    "102000044d51545405ce000a05110000000a0001630000017700016d000175000170"
)


@pytest.mark.parametrize(
    ("version", "hex_", "packet"),
    [
        (
            MQTT_311,
            CONNECT_311,
            p.Connect("c", MQTT_311, True, 10, "u", b"p", p.Will("w", b"m", 1)),
        ),
        (
            MQTT_5,
            CONNECT_5,
            p.Connect(
                "c",
                MQTT_5,
                True,
                10,
                "u",
                b"p",
                p.Will("w", b"m", 1),
                {Prop.SESSION_EXPIRY_INTERVAL: 10},
            ),
        ),
        # 3.1.1 §3.3.2.3 Figure 3.11: topic "a/b", packet id 10 (QoS 1, empty payload)
        (MQTT_311, "32070003612f62000a", p.Publish("a/b", qos=1, packet_id=10)),
        # 5.0 §3.3.2.3 Figure 3-9: the same with a zero Property Length
        (MQTT_5, "32080003612f62000a00", p.Publish("a/b", qos=1, packet_id=10)),
        # 3.1.1 §3.12, §3.13, §3.14: PINGREQ, PINGRESP, DISCONNECT are two bytes
        (MQTT_311, "c000", p.PingReq()),
        (MQTT_311, "d000", p.PingResp()),
        (MQTT_311, "e000", p.Disconnect()),
        # 5.0 §3.14.2.1: reason 0 and no properties may be left out
        (MQTT_5, "e000", p.Disconnect()),
        (MQTT_5, "e0018e", p.Disconnect(ReasonCode.SESSION_TAKEN_OVER)),
        # 3.1.1 §3.6.1: PUBREL's fixed header flags are 0010
        (MQTT_311, "62021234", p.PubRel(0x1234)),
        # 3.1.1 §3.8.3 Figure 3.22: SUBSCRIBE "a/b" QoS 1, "c/d" QoS 2, packet id 10
        (
            MQTT_311,
            "820e000a0003612f62010003632f6402",
            p.Subscribe(10, (p.Subscription("a/b", 1), p.Subscription("c/d", 2))),
        ),
        # 3.1.1 §3.9.3 Figure 3.26: SUBACK codes 0, 1, 2, 0x80
        (MQTT_311, "9006000a00010280", p.Suback(10, (0, 1, 2, 0x80))),
        # 3.1.1 §3.10.3 Figure 3.30: UNSUBSCRIBE "a/b", "c/d"
        (MQTT_311, "a20c000a0003612f620003632f64", p.Unsubscribe(10, ("a/b", "c/d"))),
        # 3.1.1 §3.2: CONNACK session present 1, accepted
        (MQTT_311, "20020100", p.Connack(True, 0)),
    ],
)
def test_spec_vectors(version: int, hex_: str, packet: p.Packet) -> None:
    assert encode(packet, version).hex() == hex_
    assert decode_one(bytes.fromhex(hex_), version) == packet


def test_decoder_learns_version_from_connect() -> None:
    decoder = MqttDecoder()
    raw = bytes.fromhex(CONNECT_5) + encode(p.Publish("t", b"x", 1, packet_id=1), MQTT_5)
    got = decoder.feed(raw)
    assert decoder.version == MQTT_5 and isinstance(got[1], p.Publish)
    with pytest.raises(MqttProtocolError) as err:
        MqttDecoder().feed(bytes.fromhex("c000"))
    assert err.value.reason == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("hex_", "reason"),
    [
        ("100c00044d5154540600000a00000000", ReasonCode.UNSUPPORTED_PROTOCOL_VERSION),
        ("100c00044d515454040100000000", ReasonCode.MALFORMED_PACKET),  # reserved flag
        ("100c00044d5154540418003c0000", ReasonCode.MALFORMED_PACKET),  # will QoS w/o will
        ("100c00044d5154540440003c0000", ReasonCode.MALFORMED_PACKET),  # pw w/o user
    ],
)
def test_bad_connect(hex_: str, reason: ReasonCode) -> None:
    with pytest.raises(MqttProtocolError) as err:
        MqttDecoder().feed(bytes.fromhex(hex_))
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("hex_", "reason"),
    [
        ("3600", ReasonCode.MALFORMED_PACKET),  # PUBLISH QoS 3
        ("3803000174", ReasonCode.MALFORMED_PACKET),  # QoS 0 with DUP
        ("6002000a", ReasonCode.MALFORMED_PACKET),  # PUBREL flags 0000
        ("8002000a", ReasonCode.MALFORMED_PACKET),  # SUBSCRIBE flags 0000
        ("c00100", ReasonCode.MALFORMED_PACKET),  # PINGREQ with a body
        ("0000", ReasonCode.MALFORMED_PACKET),  # reserved type 0
        ("f000", ReasonCode.MALFORMED_PACKET),  # AUTH in 3.1.1
        ("8202000a", ReasonCode.PROTOCOL_ERROR),  # SUBSCRIBE without filters
        ("a202000a", ReasonCode.PROTOCOL_ERROR),  # UNSUBSCRIBE without filters
        ("8206000a00017403", ReasonCode.MALFORMED_PACKET),  # subscription QoS 3
        ("8206000a00017404", ReasonCode.MALFORMED_PACKET),  # 3.1.1: no-local bit
        ("40020000", ReasonCode.MALFORMED_PACKET),  # packet id 0
        ("32050001740000", ReasonCode.MALFORMED_PACKET),  # packet id 0
        ("4003000a00", ReasonCode.MALFORMED_PACKET),  # 3.1.1 PUBACK with a byte more
    ],
)
def test_malformed_311(hex_: str, reason: ReasonCode) -> None:
    with pytest.raises(MqttProtocolError) as err:
        MqttDecoder(version=MQTT_311).feed(bytes.fromhex(hex_))
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("hex_", "reason"),
    [
        ("4003000a7f", ReasonCode.MALFORMED_PACKET),  # unknown reason code
        ("32080001740001022100", ReasonCode.MALFORMED_PACKET),  # bad prop length
        ("32080001740001022101", ReasonCode.MALFORMED_PACKET),  # 0x21 in PUBLISH
        ("32080001740001020102", ReasonCode.PROTOCOL_ERROR),  # format 2
        ("320a00017400010401000101", ReasonCode.PROTOCOL_ERROR),  # duplicate
        ("32080001740001022300", ReasonCode.MALFORMED_PACKET),  # short
        ("3208000174000102ff00", ReasonCode.MALFORMED_PACKET),  # unknown id
        ("8207000a0000017430", ReasonCode.MALFORMED_PACKET),  # retain handling 3
        ("8207000a00000174c0", ReasonCode.MALFORMED_PACKET),  # reserved option bits
        ("820b000a040b010b0200017400", ReasonCode.PROTOCOL_ERROR),  # two sub ids
        ("8209000a020b0000017400", ReasonCode.PROTOCOL_ERROR),  # sub id 0
    ],
)
def test_malformed_5(hex_: str, reason: ReasonCode) -> None:
    with pytest.raises(MqttProtocolError) as err:
        MqttDecoder(version=MQTT_5).feed(bytes.fromhex(hex_))
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("hex_", "version"),
    [
        ("6203000a10", MQTT_5),  # PUBREL with 0x10 (a PUBACK code)
        ("f00180", MQTT_5),  # AUTH with 0x80
        ("e00118", MQTT_5),  # DISCONNECT with 0x18 (an AUTH code)
        ("900400010092", MQTT_5),  # SUBACK with 0x92
        ("20020006", MQTT_311),  # CONNACK return code 6
        ("9003000103", MQTT_311),  # SUBACK return code 3
    ],
)
def test_reason_codes_are_checked_per_packet_type(hex_: str, version: int) -> None:
    with pytest.raises(MqttProtocolError) as err:
        MqttDecoder(version=version).feed(bytes.fromhex(hex_))
    assert err.value.reason == ReasonCode.MALFORMED_PACKET
    with pytest.raises(ValueError):
        encode(p.Disconnect(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION))
    with pytest.raises(ValueError):
        encode(p.PubRel(1, ReasonCode.NO_MATCHING_SUBSCRIBERS))


def test_user_properties_and_subscription_ids_repeat() -> None:
    packet = p.Publish(
        "t",
        b"x",
        properties={
            Prop.USER_PROPERTY: (("a", "1"), ("a", "2")),
            Prop.SUBSCRIPTION_IDENTIFIER: (1, 7),
        },
    )
    assert decode_one(encode(packet)) == packet


def test_packet_too_large_before_the_bytes_arrive() -> None:
    decoder = MqttDecoder(max_packet_size=100, version=MQTT_5)
    with pytest.raises(MqttProtocolError) as err:
        decoder.feed(bytes.fromhex("30ff01"))  # announces 255 bytes
    assert err.value.reason == ReasonCode.PACKET_TOO_LARGE
    ok = MqttDecoder(max_packet_size=100, version=MQTT_5)
    assert ok.feed(encode(p.Publish("t", b"x" * 94))) != []  # 2 + 3 + 1 + 94 = 100


def test_encoder_refuses_invalid_packets() -> None:
    with pytest.raises(ValueError):
        encode(p.Publish("t", qos=1))  # no packet id
    with pytest.raises(ValueError):
        encode(p.Auth(), MQTT_311)
    with pytest.raises(ValueError):
        encode(p.Publish("t", properties={Prop.RECEIVE_MAXIMUM: 1}))
    with pytest.raises(ValueError):
        encode(p.Connect("c", MQTT_311, password=b"x"))


@pytest.mark.parametrize("version", [None, MQTT_311, MQTT_5])
@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=64))
def test_garbage_raises_protocol_error_only(version: int | None, data: bytes) -> None:
    decoder = MqttDecoder(max_packet_size=1024, version=version)
    try:
        for packet in decoder.feed(data):
            encode(packet, decoder.version or MQTT_5)  # what decodes, encodes
    except MqttProtocolError:
        pass


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_packets_raise_protocol_error_only(version: int, data: st.DataObject) -> None:
    raw = bytearray(encode(data.draw(packets(version)), version))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MqttProtocolError):
        MqttDecoder(version=version).feed(bytes(raw))
