"""Expected failures print one red line and exit 1, never a traceback: here, no NameServer."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app


@pytest.fixture
def dead_namesrv() -> str:
    """An address on 127.0.0.1 where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "list"],
        ["topic", "create", "-t", "T"],
        ["topic", "update", "-t", "T", "--queues", "2"],
        ["topic", "delete", "-t", "T"],
        ["topic", "describe", "-t", "T"],
        ["cluster", "list"],
        ["message", "get", "-t", "T", "--id", "0" * 32],
        ["message", "query", "-t", "T", "--key", "k"],
        ["send", "-t", "T", "--body", "x"],
        ["send", "-t", "T", "--count", "3", "--async"],
        ["tail", "-t", "T", "--count", "1"],
        ["bench", "produce", "--count", "10"],
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_no_namesrv_is_one_red_line_and_exit_1(dead_namesrv: str, args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--namesrv", dead_namesrv], env={"COLUMNS": "250"})
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Connection refused" in lines[0] or "no NameServer answered" in lines[0], lines[0]
    assert dead_namesrv in lines[0]


def test_env_var_chooses_the_namesrv(dead_namesrv: str) -> None:
    result = CliRunner().invoke(app, ["topic", "list"], env={"ORBITMQ_NAMESRV": dead_namesrv})
    assert result.exit_code == 1 and dead_namesrv in result.stderr


def test_default_namesrv_is_9876_and_lists_take_semicolons_or_commas() -> None:
    result = CliRunner().invoke(app, ["topic", "list", "--help"], env={"COLUMNS": "250"})
    assert "127.0.0.1:9876" in result.stdout and "ORBITMQ_NAMESRV" in result.stdout


def test_usage_errors_exit_2() -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["send", "-t", "T"]).exit_code == 2  # no --body, no --count
    assert runner.invoke(app, ["topic", "create", "-t", "T", "--type", "NOPE"]).exit_code == 2
    assert runner.invoke(app, ["bench", "produce", "--mode", "turbo"]).exit_code == 2
    r = runner.invoke(app, ["bench", "produce", "--count", "5", "--duration", "1"])
    assert r.exit_code == 2 and "not both" in r.output


def test_mutual_tls_flags_need_required_mode(tmp_path: Path) -> None:
    """Refused before anything starts: a plaintext client would bypass the certificate check."""
    runner = CliRunner()
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    for args in (
        ["up", "--data-dir", str(tmp_path / "d"), "--proxy-tls-client-ca", str(ca)],
        ["proxy", "--port", "0", "--tls-client-ca", str(ca)],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert "required" in r.output
