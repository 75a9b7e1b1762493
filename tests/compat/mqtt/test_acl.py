"""MQTT against the broker's ACL users and policies (``[broker] auth_enabled``): CONNECT
credentials (CONNACK codes of both versions), PUBLISH as Pub and SUBSCRIBE as Sub on the
OrbitMQ topic (the MQTT topic's first level), shared subscriptions also as the group, first-level
wildcards, wills, and a revoked user. Raw packets (the OrbitMQ codec) show the exact codes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.store import AuthStore
from orbitmq.protocol.mqtt.codec import MqttDecoder, encode
from orbitmq.protocol.mqtt.packets import (
    Connack,
    Connect,
    Packet,
    PubAck,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.compat.mqtt.conftest import Client, MqttServer

pytestmark = pytest.mark.timeout(60)

SECRET = "sensor-secret-7"


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    auth_file = tmp_path / "auth.json"
    store = AuthStore(auth_file)
    store.create_user("admin", "admin-secret-1", UserType.SUPER)
    store.create_user("sensor-7", SECRET)
    store.put_entries(
        "sensor-7",
        [
            PolicyEntry.make("Topic:plant", ["Pub", "Sub"], "Allow"),
            PolicyEntry.make("Group:line", ["Sub"], "Allow"),
        ],
        create=True,
    )
    store.create_user("reader", "reader-secret")
    store.put_entries(
        "reader",
        [
            PolicyEntry.make("Topic:*", ["Sub"], "Allow"),
            PolicyEntry.make("Topic:secret", ["Sub"], "Deny"),
        ],
        create=True,
    )
    store.create_user("off-duty", "off-duty-secret")
    store.update_user("off-duty", enabled=False)
    return auth_file


@pytest.fixture
def secured(tmp_path: Path, store_file: Path) -> Iterator[MqttServer]:
    s = MqttServer(tmp_path, broker_settings={"auth_enabled": True, "auth_file": str(store_file)})
    try:
        yield s
    finally:
        s.close()


class Raw:
    """One raw MQTT connection: send packets, read the decoded answers."""

    def __init__(self, port: int, version: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.version = version
        self.dec = MqttDecoder(version=version)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def expect(self, kind: type, timeout: float = 5) -> Packet | None:
        """The next packet of type ``kind`` (None: the connection closed or nothing came)."""
        deadline = time.monotonic() + timeout
        pending: list[Packet] = []
        while time.monotonic() < deadline:
            for p in pending:
                if isinstance(p, kind):
                    return p
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return None
            if not data:
                return None
            pending = self.dec.feed(data)
        return None

    def connect(self, user: str | None, password: str | None, will: Will | None = None) -> int:
        secret = password.encode() if password is not None else None
        self.send(Connect(f"raw-{user}", self.version, True, 30, user, secret, will))
        ack = self.expect(Connack)
        assert isinstance(ack, Connack)
        return ack.reason_code

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("version", [4, 5])
def test_connect_checks_the_acl_users(secured: MqttServer, version: int) -> None:
    bad = 0x86 if version == 5 else 4
    cases = [
        ("sensor-7", SECRET, 0),
        ("sensor-7", "wrong-secret", bad),
        ("nobody", SECRET, bad),
        ("sensor-7", None, bad),
        (None, None, bad),
        ("off-duty", "off-duty-secret", bad),
    ]
    for user, password, want in cases:
        raw = Raw(secured.port, version)
        try:
            assert raw.connect(user, password) == want, (user, password)
        finally:
            raw.close()


@pytest.mark.parametrize("version", [4, 5])
def test_subscribe_is_checked_per_filter(secured: MqttServer, version: int) -> None:
    denied = 0x87 if version == 5 else 0x80
    raw = Raw(secured.port, version)
    try:
        assert raw.connect("sensor-7", SECRET) == 0
        filters = ["plant/#", "office/#", "#", "$share/line/plant/+/temp", "$share/x/plant/#"]
        raw.send(Subscribe(1, tuple(Subscription(f, 1) for f in filters)))
        ack = raw.expect(Suback)
        assert isinstance(ack, Suback)
        assert list(ack.reason_codes) == [1, denied, denied, 1, denied]
    finally:
        raw.close()


def test_a_first_level_wildcard_needs_every_topic(secured: MqttServer) -> None:
    raw = Raw(secured.port, 5)
    try:
        assert raw.connect("reader", "reader-secret") == 0
        raw.send(Subscribe(1, tuple(Subscription(f, 0) for f in ["#", "+/x", "plant/#"])))
        ack = raw.expect(Suback)
        assert isinstance(ack, Suback)
        assert list(ack.reason_codes) == [0x87, 0x87, 0]  # Topic:secret is denied to reader
    finally:
        raw.close()


@pytest.mark.parametrize("version", [4, 5])
def test_publish_is_checked_as_pub_on_the_first_level(
    secured: MqttServer, clients: list[Client], version: int
) -> None:
    watcher = Client(secured.port, 5)
    clients.append(watcher)
    watcher.c.username_pw_set("admin", "admin-secret-1")
    watcher.connect()
    watcher.c.subscribe("#", qos=1)
    time.sleep(0.3)
    raw = Raw(secured.port, version)
    try:
        assert raw.connect("sensor-7", SECRET) == 0
        raw.send(Publish("office/door", b"no", qos=1, packet_id=7))
        ack = raw.expect(PubAck)
        assert isinstance(ack, PubAck)
        # 5.0 says no; 3.1.1 cannot, so the message is acknowledged and dropped
        assert (ack.packet_id, ack.reason_code) == (7, 0x87 if version == 5 else 0)
        raw.send(Publish("plant/line1/temp", b"yes", qos=1, packet_id=8))
        ack = raw.expect(PubAck)
        assert isinstance(ack, PubAck) and (ack.packet_id, ack.reason_code) == (8, 0)
    finally:
        raw.close()
    got = watcher.wait_for(1)
    time.sleep(0.3)
    assert [(m.topic, m.payload) for m in watcher.messages] == [("plant/line1/temp", b"yes")]
    assert got


@pytest.mark.parametrize("version", [4, 5])
def test_a_will_to_a_denied_topic_refuses_the_connect(secured: MqttServer, version: int) -> None:
    raw = Raw(secured.port, version)
    try:
        code = raw.connect("sensor-7", SECRET, Will("office/alarm", b"gone"))
        assert code == (0x87 if version == 5 else 5)
    finally:
        raw.close()


def test_a_deleted_user_cannot_connect_within_a_second(
    secured: MqttServer, store_file: Path
) -> None:
    raw = Raw(secured.port, 5)
    try:
        assert raw.connect("sensor-7", SECRET) == 0
    finally:
        raw.close()
    AuthStore(store_file).delete_user("sensor-7")
    time.sleep(1.0)
    raw = Raw(secured.port, 5)
    try:
        assert raw.connect("sensor-7", SECRET) == 0x86
    finally:
        raw.close()
