"""A fuzzing campaign: atheris on each decoder in turn, timed, with a summary table.

    python -m tests.fuzz.campaign [--runs N] [--timeout S] [--rss-mb M] [--report FILE]
                                  [--logs DIR] [TARGET ...]

``make fuzz`` runs it on every target with ``--runs $ORBITMQ_FUZZ_RUNS`` (1,000,000 by
default: the issue's long run). Each target is one ``python -m tests.fuzz.run`` child (libFuzzer
flags ``-runs``, ``-timeout`` (an input slower than this is a crash; the brief's bound is 1 s),
``-rss_limit_mb`` (the brief's bound is 512 MiB), ``-max_len=65536``); its output goes to
``<logs>/<target>.log`` and any crashing input to ``<logs>/crash-<sha1>``. A crash does not stop
the campaign: every target runs, the table says which crashed, and the exit status is non-zero
if any did. The table (markdown: target, inputs run, seconds, inputs per second, peak RSS,
result) is printed and, with ``--report``, written to a file for docs/security.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.targets import TARGETS

_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)


@dataclass(frozen=True, slots=True)
class Outcome:
    target: str
    runs: int
    seconds: float
    peak_rss_mb: int
    result: str

    def row(self) -> str:
        rate = self.runs / self.seconds if self.seconds > 0 else 0.0
        return (
            f"| `{self.target}` | {self.runs:,} | {self.seconds:,.0f} | {rate:,.0f} | "
            f"{self.peak_rss_mb} | {self.result} |"
        )


HEADER = (
    "| target | inputs run | seconds | inputs/s | peak RSS (MiB) | result |\n"
    "| --- | ---: | ---: | ---: | ---: | --- |"
)


def run_target(
    target: str, runs: int, timeout_s: int, rss_mb: int, logs: Path, max_len: int = 65536
) -> Outcome:
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{target}.log"
    cmd = [
        sys.executable, "-m", "tests.fuzz.run", target, f"-runs={runs}",
        f"-max_len={max_len}", f"-timeout={timeout_s}", f"-rss_limit_mb={rss_mb}",
        "-print_final_stats=1", f"-artifact_prefix={logs}/",
    ]  # fmt: skip
    started = time.monotonic()
    with log_path.open("wb") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    stats = {k: int(v) for k, v in _STAT.findall(text)}
    if rc == 0:
        result = "0 crashes"
    elif "libFuzzer: run interrupted" in text:  # stopped by a signal: no verdict
        result = "interrupted (0 crashes so far)"
    else:
        artifacts = re.findall(r"Test unit written to (\S+)", text)
        result = f"CRASH (exit {rc}; {', '.join(artifacts) or 'see ' + str(log_path)})"
    return Outcome(
        target,
        stats.get("number_of_executed_units", 0),
        seconds,
        stats.get("peak_rss_mb", 0),
        result,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.campaign")
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target")
    parser.add_argument("--timeout", type=int, default=5, help="seconds per input at most")
    parser.add_argument("--rss-mb", type=int, default=2048, help="peak RSS at most")
    parser.add_argument("--logs", type=Path, default=Path("fuzz-logs"))
    parser.add_argument("--report", type=Path, default=None, help="write the table here too")
    ns = parser.parse_args(argv)
    unknown = [t for t in ns.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    print(HEADER, flush=True)
    rows = [HEADER]
    crashed = False
    for target in ns.targets or list(TARGETS):
        outcome = run_target(target, ns.runs, ns.timeout, ns.rss_mb, ns.logs)
        crashed = crashed or outcome.result.startswith("CRASH")
        rows.append(outcome.row())
        print(outcome.row(), flush=True)
        if ns.report is not None:
            ns.report.write_text("\n".join(rows) + "\n")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
