"""The cold-read benchmark runs on a small count and reads every message hot and cold."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbitmq.bench.__main__ import main
from orbitmq.bench.tier import run_tier_bench


def test_run_tier_bench_small(tmp_path: Path) -> None:
    r = run_tier_bench(tmp_path, count=800, size=256, queues=2, segment=1024 * 1024)
    assert r["hot"] > 0 and r["cold"] > 0
    assert r["cold_share"] == 1.0  # every queue was read entirely from the tier


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tier", "--count", "400", "--size", "128", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hot read" in out and "cold read" in out and "100% of each queue" in out
