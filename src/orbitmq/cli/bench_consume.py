"""``orbitmq bench consume`` and ``orbitmq bench e2e``: the consumer benchmarks
(:mod:`orbitmq.bench.consume`, :mod:`orbitmq.bench.e2e`)."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orbitmq.bench.cluster import DEFAULT_QUEUES, LISTENERS, Meter
from orbitmq.bench.consume import (
    DEFAULT_COUNT,
    DEFAULT_TOPIC,
    MODES,
    ConsumeBenchOptions,
    format_consume_report,
    run_consume_bench,
)
from orbitmq.bench.e2e import (
    DEFAULT_E2E_TOPIC,
    E2EBenchOptions,
    format_e2e_report,
    run_e2e_bench,
)
from orbitmq.cli.common import err, expected_errors, out, quiet_library_logs

NamesrvBenchOpt = Annotated[
    str | None,
    typer.Option(
        "--namesrv",
        "-n",
        help="A running cluster's NameServers; default: start a NameServer + Broker "
        "(127.0.0.1, free ports, temporary data) for the benchmark.",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Own broker: keep its data here (default: a temporary folder)."
    ),
]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON here.")]
ListenerOpt = Annotated[
    str,
    typer.Option(
        "--listener",
        help="async: an async def listener on the consumer's loop; thread: a sync one.",
    ),
]


def _command(name: str) -> str:
    if sys.argv[1:3] == ["bench", name]:
        return shlex.join(["orbitmq", "bench", name, *sys.argv[3:]])
    return ""


@contextlib.contextmanager
def _progress() -> Iterator[Meter]:
    """A progress bar per step on stderr when it is a terminal; nothing otherwise."""
    console = err()
    if not console.is_terminal:
        yield lambda _what, _done, _total: None
        return
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def meter(what: str, done: int, total: int) -> None:
        task = tasks.get(what)
        if task is None or bars.tasks[task].total != total or done < bars.tasks[task].completed:
            if task is not None:
                bars.remove_task(task)
            task = tasks[what] = bars.add_task(what, total=total)
        bars.update(task, completed=done)

    with bars:
        yield meter


def _say(line: str) -> None:
    err().print(f"[dim]{escape(line)}[/]", soft_wrap=True)


def bench_consume(
    count: Annotated[
        int, typer.Option("--count", min=1, help="Messages to preload (and read back).")
    ] = DEFAULT_COUNT,
    size: Annotated[int, typer.Option("--size", min=1, help="Body size in bytes.")] = 1024,
    mode: Annotated[str, typer.Option("--mode", help="push, lite-pull or pop.")] = "push",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Reads, each a new group.")] = 3,
    batch: Annotated[
        int,
        typer.Option(
            "--batch",
            min=1,
            max=1024,
            help="push: consume_batch_size; lite-pull: poll_max; pop: messages per receive.",
        ),
    ] = 32,
    pull_batch: Annotated[
        int, typer.Option("--pull-batch", min=1, max=1024, help="Messages per pull request.")
    ] = 64,
    listener: ListenerOpt = "async",
    threads: Annotated[
        int, typer.Option("--threads", min=1, help="push, thread listener: consume threads.")
    ] = 20,
    pop_workers: Annotated[
        int, typer.Option("--pop-workers", min=1, help="pop: concurrent receive loops.")
    ] = 4,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")] = DEFAULT_TOPIC,
    queues: Annotated[
        int, typer.Option("--queues", min=1, help="Queues per broker if the topic is created.")
    ] = DEFAULT_QUEUES,
    skip_load: Annotated[
        bool,
        typer.Option("--skip-load", help="Read what the topic keeps (at least --count) instead."),
    ] = False,
    load_batch: Annotated[
        int, typer.Option("--load-batch", min=1, help="Preload: messages per send_batch.")
    ] = 256,
    stall: Annotated[
        float, typer.Option("--stall", min=0.1, help="Fail a run after this long with no message.")
    ] = 30.0,
    json_path: JsonOpt = None,
    data_dir: DataDirOpt = None,
    namesrv: NamesrvBenchOpt = None,
) -> None:
    """Consumer catch-up throughput: preload --count messages, then a new group reads them all.

    Reports msgs/s and MiB/s from the first message received to the last, median over --runs.
    Example: orbitmq bench consume --count 1000000 --mode push --batch 32
    """
    if mode not in MODES:
        raise typer.BadParameter(f"{mode!r}: one of {', '.join(MODES)}", param_hint="--mode")
    if listener not in LISTENERS:
        raise typer.BadParameter(
            f"{listener!r}: one of {', '.join(LISTENERS)}", param_hint="--listener"
        )
    options = ConsumeBenchOptions(
        namesrv=namesrv,
        data_dir=data_dir,
        topic=topic,
        count=count,
        size=size,
        queues=queues,
        runs=runs,
        mode=mode,
        batch=batch,
        pull_batch=pull_batch,
        threads=threads,
        listener=listener,
        pop_workers=pop_workers,
        skip_load=skip_load,
        load_batch=load_batch,
        stall_s=stall,
        command=_command("consume"),
    )
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with expected_errors(), quiet_library_logs(), _progress() as meter:
        result = run_consume_bench(options, _say, meter)
    out().print(escape(format_consume_report(result)), soft_wrap=True)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    if not result.runs or any(r.messages < result.expected for r in result.runs):
        raise typer.Exit(1)


def bench_e2e(
    rate: Annotated[float, typer.Option("--rate", min=1, help="Producer msgs/s.")] = 5000.0,
    duration: Annotated[
        float, typer.Option("--duration", min=0.1, help="Measured seconds per run.")
    ] = 30.0,
    warmup: Annotated[
        float, typer.Option("--warmup", min=0, help="Seconds sent first and not measured.")
    ] = 2.0,
    size: Annotated[int, typer.Option("--size", min=16, help="Body size in bytes.")] = 1024,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Runs, each a new group.")] = 3,
    tick: Annotated[
        float,
        typer.Option(
            "--tick-ms", min=0.1, help="Producer: a send_batch of what is due every tick."
        ),
    ] = 2.0,
    batch: Annotated[int, typer.Option("--batch", min=1, max=1024, help="consume_batch_size.")] = 1,
    pull_batch: Annotated[
        int, typer.Option("--pull-batch", min=1, max=1024, help="Messages per pull request.")
    ] = 64,
    listener: ListenerOpt = "async",
    threads: Annotated[
        int, typer.Option("--threads", min=1, help="Thread listener: consume threads.")
    ] = 20,
    drain: Annotated[
        float, typer.Option("--drain", min=0, help="Seconds to wait for the last messages.")
    ] = 10.0,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")] = DEFAULT_E2E_TOPIC,
    queues: Annotated[
        int, typer.Option("--queues", min=1, help="Queues per broker if the topic is created.")
    ] = DEFAULT_QUEUES,
    json_path: JsonOpt = None,
    data_dir: DataDirOpt = None,
    namesrv: NamesrvBenchOpt = None,
) -> None:
    """Publish-to-receive latency at a fixed rate: a producer process sends --rate msgs/s, a
    push consumer measures each message's latency from the send time in its body.

    Reports p50/p90/p99/p99.9/max (HdrHistogram) and the achieved rate, per run and median.
    Example: orbitmq bench e2e --rate 5000 --duration 30 --runs 3
    """
    if listener not in LISTENERS:
        raise typer.BadParameter(
            f"{listener!r}: one of {', '.join(LISTENERS)}", param_hint="--listener"
        )
    options = E2EBenchOptions(
        namesrv=namesrv,
        data_dir=data_dir,
        topic=topic,
        queues=queues,
        rate=rate,
        size=size,
        duration_s=duration,
        warmup_s=warmup,
        runs=runs,
        tick_ms=tick,
        batch=batch,
        pull_batch=pull_batch,
        threads=threads,
        listener=listener,
        drain_s=drain,
        command=_command("e2e"),
    )
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with expected_errors(), quiet_library_logs(), _progress() as meter:
        result = run_e2e_bench(options, _say, meter)
    out().print(escape(format_e2e_report(result)), soft_wrap=True)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
    if not result.runs or all(r.received == 0 for r in result.runs):
        raise typer.Exit(1)
