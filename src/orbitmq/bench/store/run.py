"""Running the store benchmark: :func:`run_store_bench` (the selected cases, ``runs`` times
each) and the command line (:func:`add_arguments`, :func:`options_from_args`, :func:`main`),
which ``python -m orbitmq.bench store`` and ``orbitmq bench store`` share.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from orbitmq.bench.machine import loadavg, machine_info, measure_fsync_latency
from orbitmq.bench.store.cases import (
    bench_append,
    bench_read,
    bench_sync,
    bench_sync_async,
    case_dir,
)
from orbitmq.bench.store.model import (
    ALL_CASES,
    APPEND_CASES,
    ASYNC_SYNC_CASES,
    DESCRIPTIONS,
    READ_CASES,
    SYNC_CASES,
    CaseResult,
    Progress,
    RunSample,
    StoreBenchOptions,
    StoreBenchResults,
    run_line,
)
from orbitmq.bench.store.recovery import bench_recovery
from orbitmq.bench.store.report import format_markdown, format_report
from orbitmq.store.config import MiB


def run_store_bench(
    options: StoreBenchOptions, progress: Progress | None = None
) -> StoreBenchResults:
    """Run the selected cases and return their results (nothing is printed but ``progress``)."""
    selected = options.selected()
    began = time.perf_counter()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    made_base = False
    if options.directory is None:
        base_parent = Path.cwd() / ".bench-tmp"
        base_parent.mkdir(exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="store-", dir=base_parent))
        made_base = True
    else:
        base = options.directory
        base.mkdir(parents=True, exist_ok=True)
    cases: dict[str, CaseResult] = {
        name: CaseResult(
            name, DESCRIPTIONS[name], primary="seconds" if name == "recovery" else "msgs/s"
        )
        for name in selected
    }
    try:
        machine = machine_info(base)
        fsync_ms = (
            measure_fsync_latency(base, options.fsync_samples) if options.fsync_samples else {}
        )
        runners: list[tuple[dict[str, int], Callable[[Path, int, int, int], RunSample]]] = [
            (APPEND_CASES, bench_append),
            (SYNC_CASES, bench_sync),
            (ASYNC_SYNC_CASES, bench_sync_async),
        ]
        for table, bench in runners:
            for name, param in table.items():
                if name not in cases:
                    continue
                for i in range(options.runs):
                    with case_dir(base, name) as d:
                        s = bench(d, options.messages_for(name), param, options.body_size)
                    cases[name].runs.append(s)
                    if progress:
                        progress(run_line(f"{name} run {i + 1}/{options.runs}", s))
        wanted_reads = [c for c in READ_CASES if c in cases]
        if wanted_reads:
            with case_dir(base, "read") as d:
                samples = bench_read(
                    d,
                    options.messages_for("read"),
                    wanted_reads,
                    options.runs,
                    options.body_size,
                    progress,
                )
            for name in wanted_reads:
                cases[name].runs = samples[name]
        if "recovery" in cases:
            with case_dir(base, "recovery") as d:
                cases["recovery"].runs = bench_recovery(
                    d,
                    options.recovery_gib,
                    options.runs,
                    options.recovery_segment_bytes,
                    options.recovery_tail_s,
                    progress,
                )
    finally:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)
            with suppress(OSError):
                base.parent.rmdir()  # only if nothing else is in .bench-tmp
    return StoreBenchResults(
        command=options.command,
        machine=machine,
        fsync_latency_ms=fsync_ms,
        cases=list(cases.values()),
        started_at=started_at,
        total_seconds=time.perf_counter() - began,
        load_at_end=loadavg(),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--count", type=int, default=None,
        help="messages per run for every case (default: 20k append-b1, 200k append-b32/b256, "
        "2k sync-t1, 64k sync-t64, 1M read)",
    )  # fmt: skip
    parser.add_argument("--read-count", type=int, default=None, help="messages for the read cases")
    parser.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    parser.add_argument(
        "--dir", type=Path, default=None,
        help="where to put the stores (default: a temp dir under ./.bench-tmp)",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", default=[],
        help=f"cases or prefixes, comma-separated, repeatable: {', '.join(ALL_CASES)}",
    )  # fmt: skip
    parser.add_argument(
        "--recovery-gib", type=float, default=2.0, help="CommitLog size before SIGKILL (default 2)"
    )
    parser.add_argument(
        "--recovery-segment-mib", type=int, default=1024,
        help="CommitLog segment size for the recovery case (default 1024 = production)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="also write a Markdown table here"
    )


def options_from_args(ns: argparse.Namespace, command: str = "") -> StoreBenchOptions:
    only = tuple(t.strip() for arg in ns.only for t in arg.split(",") if t.strip())
    if ns.runs < 1:
        raise ValueError("--runs must be at least 1")
    for flag, value in (("--count", ns.count), ("--read-count", ns.read_count)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1")
    if ns.recovery_gib <= 0 or ns.recovery_segment_mib < 1:
        raise ValueError("--recovery-gib and --recovery-segment-mib must be positive")
    opts = StoreBenchOptions(
        runs=ns.runs,
        count=ns.count,
        read_count=ns.read_count,
        directory=ns.dir,
        only=only,
        recovery_gib=ns.recovery_gib,
        recovery_segment_bytes=ns.recovery_segment_mib * MiB,
        command=command,
    )
    opts.selected()  # validates --only
    return opts


def main(argv: list[str], command: str | None = None) -> int:
    from orbitmq.bench import store  # the package: its docstring is the benchmark's description

    doc = store.__doc__
    parser = argparse.ArgumentParser(
        prog="orbitmq bench store", description=doc.split("\n")[0] if doc else None
    )
    add_arguments(parser)
    ns = parser.parse_args(argv)
    cmd = command or shlex.join([sys.executable, "-m", "orbitmq.bench", "store", *argv])
    try:
        options = options_from_args(ns, cmd)
    except ValueError as exc:
        parser.error(str(exc))

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    results = run_store_bench(options, progress)
    print(format_report(results))
    if ns.json is not None:
        ns.json.write_text(json.dumps(results.to_json(), indent=2, default=str) + "\n")
    if ns.markdown is not None:
        ns.markdown.write_text(format_markdown(results))
    return 0
