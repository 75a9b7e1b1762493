"""Smoke test of ``orbitmq bench grpc``: tiny counts, the shape of the result and report.
Not a performance test: nothing here asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.bench import grpc as bench
from orbitmq.bench.grpc_floor import run_floor
from orbitmq.cli.main import app

pytestmark = [pytest.mark.integration, pytest.mark.compat]


def test_bench_grpc_runs_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = [
        "bench", "grpc", "--threads", "2", "--count", "40", "--size", "64",
        "--receive-threads", "2", "--runs", "1", "--json", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "proxy p50 overhead" in result.output and "median grpc" in result.output
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    for side in ("grpc", "native"):
        r = run[side]
        assert r["sent"] == 40 and r["send_errors"] == 0, r
        assert r["send_ms"]["p50"] > 0 and r["send_msgs_per_s"] > 0
        warmup = bench.WARMUP_PER_THREAD * 2
        assert r["received"] == 40 + warmup, r
    assert set(data["targets"]) >= {"p50_overhead_met", "grpc_sends_met"}
    floor = data["bare_grpc_floor"]
    assert floor["calls"] == 40 and floor["threads"] == 2 and floor["calls_per_s"] > 0
    assert "bare Python gRPC echo" in result.output


def test_floor_echo_server_is_called_and_stopped(tmp_path: Path) -> None:
    got = run_floor(threads=3, count=30, size=128, scratch=tmp_path)
    assert got.calls == 30 and got.threads == 3
    assert 0 < got.p50_ms <= got.p99_ms
    assert got.server_cpu_ms_per_call is not None and got.server_cpu_ms_per_call >= 0


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="both --namesrv and --proxy"):
        bench.GrpcBenchOptions(namesrv="127.0.0.1:9876").validate()
    with pytest.raises(ValueError, match="count must be at least"):
        bench.GrpcBenchOptions(threads=16, count=4).validate()
