"""Smoke test of the consumer benchmarks: tiny counts, short runs, the shape of the results.
Not a performance test: nothing here asserts a speed."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.bench import consume as bench
from orbitmq.bench import e2e
from orbitmq.bench.cluster import target_cluster
from orbitmq.cli.main import app

pytestmark = pytest.mark.integration


def _sane(value: float) -> bool:
    return math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def namesrv() -> Iterator[str]:
    """One NameServer + Broker process for the module, started as the benchmarks do."""
    with target_cluster(None, None, lambda _line: None) as target:
        assert target.own
        yield target.namesrv


@pytest.mark.parametrize("mode", bench.MODES)
def test_consume_bench_reads_everything_in_each_mode(namesrv: str, mode: str) -> None:
    topic = f"BenchSmoke{mode.replace('-', '')}"
    lines: list[str] = []
    progress: list[tuple[str, int, int]] = []
    options = bench.ConsumeBenchOptions(
        namesrv=namesrv, topic=topic, count=2000, size=256, queues=4, runs=2, mode=mode,
        batch=16, pop_workers=2, stall_s=20.0, command="pytest smoke",
    )  # fmt: skip
    result = bench.run_consume_bench(options, lines.append, lambda *a: progress.append(a))

    assert result.load.messages == 2000 and not result.load.skipped
    assert result.expected == 2000
    assert len(result.runs) == 2
    assert len({r.group for r in result.runs}) == 2  # a new group each run
    for run in result.runs:
        assert run.messages == 2000 and run.bytes == 2000 * 256
        assert _sane(run.seconds) and _sane(run.msgs_per_s) and _sane(run.mib_per_s)
        assert run.startup_s >= 0
    assert min(r.msgs_per_s for r in result.runs) <= result.median_msgs_per_s
    assert {p[0] for p in progress} == {"load", "consume"}
    assert progress[-1] == ("consume", 2000, 2000)
    report = bench.format_consume_report(result)
    assert "command: pytest smoke" in report and f"mode {mode}" in report
    assert report.count("\nrun ") == 2 and "median" in report
    data = json.loads(json.dumps(result.to_json(), default=str))
    assert data["median_msgs_per_s"] > 0 and len(data["runs"]) == 2

    # --skip-load reads what is there; asking for more than the topic keeps is refused.
    again = bench.run_consume_bench(
        bench.ConsumeBenchOptions(
            namesrv=namesrv, topic=topic, count=2000, runs=1, mode=mode, skip_load=True
        )
    )
    assert again.load.skipped and again.runs[0].messages == 2000
    with pytest.raises(bench.ClientError, match="keeps 2,000 messages"):
        bench.run_consume_bench(
            bench.ConsumeBenchOptions(namesrv=namesrv, topic=topic, count=5000, skip_load=True)
        )


def test_e2e_bench_measures_latency(namesrv: str) -> None:
    options = e2e.E2EBenchOptions(
        namesrv=namesrv, topic="BenchSmokeE2E", queues=2, rate=500, size=128, duration_s=1.0,
        warmup_s=0.3, runs=1, command="pytest smoke",
    )  # fmt: skip
    result = e2e.run_e2e_bench(options)
    (run,) = result.runs
    assert run.sent > 0 and run.errors == 0
    assert run.received == run.sent and run.missing == 0 and run.duplicates == 0
    assert _sane(run.achieved_rate)
    lat = run.latency_ms
    assert set(lat) == {"p50", "p90", "p99", "p99.9", "max", "mean"}
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    # the broker's GC pauses over 5 ms in the run window, from its runtime info
    assert set(run.broker_gc) == {"over_5ms", "max_ms"} and run.broker_gc["over_5ms"] >= 0
    report = e2e.format_e2e_report(result)
    assert "command: pytest smoke" in report and "p99.9" in report and "median" in report
    assert "broker GC pauses over 5 ms during the run: " in report
    json.dumps(result.to_json(), default=str)


def test_cli_starts_its_own_broker_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "consume.json"
    r = CliRunner().invoke(
        app,
        ["bench", "consume", "--count", "500", "--size", "64", "--runs", "1",
         "--listener", "thread", "--json", str(out)],
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "OrbitMQ consumer benchmark (catch-up)" in r.stdout
    assert "own NameServer + Broker on 127.0.0.1" in r.stdout
    assert "push (thread listener" in r.stdout and "median" in r.stdout
    assert json.loads(out.read_text())["runs"][0]["messages"] == 500


def test_cli_e2e_against_a_cluster(namesrv: str, tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    r = CliRunner().invoke(
        app,
        ["bench", "e2e", "-n", namesrv, "-t", "BenchSmokeE2ECli", "--rate", "200",
         "--duration", "0.5", "--warmup", "0.2", "--runs", "1", "--size", "64",
         "--json", str(out)],
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "OrbitMQ end-to-end latency benchmark" in r.stdout
    data = json.loads(out.read_text())
    assert data["runs"][0]["received"] == data["runs"][0]["sent"] > 0
    assert set(data["median_latency_ms"]) >= {"p50", "p99", "max"}


def test_bad_options_are_usage_errors() -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "consume", "--mode", "turbo"]).exit_code == 2
    assert runner.invoke(app, ["bench", "consume", "--listener", "fiber"]).exit_code == 2
    assert runner.invoke(app, ["bench", "e2e", "--size", "4"]).exit_code == 2
    with pytest.raises(ValueError, match="mode"):
        bench.ConsumeBenchOptions(mode="nope").validate()
    with pytest.raises(ValueError, match="rate"):
        e2e.E2EBenchOptions(rate=0).validate()
