"""One producer of the benchmark through the blocking :class:`~orbitmq.client.Producer`
(``--api blocking``): the same warm-up, start signal, shares, pacing and latency recording as
:func:`orbitmq.bench.produce.worker.produce`, from a plain thread as a blocking user's code.

Modes: ``async`` is ``Producer.send_async`` with a callback per message (it runs on the
producer's I/O thread and records the latency); how many may be unanswered is the SDK's own
bound (``max_buffered_bytes``, as a blocking user gets it), not ``--window``. ``sync`` is
``send`` (or ``send_batch`` of ``--batch``), ``oneway`` is ``send_oneway``. Comparing
``--api blocking`` with ``--api async`` in the same run shows what the facade costs; the report's
client CPU per message (the process's CPU time over the messages answered) is the figure to
compare.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from orbitmq.bench.produce.model import ProduceBenchOptions, Recorder, WorkerResult
from orbitmq.client import Message, MessageQueue, Producer, SendResult
from orbitmq.common.errors import ClientError, MQError

__all__ = ["produce_blocking"]


def produce_blocking(
    options: ProduceBenchOptions,
    index: int,
    wait_for_start: Callable[[], None] | None = None,
) -> WorkerResult:
    """One blocking producer: warm up, wait for the start signal, send its share, report."""
    count = options.share(index)
    body = (f"bench {index} ".encode() + b"x" * options.size)[: options.size]
    msg = Message(options.topic, body)
    rec = Recorder()
    with Producer(options.namesrv, compress_over_bytes=-1) as producer:
        first: dict[str, MessageQueue] = {}
        for mq in producer.publish_queues(options.topic):
            first.setdefault(mq.broker_name, mq)
        if not first:
            raise ClientError(f"topic {options.topic!r} has no writable queue")
        for mq in first.values():
            producer.send(msg, queue=mq)
        if wait_for_start is not None:
            wait_for_start()
        cpu0 = time.process_time()
        started = time.perf_counter()
        deadline = None if options.duration_s is None else started + options.duration_s
        interval = options.producers / options.rate if options.rate > 0 else 0.0
        sent = 0

        def more(sent: int) -> bool:
            if rec.give_up:
                return False
            if count is not None:
                return sent < count
            assert deadline is not None
            return time.perf_counter() < deadline

        def pace(sent: int) -> bool:
            """Sleep until the slot of send number ``sent``; False when it lies past the end."""
            if not interval:
                return True
            due = started + sent * interval
            in_window = deadline is None or due < deadline
            until = due if deadline is None else min(due, deadline)
            while (now := time.perf_counter()) < until:
                time.sleep(until - now)
            return in_window

        mode, batch = options.mode, options.batch
        if mode == "sync" and batch:
            while more(sent) and pace(sent):
                n = batch if count is None else min(batch, count - sent)
                t0 = time.perf_counter_ns()
                try:
                    producer.send_batch([msg] * n)
                    rec.success(t0)
                    rec.ok += n - 1
                except MQError as exc:
                    rec.failure(exc, n)
                sent += n
        elif mode in ("sync", "oneway"):
            call = producer.send if mode == "sync" else producer.send_oneway
            while more(sent) and pace(sent):
                t0 = time.perf_counter_ns()
                try:
                    call(msg)
                    rec.success(t0)
                except MQError as exc:
                    rec.failure(exc)
                sent += 1
        else:
            sent = _send_async(producer, msg, rec, more, pace)
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


def _send_async(
    producer: Producer,
    msg: Message,
    rec: Recorder,
    more: Callable[[int], bool],
    pace: Callable[[int], bool],
) -> int:
    """send_async until ``more(sent)`` says stop, then flush (which returns once every answer's
    callback has run). Returns how many were sent."""
    samples = rec.samples
    perf_ns = time.perf_counter_ns

    def done(t0: int, result: SendResult | None, error: BaseException | None) -> None:
        # On the producer's I/O thread; this thread reads rec only after flush().
        if error is None:
            samples.append(perf_ns() - t0)
            rec.ok += 1
        else:
            rec.failure(error)

    send = producer.send_async
    sent = 0
    while more(sent) and pace(sent):
        send(msg, functools.partial(done, perf_ns()))
        sent += 1
    producer.flush()
    return sent
