"""Mutated MQTT packet streams against a live gateway: whatever arrives, the server answers
other clients, and a 5.0 connection that sends a malformed packet after CONNECT gets DISCONNECT
0x81 (or 0x82 for a well-formed but forbidden one) before the close.

Bounded for the normal suite (``ORBITMQ_TEST_MQTT_FUZZ`` connections, default 150); the seed is
printed and ``ORBITMQ_TEST_MQTT_SEED`` replays it."""

from __future__ import annotations

import os
import random
import socket
import time

import pytest

from orbitmq.protocol.mqtt.codec import MqttDecoder, encode
from orbitmq.protocol.mqtt.packets import (
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from tests.compat.mqtt.conftest import Client, MqttServer

pytestmark = pytest.mark.timeout(120)

CONNECTIONS = int(os.environ.get("ORBITMQ_TEST_MQTT_FUZZ", "150"))


def _packets(rng: random.Random, version: int) -> list[bytes]:
    topic = rng.choice(["a/b", "fz/x", "$SYS/x", "/lead", "plant/l1/t"])
    return [
        encode(Publish(topic, rng.randbytes(rng.randint(0, 40)), 0), version),
        encode(Publish(topic, b"q1", 1, packet_id=rng.randint(1, 9)), version),
        encode(Publish(topic, b"q2", 2, packet_id=rng.randint(1, 9)), version),
        encode(
            Subscribe(
                rng.randint(1, 9), (Subscription(rng.choice(["#", "fz/+", "$share/g/fz/#"]), 1),)
            ),
            version,
        ),
        encode(Unsubscribe(rng.randint(1, 9), ("fz/+",)), version),
        encode(PubAck(rng.randint(1, 9)), version),
        encode(PingReq(), version),
        encode(Disconnect(0), version),
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif b:
            del b[rng.randrange(len(b))]
    return bytes(b)


def _drain(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


def test_mutated_streams_leave_the_gateway_serving(
    server: MqttServer, clients: list[Client]
) -> None:
    seed = int(os.environ.get("ORBITMQ_TEST_MQTT_SEED", random.randrange(2**32)))
    print(f"MQTT fuzz seed {seed} (replay: ORBITMQ_TEST_MQTT_SEED={seed})")
    rng = random.Random(seed)
    for i in range(CONNECTIONS):
        version = rng.choice([4, 5])
        will = Will("fz/will", b"w", 1) if rng.random() < 0.3 else None
        stream = [encode(Connect(f"fz{i % 7}", version, rng.random() < 0.5, 0, will=will), version)]
        stream += rng.sample(_packets(rng, version), rng.randint(1, 6))
        if rng.random() < 0.8:
            at = rng.randrange(len(stream))
            stream[at] = _mutate(rng, stream[at])
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            try:
                s.sendall(b"".join(stream))
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            _drain(s, 2.0)
    probe = Client(server.port, 5)
    clients.append(probe)
    probe.connect()
    probe.c.subscribe("fz/alive", 1)
    time.sleep(0.3)
    probe.c.publish("fz/alive", b"yes", 1).wait_for_publish(5)
    assert b"yes" in [m.payload for m in probe.wait_for(1)]


def test_malformed_after_connect_gets_disconnect_0x81(server: MqttServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(encode(Connect("m81", 5, True, 0), 5))
        dec = MqttDecoder(version=5)
        s.settimeout(5)
        got = dec.feed(s.recv(1024))
        assert [type(p).__name__ for p in got] == ["Connack"]
        s.sendall(b"\x30\x04\x00\x09ab")  # PUBLISH whose topic length runs past the packet
        packets = dec.feed(_drain(s, 3.0))
    assert [type(p).__name__ for p in packets] == ["Disconnect"]
    assert packets[0].reason_code == 0x81  # type: ignore[union-attr]


def test_malformed_in_the_connect_read_gets_connack_0x81(server: MqttServer) -> None:
    """CONNECT and a malformed packet in one read: 5.0 answers CONNACK 0x81, then closes."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(encode(Connect("m81b", 5, True, 0), 5) + b"\x30\x04\x00\x09ab")
        packets = MqttDecoder(version=5).feed(_drain(s, 3.0))
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Connack", 0x81)]  # type: ignore[union-attr]
