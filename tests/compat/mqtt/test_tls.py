"""MQTT over TLS with paho-mqtt: port 8883 (here a free port), the three TLS modes on the MQTT
port, certificate reload, and mutual TLS where the certificate's principal is the MQTT user
(ACL users and policies of the broker). The PKI is made with ``cryptography`` (tests/net/pki.py).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.store import AuthStore
from tests.compat.mqtt.conftest import Client, MqttServer, mqtt
from tests.net.pki import Ca

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Ca, Path, Path]:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    return ca, cert, key


def tls_server(tmp_path: Path, pki: tuple[Ca, Path, Path], mode: str, **extra: Any) -> MqttServer:
    _ca, cert, key = pki
    return MqttServer(
        tmp_path, tls_mode=mode, tls_cert_file=str(cert), tls_key_file=str(key), **extra
    )


@pytest.fixture
def made() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for t in reversed(things):
        t.close()


def tls_client(
    port: int, ca_file: Path, cert: tuple[Path, Path] | None = None, **kw: Any
) -> Client:
    c = Client(port, **kw)
    c.c.tls_set(
        ca_certs=str(ca_file),
        certfile=str(cert[0]) if cert else None,
        keyfile=str(cert[1]) if cert else None,
    )
    return c


def connects(c: Any, port: int, tries: int = 60) -> bool:
    """Whether a paho client (not looping) gets a successful CONNACK on ``port``."""
    try:
        c.connect("127.0.0.1", port)
    except (OSError, ssl.SSLError):
        return False
    try:
        for _ in range(tries):
            if c.loop(0.05) != mqtt.MQTT_ERR_SUCCESS or c.is_connected():
                break
        return bool(c.is_connected())
    except (OSError, ssl.SSLError):
        return False
    finally:
        c.disconnect()


def roundtrip(port: int, ca_file: Path, made: list[Any], topic: str = "plant/line1/temp") -> None:
    sub = tls_client(port, ca_file).connect()
    made.append(sub)
    sub.c.subscribe(topic, qos=1)
    time.sleep(0.3)
    pub = tls_client(port, ca_file).connect()
    made.append(pub)
    pub.c.publish(topic, b"21.5", qos=1).wait_for_publish(5)
    assert [m.payload for m in sub.wait_for(1)] == [b"21.5"]


def test_required_serves_tls_on_both_ports_and_refuses_plaintext(
    tmp_path: Path, pki: tuple[Ca, Path, Path], made: list[Any]
) -> None:
    ca = pki[0]
    s = tls_server(tmp_path, pki, "required")
    made.append(s)
    assert s.tls_port and s.tls_port != s.port
    roundtrip(s.tls_port, ca.file, made)
    roundtrip(s.port, ca.file, made)  # required: the MQTT port takes TLS too
    plain = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    assert not connects(plain, s.port)
    plain = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    assert not connects(plain, s.tls_port)
    gateway = s.gateway
    assert gateway is not None
    assert set(gateway.endpoints()) == {"mqtt", "mqtts", "mqtt-ws"}


def test_permissive_takes_plaintext_and_tls_on_the_mqtt_port(
    tmp_path: Path, pki: tuple[Ca, Path, Path], made: list[Any]
) -> None:
    ca = pki[0]
    s = tls_server(tmp_path, pki, "permissive")
    made.append(s)
    plain = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    assert connects(plain, s.port)
    assert not connects(mqtt.Client(mqtt.CallbackAPIVersion.VERSION2), s.tls_port)
    roundtrip(s.port, ca.file, made)
    roundtrip(s.tls_port, ca.file, made)


def test_off_opens_no_tls_port(tmp_path: Path, made: list[Any]) -> None:
    s = MqttServer(tmp_path)
    made.append(s)
    assert s.tls_port == 0


def test_a_changed_certificate_is_used_for_new_connections(
    tmp_path: Path, pki: tuple[Ca, Path, Path], made: list[Any]
) -> None:
    _ca, cert, key = pki
    s = tls_server(tmp_path, pki, "required")
    made.append(s)
    other = tmp_path / "other"
    other.mkdir()
    ca2 = Ca.make(other, "second-ca")
    cert2, key2 = ca2.issue(other, "localhost", ip="127.0.0.1")
    cert.write_bytes(cert2.read_bytes())
    key.write_bytes(key2.read_bytes())
    gateway = s.gateway
    assert gateway is not None and gateway.tls is not None
    deadline = time.monotonic() + 10  # the watcher polls every tls_reload_interval_s (0.5 s)
    while gateway.tls.reloads == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gateway.tls.reloads >= 1
    new = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    new.tls_set(ca_certs=str(ca2.file))
    assert connects(new, s.tls_port)
    ctx = ssl.create_default_context(cafile=str(pki[0].file))  # trusts only the old CA
    with (
        socket.create_connection(("127.0.0.1", s.tls_port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ctx.wrap_socket(raw, server_hostname="127.0.0.1").close()


def acl_store(path: Path) -> Path:
    """An auth store: admin (Super), sensor-7 (Pub/Sub on topic plant only)."""
    auth_file = path / "auth.json"
    store = AuthStore(auth_file)
    store.create_user("admin", "admin-secret-1", UserType.SUPER)
    store.create_user("sensor-7", "sensor-secret-7")
    store.put_entries(
        "sensor-7", [PolicyEntry.make("Topic:plant", ["Pub", "Sub"], "Allow")], create=True
    )
    return auth_file


def test_client_certificate_principal_is_the_mqtt_user(
    tmp_path: Path, pki: tuple[Ca, Path, Path], made: list[Any]
) -> None:
    ca = pki[0]
    device = ca.issue(tmp_path, "sensor-7")
    stranger = ca.issue(tmp_path, "stranger")
    s = tls_server(
        tmp_path, pki, "required", tls_client_auth="required", tls_ca_file=str(ca.file),
        broker_settings={"auth_enabled": True, "auth_file": str(acl_store(tmp_path))},
    )  # fmt: skip
    made.append(s)
    sub = tls_client(s.tls_port, ca.file, device).connect()  # no user name, no password
    made.append(sub)
    sub.c.subscribe("plant/#", qos=1)
    time.sleep(0.3)
    ok = sub.c.publish("plant/line1/temp", b"ok", qos=1)
    denied = sub.c.publish("office/line1/temp", b"no", qos=1)
    ok.wait_for_publish(5)
    denied.wait_for_publish(5)
    assert [m.payload for m in sub.wait_for(1)] == [b"ok"]
    # a certificate whose principal is no user, and no certificate at all, do not connect
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(ca.file), certfile=str(stranger[0]), keyfile=str(stranger[1]))
    assert not connects(c, s.tls_port)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(ca.file))
    assert not connects(c, s.tls_port)
    # a user name other than the certificate's is refused without that user's password
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(ca.file), certfile=str(device[0]), keyfile=str(device[1]))
    c.username_pw_set("admin")
    assert not connects(c, s.tls_port)
