"""`orbitmq up` and its console: on 8088 by default on the up's NameServer, off with
``--console-port -1`` or for a throwaway up (NameServer on a free port) unless asked; and a
real ``orbitmq up --console-port 0`` prints the console's address in its ready line and serves
it. The server is stopped by its PID however the test ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from orbitmq.cli.server import up_console_config
from orbitmq.cli.settings import load_settings

pytestmark = pytest.mark.timeout(90)


def test_up_console_config_defaults_and_switches() -> None:
    ns = ("127.0.0.1:9876",)
    plain = up_console_config(load_settings(env={}), ns, None)
    assert plain is not None and plain.port == 8088 and plain.host == "127.0.0.1"
    assert plain.namesrv_addrs == ns
    assert up_console_config(load_settings(env={}), ns, -1) is None
    throwaway = load_settings(None, {"namesrv": {"port": 0}}, env={})
    assert up_console_config(throwaway, ns, None) is None
    asked = up_console_config(throwaway, ns, 0)
    assert asked is not None and asked.port == 0
    table = load_settings(None, {"console": {"namesrv_addrs": ("other:1",)}}, env={})
    named = up_console_config(table, ns, None)
    assert named is not None and named.namesrv_addrs == ("other:1",)


def test_orbitmq_up_prints_and_serves_the_console(tmp_path: Path) -> None:
    env = {**os.environ, "ORBITMQ_CONSOLE_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    argv = [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(tmp_path / "data"),
            "--namesrv-port", "0", "--broker-port", "0", "--proxy-port", "-1",
            "--kafka-port", "-1", "--console-port", "0", "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()),  # type: ignore[union-attr]  # checked above
                                  daemon=True)  # fmt: skip
        reader.start()
        reader.join(60)  # bounded: the ready line
        assert first and " ready " in first[0], first
        endpoints = dict(w.split("=", 1) for w in first[0].split()[3:] if "=" in w)
        url = endpoints["console"]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), first[0]
        with urllib.request.urlopen(url + "/", timeout=10) as resp:
            page = resp.read().decode()
        assert resp.status == 200 and "broker" in page and "OrbitMQ console" in page
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
