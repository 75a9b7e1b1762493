"""The state machine's rules for AUTH (5.0 §4.12, §3.15): only inside an exchange the CONNECT
started with an Authentication Method, naming that method, 0x18 only when asked for, 0x19
only when connected and idle; AUTH passes while other packets wait for the CONNACK."""

from __future__ import annotations

from typing import Any

import pytest

from orbitmq.protocol.mqtt import packets as p
from orbitmq.protocol.mqtt.codec import MqttDecoder, encode
from orbitmq.protocol.mqtt.codes import MQTT_5, ReasonCode
from orbitmq.protocol.mqtt.connection import (
    AuthRequested,
    Closed,
    ConnectRequested,
    Event,
    ServerConnection,
    SubscribeRequested,
)
from orbitmq.protocol.mqtt.properties import Prop

M = {Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-256"}


def feed(conn: ServerConnection, *packets: p.Packet) -> list[Event]:
    return conn.receive_data(b"".join(encode(x, MQTT_5) for x in packets), 0)


def connecting(props: dict[int, Any]) -> ServerConnection:
    conn = ServerConnection()
    assert [type(e) for e in feed(conn, p.Connect("c", MQTT_5, properties=props))] == [
        ConnectRequested
    ]
    return conn


def closed_with(events: list[Event]) -> list[p.Packet]:
    [ev] = events
    assert isinstance(ev, Closed)
    return MqttDecoder(version=MQTT_5).feed(ev.data)


def test_exchange_passes_auth_and_holds_the_rest() -> None:
    conn = connecting({**M, Prop.AUTHENTICATION_DATA: b"n,,n=u,r=x"})
    conn.send(p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M))
    sub = p.Subscribe(1, (p.Subscription("a", 1),))
    events = feed(conn, p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M), sub)
    assert [type(e) for e in events] == [AuthRequested]
    events = conn.accept(properties=M)
    assert isinstance(events[1], SubscribeRequested)
    # re-authentication when connected: 0x19, our 0x18, the client's 0x18
    assert [type(e) for e in feed(conn, p.Auth(ReasonCode.RE_AUTHENTICATE, M))] == [AuthRequested]
    conn.send(p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M))
    events = feed(conn, p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M))
    assert [type(e) for e in events] == [AuthRequested]
    conn.send(p.Auth(ReasonCode.SUCCESS, M))
    [bye] = closed_with(feed(conn, p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M)))
    assert bye == p.Disconnect(ReasonCode.PROTOCOL_ERROR)  # not asked for


@pytest.mark.parametrize(
    ("auth", "reason"),
    [
        (p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, M), ReasonCode.PROTOCOL_ERROR),  # unasked
        (p.Auth(ReasonCode.RE_AUTHENTICATE, M), ReasonCode.PROTOCOL_ERROR),  # not connected
        (p.Auth(ReasonCode.SUCCESS, M), ReasonCode.PROTOCOL_ERROR),  # a client never sends it
        (p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, {Prop.AUTHENTICATION_METHOD: "X"}),
         ReasonCode.BAD_AUTHENTICATION_METHOD),
        (p.Auth(ReasonCode.CONTINUE_AUTHENTICATION, {}), ReasonCode.PROTOCOL_ERROR),
    ],
)  # fmt: skip
def test_auth_errors_while_connecting(auth: p.Auth, reason: ReasonCode) -> None:
    conn = connecting(M)
    [ack] = closed_with(feed(conn, auth))
    assert isinstance(ack, p.Connack) and ack.reason_code == reason


def test_auth_without_a_method_in_connect() -> None:
    conn = connecting({})
    conn.accept()
    [bye] = closed_with(feed(conn, p.Auth(ReasonCode.RE_AUTHENTICATE, M)))
    assert bye == p.Disconnect(ReasonCode.PROTOCOL_ERROR)
