"""M9: many idle MQTT connections (keep alive 60 s) on one gateway: memory per connection, CPU
at idle, and the gateway still answering a new client quickly. The suite opens
``ORBITMQ_TEST_MQTT_IDLE`` connections (500); the issue's figure is 10,000
(``ORBITMQ_TEST_MQTT_IDLE=10000``; each connection is one descriptor on each side, so the
soft RLIMIT_NOFILE must allow it: the gateway raises its own to the hard limit)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbitmq.protocol.mqtt.codec import encode
from orbitmq.protocol.mqtt.packets import Connect
from tests.compat.mqtt.conftest import Client, MqttServer

IDLE = int(os.environ.get("ORBITMQ_TEST_MQTT_IDLE", "500"))
PAGE = os.sysconf("SC_PAGE_SIZE")

pytestmark = pytest.mark.timeout(120 + IDLE // 50)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def test_idle_connections_cost_little_and_leave_the_gateway_responsive(
    server: MqttServer, clients: list[Client]
) -> None:
    gateway = server.gateway
    assert gateway is not None
    # paho waits with select(), which cannot take descriptors >= 1024: connect it first
    sub = Client(server.port, 5)
    clients.append(sub)
    sub.connect()
    before = rss()
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.compat.mqtt.idle_clients", str(server.port), str(IDLE)],
        cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == f"ready {IDLE}", line
        deadline = time.monotonic() + 10
        while len(gateway.handlers) < IDLE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(gateway.handlers) >= IDLE
        time.sleep(0.5)
        per_conn = (rss() - before) / IDLE
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(2.0)
        idle_cores = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as new:
            new.sendall(encode(Connect("idle-late", 5, True, 60), 5))
            assert new.recv(64)[:1] == b"\x20"  # CONNACK
        connect_s = time.monotonic() - started
        started = time.monotonic()
        sub.c.subscribe("idle/check", qos=1)
        time.sleep(0.2)
        sub.c.publish("idle/check", b"still here", qos=1).wait_for_publish(5)
        assert [m.payload for m in sub.wait_for(1)] == [b"still here"]
        roundtrip = time.monotonic() - started - 0.2
        print(
            f"\n{IDLE} idle MQTT connections: {per_conn / 1024:.1f} KiB each (RSS growth), "
            f"idle CPU {idle_cores * 100:.1f}% of one core, a new CONNECT answered in "
            f"{connect_s * 1000:.0f} ms, subscribe+publish+receive {roundtrip * 1000:.0f} ms"
        )
        assert per_conn < 256 * 1024, f"{per_conn / 1024:.0f} KiB per idle connection"
        assert idle_cores < 0.25, f"{idle_cores:.2f} cores at idle"
        assert connect_s < 5.0 and roundtrip < 5.0
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
