"""Smoke test of `orbitmq bench timer`: tiny counts, the shape of the output and the JSON.
Not a performance test: nothing here asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app

pytestmark = pytest.mark.integration


def test_timer_bench_measures_lateness_and_pending_timers(tmp_path: Path) -> None:
    out = tmp_path / "timer.json"
    result = CliRunner().invoke(
        app,
        [
            "bench", "timer", "--count", "40", "--min-delay", "0.2", "--max-delay", "0.6",
            "--pending", "2000", "--json", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    accuracy, pending = data["accuracy"], data["pending"]
    # Every accuracy timer came back, none before its time.
    assert accuracy["received"] == accuracy["messages"] == 40
    assert accuracy["missing"] == 0 and accuracy["early"] == 0
    assert 0 <= accuracy["lateness_ms_p50"] <= accuracy["lateness_ms_max"]
    # The pending timers were all indexed, and all still pending after the restart.
    assert pending["timers"] == pending["pending_after_restart"] == 2000
    assert pending["rss_after_restart_mb"] > 0
