"""Configuration layering and `orbitmq config show`; `orbitmq up` as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app
from orbitmq.cli.settings import load_settings
from orbitmq.common.errors import ConfigError
from orbitmq.store.config import FlushDiskType

TOML = """
[namesrv]
port = 19999

[broker]
broker_name = "broker-x"
namesrv_addrs = ["127.0.0.1:1", "127.0.0.1:2"]
auto_create_topic = true

[store]
flush_disk_type = "SYNC_FLUSH"
mapped_file_size_commit_log = 8388608
"""


def test_file_env_and_flags_layer_in_order(tmp_path: Path) -> None:
    cfg = tmp_path / "orbitmq.toml"
    cfg.write_text(TOML)
    env = {"ORBITMQ_BROKER_PORT": "20001", "ORBITMQ_NAMESRV_PORT": "20002", "PATH": "x"}
    s = load_settings(cfg, {"broker": {"broker_name": "from-flag"}}, env=env)
    assert s.namesrv.port == 20002  # env beats file
    assert s.broker.port == 20001
    assert s.broker.broker_name == "from-flag"  # flag beats file
    assert s.broker.namesrv_addrs == ("127.0.0.1:1", "127.0.0.1:2")
    assert s.broker.auto_create_topic is True
    assert s.broker.store.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert s.broker.store.mapped_file_size_commit_log == 8 * 1024 * 1024
    assert s.sources["broker.port"] == "env ORBITMQ_BROKER_PORT"
    assert s.sources["store.flush_disk_type"] == str(cfg)


@pytest.mark.parametrize(
    ("text", "env", "match"),
    [
        ("[broker]\nport = 'abc'\n", {}, "broker.port"),
        ("[brokr]\nport = 1\n", {}, "unknown table"),
        ("[broker]\nnope = 1\n", {}, "no setting nope"),
        ("", {"ORBITMQ_STORE_FLUSH_DISK_TYPE": "SOMETIMES"}, "flush_disk_type"),
        ("", {"ORBITMQ_BROKER_AUTO_CREATE_TOPIC": "perhaps"}, "auto_create_topic"),
        ("[store]\ndisk_max_used_space_ratio = 95\n", {}, "disk ratios"),
        ("not toml [", {}, "orbitmq.toml"),
    ],
)
def test_bad_settings_name_their_source(
    tmp_path: Path, text: str, env: dict[str, str], match: str
) -> None:
    cfg = tmp_path / "orbitmq.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_settings(cfg, env=env)


def test_config_show_prints_values_and_sources(tmp_path: Path) -> None:
    cfg = tmp_path / "orbitmq.toml"
    cfg.write_text(TOML)
    result = CliRunner().invoke(
        app,
        ["config", "show", "--config", str(cfg)],
        env={"ORBITMQ_BROKER_PORT": "20001", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "SYNC_FLUSH" in result.output and "broker-x" in result.output
    assert "env ORBITMQ_BROKER_PORT" in result.output
    bad = CliRunner().invoke(app, ["config", "show"], env={"ORBITMQ_BROKER_PORT": "x"})
    assert bad.exit_code == 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_orbitmq_up_starts_serves_metrics_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    ns_port, broker_port, metrics_port = _free_port(), _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orbitmq", "up", "--namesrv-port", str(ns_port),
         "--broker-port", str(broker_port), "--metrics-port", str(metrics_port),
         "--proxy-port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        ready = ""
        while time.monotonic() < deadline and not ready:
            line = proc.stdout.readline().decode()
            if not line:
                break
            if line.startswith("orbitmq up ready"):
                ready = line
        assert (
            f"namesrv=127.0.0.1:{ns_port}" in ready and f"broker=127.0.0.1:{broker_port}" in ready
        )
        send = CliRunner().invoke(
            app, ["send", "-n", f"127.0.0.1:{ns_port}", "--topic", "UpDemo", "--body", "hi"]
        )
        assert send.exit_code == 0, send.output
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert "orbitmq_broker_messages_in_total 1.0" in metrics
        assert "orbitmq_store_dispatch_lag_bytes" in metrics
        assert "orbitmq_store_append_seconds_count 1.0" in metrics
        assert 'orbitmq_broker_send_seconds_bucket{le="+Inf"} 1.0' in metrics
        assert "orbitmq_store_flush_seconds_count" in metrics
        assert (tmp_path / "orbitmq-data" / "store" / "commitlog").is_dir()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_configuration_doc_is_current() -> None:
    from orbitmq.cli.settings import settings_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == settings_markdown() + "\n", (
        "run: orbitmq config docs > docs/configuration.md"
    )


def test_proxy_table_layers_and_a_local_proxy_takes_the_brokers_defaults(tmp_path: Path) -> None:
    from orbitmq.cli.server import broker_proxy_port, local_proxy_config, up_proxy_port

    cfg = tmp_path / "orbitmq.toml"
    cfg.write_text('[proxy]\nport = 18081\ntls_mode = "off"\n[store]\nmax_message_size = 65536\n')
    env = {"ORBITMQ_PROXY_ACCESS_KEYS": "AK:S:K,AK2:SK2", "ORBITMQ_PROXY_ACL_ENABLED": "true"}
    s = load_settings(cfg, {"broker": {"host": "127.0.0.2"}}, env=env)
    assert s.proxy.port == 18081 and s.proxy.tls_mode == "off"
    assert s.proxy.access_keys == {"AK": "S:K", "AK2": "SK2"} and s.proxy.acl_enabled
    assert up_proxy_port(s, None) == 18081 and up_proxy_port(s, -1) is None
    assert broker_proxy_port(s, None) == 18081
    assert broker_proxy_port(load_settings(env={}), None) is None  # no table, no flag: none
    local = local_proxy_config(s, ("127.0.0.1:9876",), 0)
    assert local.host == "127.0.0.2" and local.max_message_size == 65536 and local.port == 0
    assert local.namesrv_addrs == ("127.0.0.1:9876",) and local.tls_mode == "off"
    with pytest.raises(ConfigError, match=r"proxy\.port"):
        load_settings(env={"ORBITMQ_PROXY_PORT": "70000"})
    with pytest.raises(ConfigError, match="AK:SK"):
        load_settings(env={"ORBITMQ_PROXY_ACCESS_KEYS": "nokey"})


def test_config_show_masks_secret_keys() -> None:
    result = CliRunner().invoke(
        app,
        ["config", "show"],
        env={"ORBITMQ_PROXY_ACCESS_KEYS": "AK:TopSecret", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "AK:***" in result.output and "TopSecret" not in result.output


def test_controller_table_env_and_checks(tmp_path: Path) -> None:
    cfg = tmp_path / "orbitmq.toml"
    cfg.write_text(
        "[controller]\nport = 19878\nraft_port = 19880\n"
        'peers = ["127.0.0.1:19878/19880", "127.0.0.2:19878/19880"]\n'
    )
    env = {"ORBITMQ_CONTROLLER_MASTER_LEASE_MS": "3000", "ORBITMQ_CONTROLLER_RAFT_SECRET": "s"}
    s = load_settings(cfg, {"controller": {"enable_unclean_election": True}}, env=env)
    c = s.controller
    assert (c.port, c.raft_port, c.master_lease_ms, c.raft_secret) == (19878, 19880, 3000, "s")
    assert c.peers == ("127.0.0.1:19878/19880", "127.0.0.2:19878/19880")
    assert c.enable_unclean_election and s.sources["controller.raft_secret"].startswith("env")
    c.check()  # the peer list names this node
    env_peers = load_settings(env={"ORBITMQ_CONTROLLER_PEERS": "h:1/2, h:3/4"}).controller
    assert env_peers.peers == ("h:1/2", "h:3/4")
    bad = {
        "ORBITMQ_CONTROLLER_PORT": r"controller\.port",
        "ORBITMQ_CONTROLLER_LEADER_FALLBACK_MS": r"controller\.leader_fallback_ms",
        "ORBITMQ_CONTROLLER_ELECTION_MARGIN_MS": r"controller\.election_margin_ms",
        "ORBITMQ_CONTROLLER_PEERS": "not host:port/raft_port",
    }
    values = {"ORBITMQ_CONTROLLER_PORT": "0", "ORBITMQ_CONTROLLER_PEERS": "h:1"}
    for key, match in bad.items():
        with pytest.raises(ConfigError, match=match):
            load_settings(env={key: values.get(key, "-1")})


def test_config_show_masks_the_raft_secret() -> None:
    result = CliRunner().invoke(
        app,
        ["config", "show"],
        env={"ORBITMQ_CONTROLLER_RAFT_SECRET": "TopSecret", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "controller.raft_secret" in result.output and "TopSecret" not in result.output
