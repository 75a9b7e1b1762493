"""``orbitmq bench timer``: timer accuracy and a million pending timers
(:mod:`orbitmq.bench.timer`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orbitmq.bench.timer import TimerBenchOptions, format_report, run_timer_bench
from orbitmq.cli.common import err, expected_errors, out, quiet_library_logs


def bench_timer(
    count: Annotated[
        int, typer.Option("--count", min=1, help="Accuracy: timers to send and receive.")
    ] = 10_000,
    min_delay: Annotated[
        float, typer.Option("--min-delay", help="Accuracy: shortest delay, s.")
    ] = 1.0,
    max_delay: Annotated[
        float, typer.Option("--max-delay", help="Accuracy: longest delay, s.")
    ] = 30.0,
    pending: Annotated[
        int, typer.Option("--pending", min=1, help="Pending test: timers to hold (delays >= 1 h).")
    ] = 1_000_000,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Messages per send.")] = 256,
    inflight: Annotated[int, typer.Option("--inflight", min=1, help="Concurrent sends.")] = 8,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 64,
    flush: Annotated[
        str, typer.Option("--flush", help="ASYNC_FLUSH or SYNC_FLUSH.")
    ] = "ASYNC_FLUSH",
    skip_accuracy: Annotated[bool, typer.Option("--skip-accuracy")] = False,
    skip_pending: Annotated[bool, typer.Option("--skip-pending")] = False,
    no_restart: Annotated[
        bool, typer.Option("--no-restart", help="Pending test: do not restart the broker.")
    ] = False,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Keep the broker's data here.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the result as JSON here.")
    ] = None,
) -> None:
    """Timer lateness (p50/p99) and 1,000,000 pending timers (insert rate, broker memory),
    against a broker this command starts (127.0.0.1, free port, temporary data).

    Example: orbitmq bench timer --count 10000 --pending 1000000
    """
    options = TimerBenchOptions(
        count=count,
        min_delay_s=min_delay,
        max_delay_s=max_delay,
        pending=pending,
        batch=batch,
        inflight=inflight,
        size=size,
        flush=flush,
        accuracy=not skip_accuracy,
        pending_test=not skip_pending,
        restart=not no_restart,
        data_dir=data_dir,
        command=shlex.join(["orbitmq", "bench", "timer", *sys.argv[3:]])
        if sys.argv[1:3] == ["bench", "timer"]
        else "",
    )
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    progress = err()
    with expected_errors(), quiet_library_logs():
        result = run_timer_bench(options, lambda line: progress.print(f"[dim]{escape(line)}[/]"))
    out().print(escape(format_report(result)), soft_wrap=True)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    if result.accuracy and result.accuracy.get("missing", 0):
        raise typer.Exit(1)
