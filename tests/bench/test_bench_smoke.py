"""Smoke test of the storage benchmark: every case runs with tiny counts and returns sane
numbers. Not a performance test: nothing here asserts a speed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orbitmq.bench import store as bench
from orbitmq.bench.__main__ import main as bench_main
from orbitmq.store.config import MiB


def _sane(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_every_case_runs_and_reports_sane_numbers(tmp_path: Path) -> None:
    options = bench.StoreBenchOptions(
        runs=2,
        count=100,
        read_count=300,
        directory=tmp_path / "bench",
        recovery_gib=8 * MiB / 1024**3,
        recovery_segment_bytes=8 * MiB,
        recovery_tail_s=0.05,
        fsync_samples=5,
        command="pytest smoke",
    )
    lines: list[str] = []
    results = bench.run_store_bench(options, lines.append)

    assert [c.name for c in results.cases] == list(bench.ALL_CASES)
    for case in results.cases:
        assert len(case.runs) == 2, case.name
        for run in case.runs:
            assert _sane(run.seconds), (case.name, run)
            assert run.bytes > 0, (case.name, run)
            if case.name != "recovery":
                assert _sane(run.msgs_per_s) and _sane(run.mib_per_s), (case.name, run)
        assert _sane(case.median)
        assert min(case.values()) <= case.median <= max(case.values())

    by_name = {c.name: c for c in results.cases}
    for name in (*bench.APPEND_CASES, *bench.SYNC_CASES):
        for run in by_name[name].runs:
            assert run.messages == 100
            # 1 KiB body plus header and topic: each record is a bit over 1 KiB.
            assert 100 * 1024 < run.bytes < 100 * 1200
    for name in bench.READ_CASES:
        assert all(r.messages == 300 for r in by_name[name].runs)
        assert all(r.extra["crc_verified"] is ("reopen" in name) for r in by_name[name].runs)
    for run in by_name["sync-t64"].runs:
        # Group commit: every put waited for an fsync, and no more fsyncs than puts.
        assert 1 <= run.extra["fsyncs"] <= 100
    for run in by_name["sync-t1"].runs:
        assert run.extra["fsyncs"] >= 1
    for run in by_name["recovery"].runs:
        assert run.extra["commit_log_gib"] * 1024 >= 8  # filled past the target before SIGKILL
        assert run.extra["records_scanned"] >= 1
        assert run.extra["cuts"] >= 0 and run.extra["bytes_cut"] >= 0
        assert 0 < run.extra["recover_s"] <= run.seconds

    assert results.machine["cpu"] and results.machine["python"]
    assert set(results.fsync_latency_ms) >= {"p50", "p99", "max"}
    report = bench.format_report(results)
    assert "command: pytest smoke" in report
    for name in bench.ALL_CASES:
        assert name in report
    json.dumps(results.to_json(), default=str)  # serialisable
    assert len(lines) >= 2 * len(bench.ALL_CASES)
    # Every case cleaned up its data dir.
    assert list((tmp_path / "bench").iterdir()) == []


def test_cli_runs_selected_cases_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    rc = bench_main(
        ["store", "--only", "append-b32,read-hot", "--count", "64", "--runs", "1",
         "--dir", str(tmp_path / "d"), "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "append-b32" in text and "read-hot-m256" in text and "sync-t64" not in text
    assert "-m orbitmq.bench store --only append-b32,read-hot" in text
    data = json.loads(out.read_text())
    assert [c["name"] for c in data["cases"]] == ["append-b32", "read-hot-m32", "read-hot-m256"]
    assert all(c["median"] > 0 for c in data["cases"])


def test_unknown_case_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown case"):
        bench.StoreBenchOptions(only=("nope",)).selected()
