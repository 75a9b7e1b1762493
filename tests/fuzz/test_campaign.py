"""`make fuzz`'s driver runs a target under atheris, times it and reports a table row, and
reports a crashing target as a crash (without stopping the campaign)."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import pytest

from tests.fuzz import campaign


def test_a_short_campaign_reports_runs_time_and_result(tmp_path: Path) -> None:
    report = tmp_path / "summary.md"
    rc = campaign.main(
        ["frame", "--runs", "300", "--logs", str(tmp_path / "logs"), "--report", str(report)]
    )
    assert rc == 0
    rows = report.read_text().splitlines()
    assert rows[0].startswith("| target |") and len(rows) == 3
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells[0] == "`frame`" and cells[1] == "300" and cells[5] == "0 crashes"
    assert (tmp_path / "logs" / "frame.log").exists()


def test_a_crash_is_reported_and_fails_the_campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashing_child(cmd: list[str], stdout: IO[bytes], stderr: int) -> int:
        stdout.write(b"==1== ERROR: libFuzzer: deadly signal\n")
        stdout.write(b"Test unit written to logs/crash-0a1b\nstat::number_of_executed_units: 17\n")
        return 77

    monkeypatch.setattr(campaign.subprocess, "call", crashing_child)
    outcome = campaign.run_target("sql92", 300, 5, 512, tmp_path)
    assert outcome.runs == 17 and outcome.result.startswith("CRASH (exit 77; logs/crash-0a1b")
    assert campaign.main(["sql92", "--runs", "5", "--logs", str(tmp_path)]) == 1


def test_an_interrupted_target_is_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stopped_child(cmd: list[str], stdout: IO[bytes], stderr: int) -> int:
        stdout.write(b"==9== libFuzzer: run interrupted; exiting\n")
        stdout.write(b"stat::number_of_executed_units: 5\n")
        return 72

    monkeypatch.setattr(campaign.subprocess, "call", stopped_child)
    assert campaign.run_target("ha", 300, 5, 512, tmp_path).result.startswith("interrupted")
