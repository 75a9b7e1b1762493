"""Smoke test of ``orbitmq bench proxy``: tiny counts, the shape of the result and the report.
Not a performance test: nothing here asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.bench.proxy_bench import ProxyBenchOptions
from orbitmq.bench.proxy_load import build_requests, canned_response
from orbitmq.cli.main import app
from orbitmq.proxy.grpc_v2 import service_pb2 as svc

pytestmark = [pytest.mark.integration]


def test_bench_proxy_drives_echo_and_proxy(tmp_path: Path) -> None:
    """With ``--tls permissive`` a third side, a TLS proxy driven over TLS, runs in the same
    runs and its share of the plaintext proxy is reported (issue #16's TLS target)."""
    out = tmp_path / "result.json"
    args = [
        "bench", "proxy", "--count", "60", "--inflight", "4", "--size", "64", "--runs", "1",
        "--json", str(out), "--tls", "permissive",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "proxy / echo calls/s" in result.output and "median proxy" in result.output
    assert "proxy TLS (permissive) / proxy plaintext calls/s" in result.output
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert data["tls_share_of_plaintext"] > 0
    for side in ("echo", "proxy", "proxy_tls"):
        r = run[side]
        assert r["calls"] == 60 and r["answered"] == 60 and r["errors"] == 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["calls_per_s"] > 0
        assert r["server_cpu_ms_per_call"] is not None
    assert data["share_of_echo"] > 0
    assert set(data["targets"]) == {"share_met", "added_p50_met"}


def test_requests_are_distinct_sends_and_the_echo_answers_like_the_proxy() -> None:
    reqs = [svc.SendMessageRequest.FromString(b) for b in build_requests("T", 100, 3)]
    ids = {r.messages[0].system_properties.message_id for r in reqs}
    assert len(ids) == 3 and all(len(r.messages[0].body) == 100 for r in reqs)
    answer = svc.SendMessageResponse.FromString(canned_response())
    assert len(answer.entries) == 1 and answer.status.code == answer.entries[0].status.code


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="at least inflight"):
        ProxyBenchOptions(count=4, inflight=8).validate()
    with pytest.raises(ValueError, match="workers"):
        ProxyBenchOptions(workers=0).validate()
    with pytest.raises(ValueError, match="tls"):
        ProxyBenchOptions(tls="sometimes").validate()
