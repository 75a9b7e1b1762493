"""The server-side MQTT connection state machine: QoS flows both ways, limits, aliases, errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.protocol.mqtt import packets as p
from orbitmq.protocol.mqtt.codec import MqttDecoder, encode
from orbitmq.protocol.mqtt.codes import MQTT_5, MQTT_311, ReasonCode
from orbitmq.protocol.mqtt.connection import (
    Closed,
    ConnectRequested,
    Delivered,
    Disconnected,
    Event,
    MessageReceived,
    Released,
    Send,
    ServerConnection,
    State,
    SubscribeRequested,
    WindowFullError,
)
from orbitmq.protocol.mqtt.properties import Prop

from .strategies import packets


def decode(data: bytes, version: int) -> list[p.Packet]:
    return MqttDecoder(version=version).feed(data)


def sent(events: list[Event], version: int) -> list[p.Packet]:
    return decode(b"".join(e.data for e in events if isinstance(e, Send)), version)


def connected(
    version: int = MQTT_5, props: dict[int, Any] | None = None, **limits: Any
) -> ServerConnection:
    conn = ServerConnection(**limits)
    events = conn.receive_data(encode(p.Connect("dev1", version, properties=props or {})), 0)
    assert [type(e) for e in events] == [ConnectRequested]
    events = conn.accept()
    [connack] = sent(events, version)
    assert isinstance(connack, p.Connack) and connack.reason_code == 0
    assert conn.state is State.CONNECTED
    return conn


def feed(conn: ServerConnection, packet: p.Packet, now_ms: int = 0) -> list[Event]:
    return conn.receive_data(encode(packet, conn.version or MQTT_5), now_ms)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_inbound_qos1(version: int) -> None:
    conn = connected(version)
    [ev] = feed(conn, p.Publish("a/b", b"x", 1, packet_id=7))
    assert isinstance(ev, MessageReceived) and ev.publish.topic == "a/b"
    assert conn.inbound_in_flight == 1
    assert decode(conn.acknowledge(7), version) == [p.PubAck(7)]
    assert conn.inbound_in_flight == 0
    with pytest.raises(ValueError):
        conn.acknowledge(7)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_inbound_qos2_method_b(version: int) -> None:
    conn = connected(version)
    [ev] = feed(conn, p.Publish("a", b"x", 2, packet_id=9))
    assert isinstance(ev, MessageReceived)
    assert feed(conn, p.Publish("a", b"x", 2, dup=True, packet_id=9)) == []  # being stored
    assert decode(conn.acknowledge(9), version) == [p.PubRec(9)]
    # a resend after the PUBREC: answered again, not handed on again
    again = feed(conn, p.Publish("a", b"x", 2, dup=True, packet_id=9))
    assert sent(again, version) == [p.PubRec(9)] and len(again) == 1
    events = feed(conn, p.PubRel(9))
    assert sent(events, version) == [p.PubComp(9)] and Released(9) in events
    assert conn.inbound_in_flight == 0
    # an unknown PUBREL still gets a PUBCOMP (5.0: 0x92)
    [unknown] = sent(feed(conn, p.PubRel(9)), version)
    code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if version == MQTT_5 else 0
    assert unknown == p.PubComp(9, code)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_outbound_qos1_and_qos2(version: int) -> None:
    conn = connected(version)
    got = conn.publish("t/1", b"a", 1)
    assert got is not None
    pid1, data = got
    assert decode(data, version) == [p.Publish("t/1", b"a", 1, packet_id=pid1)]
    got = conn.publish("t/2", b"b", 2)
    assert got is not None
    pid2 = got[0]
    assert pid1 != pid2 and conn.outbound_in_flight == {pid1: "puback", pid2: "pubrec"}
    assert feed(conn, p.PubAck(pid1)) == [Delivered(pid1)]
    assert feed(conn, p.PubAck(pid1)) == []  # repeated
    events = feed(conn, p.PubRec(pid2))
    assert sent(events, version) == [p.PubRel(pid2)]
    assert sent(feed(conn, p.PubRec(pid2)), version) == [p.PubRel(pid2)]  # PUBREL was lost
    assert feed(conn, p.PubComp(pid2)) == [Delivered(pid2)]
    assert conn.outbound_in_flight == {}
    assert conn.publish("t", b"", 0) == (None, encode(p.Publish("t"), version))


def test_outbound_pubrec_error_ends_the_flow() -> None:
    conn = connected()
    got = conn.publish("t", b"", 2)
    assert got is not None
    assert feed(conn, p.PubRec(got[0], ReasonCode.QUOTA_EXCEEDED)) == [
        Delivered(got[0], ReasonCode.QUOTA_EXCEEDED)
    ]


def test_client_receive_maximum_limits_outbound() -> None:
    conn = connected(props={Prop.RECEIVE_MAXIMUM: 2})
    ids = [conn.publish("t", b"", 1) for _ in range(2)]
    assert conn.send_quota == 0
    with pytest.raises(WindowFullError):
        conn.publish("t", b"", 1)
    conn.publish("t", b"", 0)  # QoS 0 is not counted
    first = ids[0]
    assert first is not None and first[0] is not None
    feed(conn, p.PubAck(first[0]))
    assert conn.send_quota == 1


def test_inbound_receive_maximum_exceeded() -> None:
    conn = connected(receive_maximum=2)
    feed(conn, p.Publish("t", b"", 1, packet_id=1))
    feed(conn, p.Publish("t", b"", 2, packet_id=2))
    [ev] = feed(conn, p.Publish("t", b"", 1, packet_id=3))
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    assert decode(ev.data, MQTT_5) == [p.Disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)]
    assert conn.closed and conn.receive_data(b"\xc0\x00", 0) == []


def test_connack_announces_limits() -> None:
    conn = ServerConnection(receive_maximum=10, topic_alias_maximum=5, max_packet_size=4096)
    conn.receive_data(encode(p.Connect("c")), 0)
    [connack] = sent(conn.accept(True, {Prop.RETAIN_AVAILABLE: 1}), MQTT_5)
    assert connack == p.Connack(
        True,
        0,
        {
            Prop.RECEIVE_MAXIMUM: 10,
            Prop.TOPIC_ALIAS_MAXIMUM: 5,
            Prop.MAXIMUM_PACKET_SIZE: 4096,
            Prop.RETAIN_AVAILABLE: 1,
        },
    )


def test_inbound_topic_aliases() -> None:
    conn = connected(topic_alias_maximum=2)
    [ev] = feed(conn, p.Publish("plant/temp", b"1", properties={Prop.TOPIC_ALIAS: 2}))
    assert isinstance(ev, MessageReceived) and ev.publish.properties == {}
    [ev] = feed(conn, p.Publish("", b"2", properties={Prop.TOPIC_ALIAS: 2}))
    assert isinstance(ev, MessageReceived) and ev.publish.topic == "plant/temp"


@pytest.mark.parametrize(
    ("publish", "reason"),
    [
        (p.Publish("a", properties={Prop.TOPIC_ALIAS: 3}), ReasonCode.TOPIC_ALIAS_INVALID),
        (p.Publish("", properties={Prop.TOPIC_ALIAS: 1}), ReasonCode.PROTOCOL_ERROR),
        (p.Publish(""), ReasonCode.PROTOCOL_ERROR),
        (p.Publish("a/+"), ReasonCode.TOPIC_NAME_INVALID),
    ],
)
def test_inbound_alias_and_topic_errors(publish: p.Publish, reason: ReasonCode) -> None:
    conn = connected(topic_alias_maximum=2)
    [ev] = feed(conn, publish)
    assert isinstance(ev, Closed) and ev.reason == reason
    assert decode(ev.data, MQTT_5) == [p.Disconnect(reason)]


def test_alias_refused_when_server_allows_none() -> None:
    conn = connected()
    [ev] = feed(conn, p.Publish("a", properties={Prop.TOPIC_ALIAS: 1}))
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.TOPIC_ALIAS_INVALID


def test_outbound_topic_aliases() -> None:
    conn = connected(props={Prop.TOPIC_ALIAS_MAXIMUM: 1})
    out = [conn.publish(t, b"", 0) for t in ("a/b", "a/b", "c")]
    pubs = [decode(o[1], MQTT_5)[0] for o in out if o is not None]
    assert pubs[0] == p.Publish("a/b", properties={Prop.TOPIC_ALIAS: 1})
    assert pubs[1] == p.Publish("", properties={Prop.TOPIC_ALIAS: 1})
    assert pubs[2] == p.Publish("c")  # the client's alias maximum is used up


def test_no_outbound_aliases_in_311_or_without_client_maximum() -> None:
    for conn in (connected(MQTT_311), connected()):
        out = conn.publish("a", b"", 0)
        assert out is not None and decode(out[1], conn.version or 5) == [p.Publish("a")]


def test_client_maximum_packet_size_drops_publish() -> None:
    conn = connected(props={Prop.MAXIMUM_PACKET_SIZE: 20})
    assert conn.publish("t", b"x" * 100, 1) is None
    assert conn.outbound_in_flight == {}
    assert conn.publish("t", b"x", 1) is not None


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_keep_alive_deadline(version: int) -> None:
    conn = ServerConnection()
    conn.receive_data(encode(p.Connect("c", version, keep_alive=10)), 1_000)
    assert conn.keep_alive_deadline_ms() is None  # not connected yet
    conn.accept()
    assert conn.keep_alive_deadline_ms() == 16_000
    assert sent(feed(conn, p.PingReq(), 5_000), version) == [p.PingResp()]
    assert conn.keep_alive_deadline_ms() == 20_000
    assert conn.check_keep_alive(19_999) is None
    closed = conn.check_keep_alive(20_000)
    assert closed is not None and closed.reason == ReasonCode.KEEP_ALIVE_TIMEOUT
    expected = [p.Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)] if version == MQTT_5 else []
    assert decode(closed.data, version) == expected


def test_server_keep_alive_and_zero() -> None:
    conn = connected(server_keep_alive=30)
    assert conn.keep_alive == 30
    conn = ServerConnection()
    conn.receive_data(encode(p.Connect("c", keep_alive=0)), 0)
    conn.accept()
    assert conn.keep_alive_deadline_ms() is None and conn.check_keep_alive(10**12) is None


def test_packets_before_connack_are_held() -> None:
    conn = ServerConnection()
    raw = encode(p.Connect("c")) + encode(p.Subscribe(1, (p.Subscription("a/#", 1),)))
    assert [type(e) for e in conn.receive_data(raw, 0)] == [ConnectRequested]
    events = conn.accept()
    assert isinstance(events[0], Send) and isinstance(events[1], SubscribeRequested)
    assert decode(conn.send(p.Suback(1, (1,))), MQTT_5) == [p.Suback(1, (1,))]


@pytest.mark.parametrize(
    ("version", "expected"),
    [(MQTT_5, [p.Disconnect(ReasonCode.PROTOCOL_ERROR)]), (MQTT_311, [])],
)
def test_second_connect_is_a_protocol_error(version: int, expected: list[p.Packet]) -> None:
    conn = connected(version)
    [ev] = feed(conn, p.Connect("again", version))
    assert isinstance(ev, Closed) and decode(ev.data, version) == expected


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_malformed_closes(version: int) -> None:
    conn = connected(version)
    [ev] = conn.receive_data(b"\x36\x00", 0)  # PUBLISH QoS 3
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.MALFORMED_PACKET
    expected = [p.Disconnect(ReasonCode.MALFORMED_PACKET)] if version == MQTT_5 else []
    assert decode(ev.data, version) == expected


def test_malformed_in_the_connect_read_answers_in_its_version() -> None:
    """A CONNECT and bad bytes in one read: the CONNECT still says how to answer."""
    conn = ServerConnection()
    [ev] = conn.receive_data(encode(p.Connect("c", MQTT_5)) + b"\x36\x00", 0)
    assert isinstance(ev, Closed) and decode(ev.data, MQTT_5) == [
        p.Connack(False, ReasonCode.MALFORMED_PACKET)
    ]


def test_packets_before_bad_bytes_are_handled_first() -> None:
    conn = connected(MQTT_5)
    events = conn.receive_data(encode(p.Publish("a/b", b"x", 1, packet_id=3)) + b"\x36\x00", 0)
    assert [type(e).__name__ for e in events] == ["MessageReceived", "Closed"]


def test_connect_errors_answer_with_connack() -> None:
    conn = ServerConnection()
    [ev] = conn.receive_data(bytes.fromhex("100c00064d514973647003020000") + b"", 0)
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert decode(ev.data, MQTT_311) == [p.Connack(False, 1)]
    conn = ServerConnection()
    [ev] = conn.receive_data(encode(p.Connect("", MQTT_311, clean_start=False)), 0)
    assert decode(ev.data, MQTT_311) == [p.Connack(False, 2)]  # identifier rejected
    conn = ServerConnection()
    [ev] = conn.receive_data(encode(p.Connect("c", will=p.Will("a/#"))), 0)
    assert decode(ev.data, MQTT_5) == [p.Connack(False, ReasonCode.TOPIC_NAME_INVALID)]


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_refuse(version: int) -> None:
    conn = ServerConnection()
    conn.receive_data(encode(p.Connect("c", version)), 0)
    data = conn.refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD)
    code = ReasonCode.BAD_USER_NAME_OR_PASSWORD if version == MQTT_5 else 4
    assert decode(data, version) == [p.Connack(False, code)] and conn.closed


def test_disconnect_and_session_expiry_rule() -> None:
    conn = connected()
    assert feed(conn, p.Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE)) == [
        Disconnected(p.Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    ]
    conn = connected()
    [ev] = feed(conn, p.Disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 5}))
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR


def test_shared_subscription_with_no_local_is_a_protocol_error() -> None:
    conn = connected()
    sub = p.Subscribe(1, (p.Subscription("$share/g/a", no_local=True),))
    [ev] = feed(conn, sub)
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR


def test_server_sent_packets_from_a_client_are_refused() -> None:
    conn = connected()
    [ev] = feed(conn, p.PingResp())
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR


def test_restore_resends_with_dup() -> None:
    conn = connected()
    data = conn.restore([p.Publish("t", b"x", 1, packet_id=5)], released=[6], inbound_qos2=[7])
    assert decode(data, MQTT_5) == [p.Publish("t", b"x", 1, dup=True, packet_id=5), p.PubRel(6)]
    assert conn.outbound_in_flight == {5: "puback", 6: "pubcomp"}
    got = conn.publish("t", b"", 1)
    assert got is not None and got[0] not in (5, 6)
    assert sent(feed(conn, p.PubRel(7)), MQTT_5) == [p.PubComp(7)]


def test_server_close() -> None:
    conn = connected()
    assert decode(conn.close(ReasonCode.SESSION_TAKEN_OVER), MQTT_5) == [
        p.Disconnect(ReasonCode.SESSION_TAKEN_OVER)
    ]
    assert connected(MQTT_311).close(ReasonCode.SESSION_TAKEN_OVER) == b""


def test_packet_id_in_use_for_qos1_resend_with_new_qos() -> None:
    conn = connected()
    feed(conn, p.Publish("t", b"", 1, packet_id=3))
    assert feed(conn, p.Publish("t", b"", 1, dup=True, packet_id=3)) == []  # resend
    [ev] = feed(conn, p.Publish("t", b"", 2, packet_id=3))
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR


def test_a_reason_disconnect_cannot_carry_becomes_protocol_error() -> None:
    conn = connected()
    bad = bytes.fromhex("100c00044d5154540600000a00000000")  # CONNECT with level 6
    [ev] = conn.receive_data(bad, 0)
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert decode(ev.data, MQTT_5) == [p.Disconnect(ReasonCode.PROTOCOL_ERROR)]


def test_client_publish_with_subscription_identifier() -> None:
    packet = p.Publish("t", properties={Prop.SUBSCRIPTION_IDENTIFIER: (1,)})
    [ev] = feed(connected(), packet)
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR


def test_authentication_data_without_method() -> None:
    conn = ServerConnection()
    connect = p.Connect("c", properties={Prop.AUTHENTICATION_DATA: b"x"})
    [ev] = conn.receive_data(encode(connect), 0)
    assert isinstance(ev, Closed) and ev.reason == ReasonCode.PROTOCOL_ERROR
    assert decode(ev.data, MQTT_5) == [p.Connack(False, ReasonCode.PROTOCOL_ERROR)]


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_packet_sequence_gives_events_never_exceptions(
    version: int, data: st.DataObject
) -> None:
    conn = connected(version, topic_alias_maximum=2, receive_maximum=3)
    stream = data.draw(st.lists(packets(version), max_size=8))
    for packet in stream:
        events = feed(conn, packet)
        for ev in events:
            pid = ev.publish.packet_id if isinstance(ev, MessageReceived) else None
            if pid is not None and data.draw(st.booleans()):
                conn.acknowledge(pid)
        if conn.closed:
            break
        if data.draw(st.booleans()) and conn.send_quota:
            conn.publish("out", b"", data.draw(st.integers(0, 2)))
    conn.receive_data(data.draw(st.binary(max_size=32)), 0)  # garbage at the end: no raise
