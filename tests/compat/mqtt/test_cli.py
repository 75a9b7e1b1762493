"""``orbitmq up`` runs the MQTT gateway and names it in the ready line; a throwaway instance
(NameServer on a free port) takes a free MQTT port rather than 1883."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.compat.mqtt.conftest import Client

pytestmark = pytest.mark.timeout(60)


def test_up_serves_mqtt_on_the_port_its_ready_line_names(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(tmp_path / "d"),
         "--namesrv-port", "0", "--broker-port", "0", "--proxy-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("ORBITMQ_")},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().decode()
        fields = dict(f.split("=", 1) for f in ready.split()[3:] if "=" in f)
        host, _, port = fields["mqtt"].rpartition(":")
        assert host == "127.0.0.1" and int(port) not in (0, 1883)
        c = Client(int(port), 5)
        c.connect()
        try:
            c.c.subscribe("up/#", 1)
            time.sleep(0.3)
            c.c.publish("up/demo", b"hello", 1).wait_for_publish(5)
            assert [m.payload for m in c.wait_for(1)] == [b"hello"]
        finally:
            c.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
