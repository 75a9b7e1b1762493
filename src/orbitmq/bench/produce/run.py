"""Running the producer benchmark: the broker side (topic, queues, what was stored),
:func:`run_produce_bench`, :func:`format_report`, and the command line that
``python -m orbitmq.bench produce`` and ``orbitmq bench produce`` share.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shlex
import sys
import threading
import time
from collections.abc import Iterator

from hdrh.histogram import HdrHistogram

from orbitmq.bench.produce.blocking import produce_blocking
from orbitmq.bench.produce.model import (
    APIS,
    DEFAULT_COUNT,
    DEFAULT_QUEUES,
    DEFAULT_TOPIC,
    MODES,
    PERCENTILES,
    STORED_WAIT_S,
    ProduceBenchOptions,
    ProduceBenchResult,
    Progress,
    new_histogram,
)
from orbitmq.bench.produce.worker import produce, run_processes
from orbitmq.client import AsyncAdminClient
from orbitmq.common.errors import ClientError, MQError
from orbitmq.net.loop import run as run_loop


async def _queue_total(admin: AsyncAdminClient, topic: str) -> int:
    desc = await admin.describe_topic(topic)
    return sum(q.max_offset for s in desc.stats for q in s.queues)


async def _prepare_topic(
    options: ProduceBenchOptions, progress: Progress
) -> tuple[dict[str, str], int]:
    """Create the topic if asked or missing; return the flush mode per broker and queue total."""
    async with AsyncAdminClient(options.namesrv) as admin:
        exists = options.topic in await admin.list_topics()
        if options.queues is not None or not exists:
            queues = options.queues or DEFAULT_QUEUES
            addrs = await admin.create_topic(
                options.topic,
                read_queue_nums=queues,
                write_queue_nums=queues,
                cluster=options.cluster,
            )
            progress(f"topic {options.topic}: {queues} queues on {len(addrs)} broker(s)")
            await _wait_for_queues(admin, options.topic, queues, len(addrs))
        info = await admin.routes.refresh(options.topic)
        names = sorted(info.broker_addrs)
        runtime = await asyncio.gather(
            *(admin.broker_runtime_info(info.broker_addrs[n]) for n in names)
        )
        flush = {
            n: str(rt.get("flush_disk_type", "?")) for n, rt in zip(names, runtime, strict=True)
        }
        return flush, await _queue_total(admin, options.topic)


async def _wait_for_queues(admin: AsyncAdminClient, topic: str, queues: int, brokers: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while loop.time() < deadline:
        try:
            route = await admin.topic_route(topic)
        except ClientError:
            route = None
        if route is not None:
            ok = [q for q in route.queue_datas if q.write_queue_nums == queues]
            if len(ok) >= brokers:
                return
        await asyncio.sleep(0.1)
    raise ClientError(f"the NameServers do not route {topic!r} with {queues} queues yet")


STATUS_S = 5.0
"""While the producers run, a line every this many seconds: messages stored so far and the
rate since the last line (read from the broker's queues by a thread with its own client, so
the measured producers are not touched)."""


@contextlib.contextmanager
def _status_lines(options: ProduceBenchOptions, before: int, say: Progress) -> Iterator[None]:
    stop = threading.Event()

    async def report() -> None:
        with contextlib.suppress(MQError):  # no status lines, the run goes on
            await _report(options, before, say, stop)

    thread = threading.Thread(target=run_loop, args=(report(),), name="bench-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


async def _report(
    options: ProduceBenchOptions, before: int, say: Progress, stop: threading.Event
) -> None:
    async with AsyncAdminClient(options.namesrv) as admin:
        started = last_t = time.monotonic()
        last = 0
        while not await asyncio.to_thread(stop.wait, STATUS_S):
            with contextlib.suppress(MQError):
                grown = await _queue_total(admin, options.topic) - before
                now = time.monotonic()
                rate = (grown - last) / max(1e-9, now - last_t)
                say(f"running {now - started:.0f} s: {grown:,} stored ({rate:,.0f} msgs/s)")
                last, last_t = grown, now


async def _stored_after(options: ProduceBenchOptions, before: int, expected: int) -> int | None:
    """Queue growth since ``before``, waiting a little for dispatch to catch up."""
    try:
        async with AsyncAdminClient(options.namesrv) as admin:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STORED_WAIT_S
            grown = await _queue_total(admin, options.topic) - before
            while grown < expected and loop.time() < deadline:
                await asyncio.sleep(0.1)
                grown = await _queue_total(admin, options.topic) - before
            return grown
    except MQError:
        return None


# ---------------------------------------------------------------------------- run and report


def run_produce_bench(
    options: ProduceBenchOptions, progress: Progress | None = None
) -> ProduceBenchResult:
    """Run the benchmark against the cluster at ``options.namesrv``. Raises MQError (cannot
    reach it, no route, a producer failed to start) or ValueError (bad options)."""
    options.validate()
    say: Progress = progress or (lambda _line: None)
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    flush, before = run_loop(_prepare_topic(options, say))
    with _status_lines(options, before, say):
        if options.producers == 1:
            say("warming up and running 1 producer in this process")
            if options.api == "blocking":
                workers = [produce_blocking(options, 0)]
            else:
                workers = [run_loop(produce(options, 0))]
        else:
            workers = run_processes(options, say)
    hist = new_histogram()
    for w in workers:
        hist.add(HdrHistogram.decode(w.histogram.encode("ascii")))
    messages = sum(w.messages for w in workers)
    warmup = sum(w.warmup for w in workers)
    expected = messages + warmup
    stored = run_loop(_stored_after(options, before, expected))
    latency = {f"p{p:g}": hist.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
    latency["max"] = hist.get_max_value() / 1000
    latency["mean"] = hist.get_mean_value() / 1000
    return ProduceBenchResult(
        options=options,
        messages=messages,
        errors=sum(w.errors for w in workers),
        seconds=max(w.seconds for w in workers),
        latency_ms=latency,
        flush_types=flush,
        stored=stored,
        warmup=warmup,
        workers=workers,
        started_at=started_at,
        machine={
            "python": platform.python_version(),
            "cpus": str(os.cpu_count()),
            "platform": platform.platform(terse=True),
        },
        first_error=next((w.first_error for w in workers if w.first_error), None),
    )


def format_report(result: ProduceBenchResult) -> str:
    o = result.options
    what = f"{o.duration_s:g} s" if o.duration_s is not None else f"{o.count or DEFAULT_COUNT} msgs"
    batching = f"batch {o.batch}" if o.batch else "automatic batching" if o.mode == "async" else ""
    flush = ", ".join(f"{b} {t}" for b, t in sorted(result.flush_types.items()))
    lat = result.latency_ms
    lines = [
        "OrbitMQ producer benchmark",
        *([f"command: {o.command}"] if o.command else []),
        f"started: {result.started_at}; python {result.machine.get('python')}, "
        f"{result.machine.get('cpus')} cpus",
        f"topic {o.topic}, mode {o.mode}{', ' + batching if batching else ''}, "
        + ("blocking Producer, " if o.api == "blocking" else "")
        + f"{o.producers} producer{'s' if o.producers != 1 else ''}, {o.size} B bodies, {what}"
        + (f", rate {o.rate:g} msgs/s" if o.rate else ""),
        f"broker flush: {flush or '?'}",
        "",
        f"messages   {result.messages:,} in {result.seconds:.2f} s"
        + (f" ({result.errors:,} failed)" if result.errors else ""),
        f"throughput {result.msgs_per_s:,.0f} msgs/s, {result.mib_per_s:,.2f} MiB/s",
        f"client CPU {result.client_cpu_us_per_msg:,.1f} us/msg (producer process CPU time "
        "over messages answered)",
        "latency ms "
        + "  ".join(f"{k} {v:.3f}" for k, v in lat.items() if k != "mean")
        + f"  (mean {lat['mean']:.3f}; "
        + (
            "enqueue to result"
            if o.mode == "async"
            else "round trip"
            if o.mode == "sync"
            else "send call"
        )
        + ")",
    ]
    if result.stored is not None:
        counted = "sent" if o.mode == "oneway" else "answered"
        lines.append(
            f"stored     {result.stored:,} ({counted} {result.messages:,} + warm-up {result.warmup})"
        )
        missing = result.messages + result.warmup - result.stored
        if missing > 0:
            lines.append(
                f"MISSING    {missing:,} messages are not in the topic's queues "
                f"{STORED_WAIT_S:g} s after the run"
                + (
                    " (oneway sends have no answer: lost without a trace)"
                    if o.mode == "oneway"
                    else ""
                )
            )
    if len(result.workers) > 1:
        lines.append(
            "producers  "
            + ", ".join(
                f"#{w.index} {w.messages / w.seconds if w.seconds else 0:,.0f}/s"
                for w in result.workers
            )
        )
    if result.first_error:
        lines.append(f"first error: {result.first_error}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- CLI glue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namesrv", "-n", default=os.environ.get("ORBITMQ_NAMESRV", "127.0.0.1:9876")
    )
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--producers", type=int, default=1, help="producer processes")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument(
        "--count", type=int, default=None, help=f"messages (default {DEFAULT_COUNT})"
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds, instead of --count")
    parser.add_argument("--batch", type=int, default=0, help="send_batch size; 0: automatic")
    parser.add_argument("--mode", choices=MODES, default="async")
    parser.add_argument(
        "--api", choices=APIS, default="async", help="AsyncProducer or the blocking Producer"
    )
    parser.add_argument(
        "--queues", type=int, default=None, help="(re)create the topic with N queues"
    )
    parser.add_argument("--cluster", default=None)
    parser.add_argument("--rate", type=float, default=0.0, help="target msgs/s, 0: unlimited")
    parser.add_argument("--window", type=int, default=16_384, help="async: in flight per producer")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")


def options_from_args(ns: argparse.Namespace, command: str) -> ProduceBenchOptions:
    options = ProduceBenchOptions(
        namesrv=ns.namesrv,
        topic=ns.topic,
        producers=ns.producers,
        size=ns.size,
        count=ns.count,
        duration_s=ns.duration,
        batch=ns.batch,
        mode=ns.mode,
        queues=ns.queues,
        cluster=ns.cluster,
        rate=ns.rate,
        window=ns.window,
        api=ns.api,
        command=command,
    )
    options.validate()
    return options


def main(argv: list[str], command: str | None = None) -> int:
    from orbitmq.bench import produce  # the package: its docstring is the benchmark's description

    doc = produce.__doc__
    parser = argparse.ArgumentParser(
        prog="orbitmq bench produce", description=doc.split("\n")[0] if doc else None
    )
    add_arguments(parser)
    ns = parser.parse_args(argv)
    cmd = command or shlex.join([sys.executable, "-m", "orbitmq.bench", "produce", *argv])
    try:
        options = options_from_args(ns, cmd)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result = run_produce_bench(options, lambda line: print(f"  {line}", file=sys.stderr))
    except MQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_report(result))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result.to_json(), f, indent=2, default=str)
            f.write("\n")
    return 0 if result.messages else 1
