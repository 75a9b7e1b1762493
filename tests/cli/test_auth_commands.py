"""`orbitmq up` with authentication on, and the user / acl / audit commands against it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app
from orbitmq.testing import settings_toml
from tests.harness import ProcessCluster

ADMIN = ["--access-key", "admin", "--secret-key", "admin-secret-0"]


def test_user_and_acl_commands_on_an_authenticated_cluster(
    cluster: ProcessCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBITMQ_AUTH_ADMIN_SECRET", "admin-secret-0")
    config = tmp_path / "up.toml"
    config.write_text(settings_toml({"broker": {"auth_enabled": True}}))
    up = cluster.child(
        "up",
        "orbitmq",
        ["up", "--config", str(config), "--data-dir", str(tmp_path / "data"),
         "--namesrv-port", "0", "--broker-port", "0", "--proxy-port", "-1"],
    )  # fmt: skip
    ns = ["-n", up.address]
    runner = CliRunner()

    def cli(*args: str, input: str | None = None) -> tuple[int, str]:
        result = runner.invoke(app, list(args), input=input, catch_exceptions=False)
        return result.exit_code, result.output

    code, text = cli("topic", "list", *ns)
    assert code == 1 and "authentication failed" in text, text
    code, text = cli(
        *ADMIN, "user", "create", "-u", "alice", "-p", "-", *ns, input="alice-secret-1\n"
    )
    assert code == 0, text
    code, text = cli(*ADMIN, "acl", "create", "-s", "User:alice", "-r", "Topic:orders,Group:g*",
                     "-a", "Pub,Sub", *ns)  # fmt: skip
    assert code == 0, text
    code, text = cli(*ADMIN, "user", "list", *ns)
    assert code == 0 and "alice" in text and "Normal" in text and "alice-secret-1" not in text
    code, text = cli(*ADMIN, "acl", "get", "-s", "User:alice", *ns)
    assert code == 0 and "Topic:orders" in text and "Group:g*" in text, text
    code, text = cli(*ADMIN, "topic", "create", "-t", "orders", *ns)
    assert code == 0, text
    alice = ["--access-key", "alice", "--secret-key", "alice-secret-1"]
    code, text = cli(*alice, "send", "-t", "orders", "--body", "hello", *ns)
    assert code == 0, text
    code, text = cli(*alice, "send", "-t", "payments", "--body", "hello", *ns)
    assert code == 1 and "payments" in text, text
    code, text = cli(*alice, "user", "create", "-u", "eve", "-p", "eve-secret-9", *ns)
    assert code == 1, text
    code, text = cli(*ADMIN, "acl", "delete", "-s", "User:alice", "-r", "Group:g*", *ns)
    assert code == 0, text
    code, text = cli(*ADMIN, "acl", "list", *ns)
    assert code == 0 and "Group:g*" not in text and "Topic:orders" in text, text
    code, text = cli(*ADMIN, "user", "delete", "-u", "alice", *ns)
    assert code == 0, text
    audit = tmp_path / "data" / "store" / "audit.jsonl"
    code, text = cli("audit", "verify", str(audit))
    assert code == 0 and '"chain": "ok"' in text, text
    assert "alice-secret-1" not in audit.read_text()
    log = up.log()
    assert "admin-secret-0" not in log and "alice-secret-1" not in log


def test_the_local_proxy_shares_the_brokers_users_and_credentials(tmp_path: Path) -> None:
    import dataclasses

    from orbitmq.broker.config import BrokerConfig
    from orbitmq.cli.server import local_proxy_config
    from orbitmq.cli.settings import Settings

    broker = BrokerConfig(
        auth_enabled=True,
        auth_file=str(tmp_path / "a.json"),
        access_key="inner",
        secret_key="s" * 12,
    )
    proxy = local_proxy_config(dataclasses.replace(Settings(), broker=broker), ("n:1",), 0)
    assert proxy.acl_enabled and proxy.auth_file == str(tmp_path / "a.json")
    assert (proxy.access_key, proxy.secret_key) == ("inner", "s" * 12)
    off = local_proxy_config(Settings(), ("n:1",), 0)
    assert not off.acl_enabled and off.access_key is None
