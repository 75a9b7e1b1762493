"""The store benchmark's report: the text table :func:`format_report` prints and the
Markdown of :func:`format_markdown` (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics

from orbitmq.bench.store.model import CaseResult, StoreBenchResults


def _num(v: float, seconds: bool) -> str:
    if seconds:
        return f"{v:.3f} s"
    return f"{v:,.0f}"


def _notes(case: CaseResult) -> str:
    if not case.runs:
        return ""
    ex = [r.extra for r in case.runs]

    def med(key: str) -> float:
        vals = [e[key] for e in ex if e.get(key) is not None]
        return statistics.median(vals) if vals else math.nan

    cpu = f"CPU {med('cpu_us_per_msg'):.2f} us/msg; " if "cpu_us_per_msg" in ex[0] else ""
    if case.name.startswith("append"):
        return f"{cpu}dispatch catch-up after last append {med('dispatch_catch_up_s'):.2f} s"
    if case.name.startswith("sync"):
        return (
            f"{cpu}fsyncs {med('fsyncs'):,.0f} ({med('msgs_per_fsync'):,.1f} msgs/fsync); "
            f"put p50 {med('put_p50_ms'):.2f} ms, p99 {med('put_p99_ms'):.2f} ms"
        )
    if case.name.startswith("read"):
        crc = "CRC verified on read" if ex[0].get("crc_verified") else "CRC not re-checked"
        return f"{cpu}{crc}"
    if case.name == "recovery":
        return (
            f"CommitLog {med('commit_log_gib'):.2f} GiB; recover() {med('recover_s'):.3f} s; "
            f"scanned {med('records_scanned'):,.0f} records ({med('scanned_mib'):,.1f} MiB); "
            f"cut {med('bytes_cut'):,.0f} bytes"
        )
    return ""


def _cpu_rate(case: CaseResult) -> str:
    """Messages per CPU-second of the whole process (1e6 / median CPU us per message): an
    estimate of what one otherwise idle core would do, less sensitive to a noisy machine."""
    cpu = [r.extra["cpu_us_per_msg"] for r in case.runs if r.extra.get("cpu_us_per_msg")]
    return f"{1e6 / statistics.median(cpu):,.0f}" if cpu else ""


TABLE_HEADER = (
    "case", "what", "runs", "median", "min", "max", "unit", "MiB/s", "msgs/CPU-s", "target",
    "met",
)  # fmt: skip


def table_rows(results: StoreBenchResults) -> list[tuple[str, ...]]:
    """One row per case that ran, in :data:`TABLE_HEADER` order."""
    rows: list[tuple[str, ...]] = []
    for c in results.cases:
        if not c.runs:
            continue
        secs = c.primary == "seconds"
        vals = c.values()
        met = c.target_met
        rows.append(
            (
                c.name,
                c.description,
                str(len(c.runs)),
                _num(c.median, secs),
                _num(min(vals), secs),
                _num(max(vals), secs),
                "open() s" if secs else "msgs/s",
                "" if secs else f"{c.median_mib_per_s:,.1f}",
                "" if secs else _cpu_rate(c),
                c.target,
                "" if met is None else ("yes" if met else "NO"),
            )
        )
    return rows


def _fsync_line(results: StoreBenchResults) -> str:
    f = results.fsync_latency_ms
    if not f:
        return ""
    return (
        f"fdatasync after a 4 KiB pwrite ({f.get('samples', 0):.0f} samples): "
        f"p50 {f['p50']:.2f} ms, p90 {f['p90']:.2f} ms, p99 {f['p99']:.2f} ms, "
        f"max {f['max']:.2f} ms"
    )


def format_report(results: StoreBenchResults) -> str:
    """The plain-text report: machine, command, table, per-case notes."""
    lines = [
        "OrbitMQ storage benchmark",
        f"command: {results.command}",
        f"started: {results.started_at}",
    ]
    lines += [f"{k}: {v}" for k, v in results.machine.items()]
    if results.fsync_latency_ms:
        lines.append(_fsync_line(results))
    lines.append("")
    rows = [TABLE_HEADER, *table_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    right = {2, 3, 4, 5, 7, 8}
    for r in rows:
        cells = [
            r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(r))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    lines.append("notes (medians):")
    lines += [f"  {c.name}: {_notes(c)}" for c in results.cases if c.runs]
    rec = next((c for c in results.cases if c.name == "recovery" and c.runs), None)
    if rec is not None:
        lines.append("")
        lines.append("recovery runs:")
        for i, s in enumerate(rec.runs, 1):
            lines.append(
                f"  run {i}: "
                + ", ".join(f"{k}={v}" for k, v in s.extra.items())
                + f", open_s={s.seconds:.3f}"
            )
    lines.append("")
    lines.append(
        f"total time {results.total_seconds:.0f} s; load average at end {results.load_at_end}"
    )
    return "\n".join(lines)


def format_markdown(results: StoreBenchResults) -> str:
    """The same results as Markdown (for docs/benchmarks.md)."""
    lines = [f"Command: `{results.command}` (started {results.started_at}, took "
             f"{results.total_seconds:.0f} s)", ""]  # fmt: skip
    lines += [f"- {k}: {v}" for k, v in results.machine.items()]
    lines.append(f"- load average at end: {results.load_at_end}")
    if results.fsync_latency_ms:
        lines.append(f"- {_fsync_line(results)}")
    lines.append("")
    right = {2, 3, 4, 5, 7, 8}
    lines.append("| " + " | ".join(TABLE_HEADER) + " | notes (medians) |")
    lines.append(
        "|" + "|".join("---:" if i in right else "---" for i in range(len(TABLE_HEADER))) + "|---|"
    )
    notes = {c.name: _notes(c) for c in results.cases if c.runs}
    for r in table_rows(results):
        met = f"**{r[10]}**" if r[10] == "NO" else r[10]
        lines.append("| " + " | ".join((*r[:10], met, notes[r[0]])) + " |")
    return "\n".join(lines) + "\n"
