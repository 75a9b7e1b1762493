"""Progress where CLI work is long, off a terminal: StatusLines (a line at the start, then at
most every ``every_s``), and ``orbitmq pipeline``'s line per micro-batch (``_watch``, driven
here by a stand-in for Spark's StreamingQuery, so no JVM is needed)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from orbitmq.cli import common
from orbitmq.cli.common import StatusLines
from orbitmq.cli.pipeline import _watch


def test_status_lines_start_then_at_most_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(common.time, "monotonic", lambda: now[0])
    buf = io.StringIO()
    lines = StatusLines(Console(file=buf, width=200), "resending", 10, every_s=2.0)
    for done, at in ((1, 100.5), (2, 101.9), (3, 102.0), (4, 103.0), (5, 104.5)):
        now[0] = at
        lines.advance(done)
    assert buf.getvalue().splitlines() == [
        "resending 0/10 (0.0 s)",
        "resending 3/10 (2.0 s)",
        "resending 5/10 (4.5 s)",
    ]


class FakeQuery:
    """StreamingQuery's surface that run_query uses: two micro-batches, then it ends."""

    def __init__(self) -> None:
        self.turns = 0
        self.recentProgress: list[dict[str, Any]] = []

    @property
    def isActive(self) -> bool:  # Spark's name
        return self.turns < 2

    def awaitTermination(self, _timeout: float) -> None:  # Spark's name
        self.recentProgress.append({"batchId": self.turns, "numInputRows": 5 + self.turns,
                                    "durationMs": {"triggerExecution": 40}})  # fmt: skip
        self.turns += 1

    def stop(self) -> None:
        self.turns = 2

    def exception(self) -> None:
        return None


def test_pipeline_prints_a_line_per_micro_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert _watch(FakeQuery(), "the pipeline") == 11  # type: ignore[arg-type]  # a stand-in
    err = capsys.readouterr().err.splitlines()
    assert err == ["batch 0: 5 messages in 40 ms", "batch 1: 6 messages in 40 ms"], err
