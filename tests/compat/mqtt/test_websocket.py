"""MQTT over WebSocket (port 8083, here a free one) with paho-mqtt ``transport="websockets"``:
both versions, across transports, over TLS (wss), and the handshake's refusals."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.compat.mqtt.conftest import Client, MqttServer
from tests.net.pki import Ca

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_and_subscribe_over_websocket(
    server: MqttServer, clients: list[Client], version: int
) -> None:
    assert server.ws_port and server.ws_port != server.port
    ws_sub = Client(server.ws_port, version, transport="websockets")
    tcp_sub = Client(server.port, version)
    clients.extend([ws_sub, tcp_sub])
    for c in (ws_sub, tcp_sub):
        c.connect()
        c.c.subscribe("plant/+/temp", qos=1)
    time.sleep(0.3)
    ws_pub = Client(server.ws_port, version, transport="websockets")
    clients.append(ws_pub)
    ws_pub.connect()
    big = bytes(range(256)) * 400  # 100 KiB: an MQTT packet over several WebSocket reads
    for i in range(20):
        ws_pub.c.publish(f"plant/line{i % 2}/temp", f"m{i}".encode(), qos=1).wait_for_publish(5)
    ws_pub.c.publish("plant/big/temp", big, qos=1).wait_for_publish(5)
    for sub in (ws_sub, tcp_sub):
        got = sub.wait_for(21)
        assert sorted(m.payload for m in got[:21] if m.payload != big) == sorted(
            f"m{i}".encode() for i in range(20)
        )
        assert any(m.payload == big for m in got)


def test_websocket_over_tls(tmp_path: Path, clients: list[Client]) -> None:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    s = MqttServer(tmp_path, tls_mode="required", tls_cert_file=str(cert), tls_key_file=str(key))
    try:
        sub = Client(s.ws_port, 5, transport="websockets")
        pub = Client(s.ws_port, 4, transport="websockets")
        clients.extend([sub, pub])
        for c in (sub, pub):
            c.c.tls_set(ca_certs=str(ca.file))
            c.connect()
        sub.c.subscribe("secure/#", qos=1)
        time.sleep(0.3)
        pub.c.publish("secure/a", b"over wss", qos=1).wait_for_publish(5)
        assert [m.payload for m in sub.wait_for(1)] == [b"over wss"]
    finally:
        for c in clients:
            c.close()
        clients.clear()
        s.close()


def _upgrade(port: int, protocols: str | None) -> bytes:
    lines = [
        "GET /mqtt HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    if protocols:
        lines.append(f"Sec-WebSocket-Protocol: {protocols}")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return sock.recv(4096)


def test_the_handshake_wants_the_mqtt_subprotocol(server: MqttServer) -> None:
    accepted = _upgrade(server.ws_port, "mqtt")
    assert accepted.startswith(b"HTTP/1.1 101")
    assert b"sec-websocket-protocol: mqtt" in accepted.lower()
    assert _upgrade(server.ws_port, "chat, superchat").startswith(b"HTTP/1.1 400")
    assert _upgrade(server.ws_port, None).startswith(b"HTTP/1.1 101")  # none offered: lenient


def test_a_text_frame_closes_the_websocket_with_1003(server: MqttServer) -> None:
    lines = [
        "GET /mqtt HTTP/1.1",
        f"Host: 127.0.0.1:{server.ws_port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: mqtt",
    ]
    with socket.create_connection(("127.0.0.1", server.ws_port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, "closed during the handshake"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 101")
        rest = answer.partition(b"\r\n\r\n")[2]
        mask, text = b"\x01\x02\x03\x04", b"hello"
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(text))
        sock.sendall(bytes([0x81, 0x80 | len(text)]) + mask + masked)  # a masked text frame
        while len(rest) < 4:
            chunk = sock.recv(4096)
            if not chunk:
                break
            rest += chunk
    assert rest[0] == 0x88  # FIN + close
    assert int.from_bytes(rest[2:4], "big") == 1003
