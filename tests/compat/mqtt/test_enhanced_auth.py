"""MQTT 5.0 enhanced authentication (§4.12): SCRAM-SHA-256 against the ACL users over
CONNECT / AUTH / CONNACK, re-authentication with AUTH 0x19, and the refusals: an unsupported
method (CONNACK 0x8C, also from paho-mqtt), a wrong secret (0x86), AUTH outside an exchange
(DISCONNECT 0x82). paho-mqtt 2.x sends an Authentication Method in CONNECT but has no AUTH
handling, so the exchange itself is driven with raw packets (the OrbitMQ codec)."""

from __future__ import annotations

import base64
import secrets
import threading
from pathlib import Path
from typing import Any

import pytest

from orbitmq.auth.scram import METHOD, client_proof
from orbitmq.protocol.mqtt.packets import Auth, Connack, Connect, Disconnect, PubAck, Publish
from orbitmq.protocol.mqtt.properties import Prop
from tests.compat.mqtt.conftest import MqttServer, mqtt
from tests.compat.mqtt.test_acl import SECRET, Raw, secured, store_file  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


def start(raw: Raw, user: str, first: Any = None) -> tuple[str, Any]:
    bare = f"n={user},r={secrets.token_urlsafe(12)}"
    props = {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: f"n,,{bare}".encode()}
    raw.send(first(props) if first else Connect(f"scram-{user}", 5, True, 30, properties=props))
    got = raw.expect(Auth)
    return bare, got


def scram_connect(raw: Raw, user: str, secret: str) -> Connack:
    bare, auth = start(raw, user)
    assert isinstance(auth, Auth) and auth.reason_code == 0x18
    assert auth.properties[Prop.AUTHENTICATION_METHOD] == METHOD
    server_first = auth.properties[Prop.AUTHENTICATION_DATA].decode()
    final, server_sig = client_proof(user, secret, bare, server_first)
    props = {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: final.encode()}
    raw.send(Auth(0x18, props))
    ack = raw.expect(Connack)
    assert isinstance(ack, Connack)
    if ack.reason_code == 0:
        want = b"v=" + base64.b64encode(server_sig)
        assert ack.properties[Prop.AUTHENTICATION_DATA] == want  # the server knows the secret
    return ack


def test_scram_connect_reauthenticate_and_policies(secured: MqttServer) -> None:  # noqa: F811
    raw = Raw(secured.port, 5)
    try:
        assert scram_connect(raw, "sensor-7", SECRET).reason_code == 0
        raw.send(Publish("plant/t", b"x", 1, packet_id=1))
        ack = raw.expect(PubAck)
        assert isinstance(ack, PubAck) and ack.reason_code == 0  # the user's policy applies
        raw.send(Publish("other/t", b"x", 1, packet_id=2))
        ack = raw.expect(PubAck)
        assert isinstance(ack, PubAck) and ack.reason_code == 0x87
        # re-authentication: AUTH 0x19 (client-first), 0x18 (server-first), 0x18, 0x00
        bare, auth = start(raw, "sensor-7", lambda p: Auth(0x19, p))
        assert isinstance(auth, Auth) and auth.reason_code == 0x18
        final, sig = client_proof("sensor-7", SECRET, bare,
                                  auth.properties[Prop.AUTHENTICATION_DATA].decode())  # fmt: skip
        raw.send(Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD,
                             Prop.AUTHENTICATION_DATA: final.encode()}))  # fmt: skip
        done = raw.expect(Auth)
        assert isinstance(done, Auth) and done.reason_code == 0
        assert done.properties[Prop.AUTHENTICATION_DATA] == b"v=" + base64.b64encode(sig)
        # re-authenticating with a wrong secret ends the connection with 0x87
        bare, auth = start(raw, "sensor-7", lambda p: Auth(0x19, p))
        assert isinstance(auth, Auth)
        final, _ = client_proof("sensor-7", "wrong", bare,
                                auth.properties[Prop.AUTHENTICATION_DATA].decode())  # fmt: skip
        raw.send(Auth(0x18, {Prop.AUTHENTICATION_METHOD: METHOD,
                             Prop.AUTHENTICATION_DATA: final.encode()}))  # fmt: skip
        bye = raw.expect(Disconnect)
        assert isinstance(bye, Disconnect) and bye.reason_code == 0x87
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("user", "secret"), [("sensor-7", "wrong"), ("nobody", SECRET), ("off-duty", "off-duty-secret")]
)
def test_scram_refusals(secured: MqttServer, user: str, secret: str) -> None:  # noqa: F811
    raw = Raw(secured.port, 5)
    try:
        assert scram_connect(raw, user, secret).reason_code == 0x86
    finally:
        raw.close()


def test_unsupported_method_and_auth_outside_an_exchange(secured: MqttServer) -> None:  # noqa: F811
    raw = Raw(secured.port, 5)
    try:  # a method we do not speak
        props = {Prop.AUTHENTICATION_METHOD: "KERBEROS", Prop.AUTHENTICATION_DATA: b"x"}
        raw.send(Connect("k", 5, True, 30, properties=props))
        ack = raw.expect(Connack)
        assert isinstance(ack, Connack) and ack.reason_code == 0x8C
    finally:
        raw.close()
    raw = Raw(secured.port, 5)
    try:  # AUTH after a CONNECT without a method
        assert raw.connect("sensor-7", SECRET) == 0
        raw.send(Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))
        bye = raw.expect(Disconnect)
        assert isinstance(bye, Disconnect) and bye.reason_code == 0x82
    finally:
        raw.close()
    # paho-mqtt 2.x: a CONNECT naming an unsupported method is refused with 0x8C
    props_mod = pytest.importorskip("paho.mqtt.properties")
    packet_types = pytest.importorskip("paho.mqtt.packettypes").PacketTypes
    props = props_mod.Properties(packet_types.CONNECT)
    props.AuthenticationMethod = "GS2-KRB5"
    got: list[Any] = []
    done = threading.Event()

    def on_connect(_c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        got.append(rc)
        done.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5, client_id="p")
    c.on_connect = on_connect
    c.connect("127.0.0.1", secured.port, properties=props)
    c.loop_start()
    try:
        assert done.wait(10)
        assert got[0].value == 0x8C
    finally:
        c.disconnect()
        c.loop_stop()


def test_scram_needs_the_acl_users(tmp_path: Path) -> None:
    server = MqttServer(tmp_path)  # no broker authentication: no secrets to check against
    raw = Raw(server.port, 5)
    try:
        props = {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"n,,n=a,r=b"}
        raw.send(Connect("s", 5, True, 30, properties=props))
        ack = raw.expect(Connack)
        assert isinstance(ack, Connack) and ack.reason_code == 0x8C
    finally:
        raw.close()
        server.close()
