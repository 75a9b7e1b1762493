"""The cold-read benchmark runs on a small count and reads every message hot and cold: from the
store, and through a broker by pull (two broker processes on one data folder: local, then
tiered with the local segments deleted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbitmq.bench.__main__ import main
from orbitmq.bench.tier import format_broker_result, run_tier_bench
from orbitmq.bench.tier_broker import BrokerTierResult, run_broker_tier_bench


def test_run_tier_bench_small(tmp_path: Path) -> None:
    r = run_tier_bench(tmp_path, count=800, size=256, queues=2, segment=1024 * 1024)
    assert r["hot"] > 0 and r["cold"] > 0
    assert r["cold_share"] == 1.0  # every queue was read entirely from the tier


def test_the_command_store_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tier", "--count", "400", "--size", "128", "--no-broker", "--dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "hot" in out and "cold" in out and "100% of each queue" in out


@pytest.mark.timeout(180)
def test_pulls_hot_then_from_the_tier(tmp_path: Path) -> None:
    """Both pull phases read exactly the loaded messages (the bench raises otherwise); the
    cold phase starts only once every queue's local data is gone."""
    r = run_broker_tier_bench(
        tmp_path, count=600, size=200, queues=2, runs=1, spark=False, segment=256 * 1024
    )
    assert len(r.pull_hot_s) == len(r.pull_cold_s) == 1
    assert r.chunks >= 2  # the tier holds the data (at least one chunk per queue)
    text = format_broker_result(r, 1)
    assert "msgs/s hot" in text and "msgs/s cold" in text and "pull ratio" in text
    assert "Spark batch read skipped: --no-spark" in text


def test_the_report_names_every_figure() -> None:
    r = BrokerTierResult(1000, [1.0], [2.0], [4.0], [5.0])
    r.pull_hot_cpu_s, r.pull_cold_cpu_s, r.chunks = [0.002], [0.003], 4
    text = format_broker_result(r, 1)
    assert "1,000 msgs/s hot" in text and "500 msgs/s cold" in text
    assert "0.50x (cold/hot" in text and "NOT met" in text  # under 50,000 msgs/s
    assert "CPU cold/hot 1.50x" in text and "250 msgs each" in text
    assert "250 rows/s hot" in text and "200 rows/s tier" in text and "0.80x (tier/hot" in text
