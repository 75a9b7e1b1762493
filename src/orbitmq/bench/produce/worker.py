"""One producer of the benchmark (:func:`produce`: warm up, wait for the common start, send
its share, record latencies) and the spawned processes that run several at once
(:func:`run_processes`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import queue
import time
from collections.abc import Awaitable, Callable
from multiprocessing.queues import Queue as MPQueue
from typing import Any

from orbitmq.bench.produce.blocking import produce_blocking
from orbitmq.bench.produce.model import (
    STARTUP_TIMEOUT_S,
    ProduceBenchOptions,
    Progress,
    Recorder,
    WorkerResult,
)
from orbitmq.client import AsyncProducer, Message, MessageQueue, SendResult
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.loop import run as run_loop


async def produce(
    options: ProduceBenchOptions,
    index: int,
    wait_for_start: Callable[[], Awaitable[None]] | None = None,
) -> WorkerResult:
    """One producer: warm up, wait for the start signal, send its share, report."""
    count = options.share(index)
    body = (f"bench {index} ".encode() + b"x" * options.size)[: options.size]
    msg = Message(options.topic, body)
    rec = Recorder()
    async with AsyncProducer(options.namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        info = await producer.routes.get(options.topic)
        first: dict[str, MessageQueue] = {}
        for mq in info.write_queues:
            first.setdefault(mq.broker_name, mq)
        if not first:
            raise ClientError(f"topic {options.topic!r} has no writable queue")
        for mq in first.values():
            await producer.send(msg, queue=mq)
        if wait_for_start is not None:
            await wait_for_start()
        cpu0 = time.process_time()
        started = time.perf_counter()
        deadline = None if options.duration_s is None else started + options.duration_s
        interval = options.producers / options.rate if options.rate > 0 else 0.0

        sent = 0

        def more() -> bool:
            if rec.give_up:
                return False
            if count is not None:
                return sent < count
            assert deadline is not None
            return time.perf_counter() < deadline

        async def pace() -> bool:
            """Wait for the next send's slot; when it lies past the deadline, wait for that and say False.

            The loop guards against timers that fire a little early (uvloop rounds to
            milliseconds): a send must never go before its slot, or a paced run could
            exceed its rate by one.
            """
            if not interval:
                return True
            due = started + sent * interval
            in_window = deadline is None or due < deadline
            until = due if deadline is None else min(due, deadline)
            while (now := time.perf_counter()) < until:
                await asyncio.sleep(until - now)
            return in_window

        mode, batch = options.mode, options.batch
        if mode == "sync" and batch:
            while more() and await pace():
                n = batch if count is None else min(batch, count - sent)
                t0 = time.perf_counter_ns()
                try:
                    await producer.send_batch([msg] * n)
                    rec.success(t0)
                    rec.ok += n - 1
                except MQError as exc:
                    rec.failure(exc, n)
                sent += n
        elif mode == "sync":
            while more() and await pace():
                t0 = time.perf_counter_ns()
                try:
                    await producer.send(msg)
                    rec.success(t0)
                except MQError as exc:
                    rec.failure(exc)
                sent += 1
        elif mode == "oneway":
            while more() and await pace():
                t0 = time.perf_counter_ns()
                try:
                    await producer.send_oneway(msg)
                    rec.success(t0)
                except MQError as exc:
                    rec.failure(exc)
                sent += 1
        elif batch:
            slots = asyncio.Semaphore(max(1, options.window // batch))
            tasks = TaskSet("bench producer")

            async def one(n: int, t0: int) -> None:
                try:
                    await producer.send_batch([msg] * n)
                    rec.success(t0, n)
                except MQError as exc:
                    rec.failure(exc, n)
                finally:
                    slots.release()

            while more() and await pace():
                await slots.acquire()
                n = batch if count is None else min(batch, count - sent)
                tasks.spawn(one(n, time.perf_counter_ns()))
                sent += n
            await tasks.wait()
            if tasks.failures:  # not an MQError: a bug, already logged by the set
                raise ClientError(
                    f"{tasks.failures} send task(s) failed unexpectedly (see the log)"
                )
        else:
            outstanding = 0
            room = asyncio.Event()
            low_water = options.window // 2
            samples = rec.samples  # spilled at the end: a run holds at most a few 10M

            def done(t0: int, fut: asyncio.Future[SendResult]) -> None:
                nonlocal outstanding
                outstanding -= 1
                if fut.cancelled():
                    rec.failure(ClientError("cancelled"))
                elif (exc := fut.exception()) is not None:
                    rec.failure(exc)
                else:
                    samples.append(time.perf_counter_ns() - t0)
                    rec.ok += 1
                if outstanding <= low_water:
                    room.set()

            while more():
                if outstanding >= options.window:
                    room.clear()
                    await room.wait()
                    continue
                if not await pace():
                    break
                t0 = time.perf_counter_ns()
                fut = producer.send_async(msg)
                fut.add_done_callback(functools.partial(done, t0))
                outstanding += 1
                sent += 1
                if sent % 128 == 0:
                    await asyncio.sleep(0)  # let full batches go out
            await producer.flush()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu0
    rec.spill()
    return WorkerResult(
        index=index,
        messages=rec.ok,
        errors=rec.errors,
        seconds=seconds,
        warmup=len(first),
        first_error=rec.first_error,
        histogram=rec.hist.encode().decode("ascii"),
        cpu_s=cpu,
    )


def _worker_process(
    options: ProduceBenchOptions,
    index: int,
    ready: MPQueue[tuple[int, str | None]],
    go: Any,
    results: MPQueue[WorkerResult | tuple[int, str]],
) -> None:
    """Entry point of a producer process (spawned: it imports this module afresh)."""
    logging.getLogger("orbitmq").setLevel(logging.ERROR)  # the parent reports failures

    async def wait_for_start() -> None:
        ready.put((index, None))
        await asyncio.to_thread(go.wait)

    def wait_for_start_blocking() -> None:
        ready.put((index, None))
        go.wait()

    try:
        if options.api == "blocking":
            result = produce_blocking(options, index, wait_for_start_blocking)
        else:
            result = run_loop(produce(options, index, wait_for_start))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        ready.put((index, f"{type(exc).__name__}: {exc}"))
        results.put((index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(result)


def run_processes(options: ProduceBenchOptions, progress: Progress) -> list[WorkerResult]:
    ctx = multiprocessing.get_context("spawn")
    ready: MPQueue[tuple[int, str | None]] = ctx.Queue()
    results: MPQueue[WorkerResult | tuple[int, str]] = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker_process,
            args=(options, i, ready, go, results),
            name=f"orbitmq-bench-producer-{i}",
            daemon=True,
        )
        for i in range(options.producers)
    ]
    try:
        for p in procs:
            p.start()
        progress(f"started {len(procs)} producer processes; warming up")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for _ in procs:
            try:
                index, problem = ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ClientError("producer processes did not get ready in time") from None
            if problem is not None:
                raise ClientError(f"producer {index} failed to start: {problem}")
        progress("running")
        go.set()
        out: list[WorkerResult] = []
        while len(out) < len(procs):
            try:
                item = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ClientError(f"producer process died: {', '.join(dead)}") from None
                continue
            if isinstance(item, tuple):
                raise ClientError(f"producer {item[0]} failed: {item[1]}")
            out.append(item)
        for p in procs:
            p.join(10)
        return sorted(out, key=lambda w: w.index)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        ready.close()
        results.close()
