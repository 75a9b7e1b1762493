"""The cluster a client benchmark measures, and the data it loads: shared by ``orbitmq bench
consume``, ``e2e``, ``grpc`` and ``spark``.

:func:`target_cluster` is ``namesrv`` as given or, when it is None, a NameServer + Broker
started here (``python -m orbitmq up`` on 127.0.0.1 free ports, data in a temporary folder
removed afterwards, or in ``data_dir`` which is kept) and stopped at the end. The helpers create
and preload a topic, wait for dispatch, describe the machine and build the push consumer both
consumer benchmarks use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbitmq.client.consumer.push import PushConsumer


from orbitmq.bench._child import ServerChild
from orbitmq.bench.machine import cpu_model, loadavg
from orbitmq.client import (
    AsyncAdminClient,
    AsyncProducer,
    BlockingAdminClient,
    Message,
    MessageQueue,
)
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.consumer_types import ConsumedMessage, ConsumeFromWhere, ConsumeResult
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.clock import now_ms
from orbitmq.common.errors import ClientError, MQError
from orbitmq.common.tasks import TaskSet

LISTENERS = ("async", "thread")


DEFAULT_QUEUES = 8


READY_TIMEOUT_S = 60.0
DISPATCH_WAIT_S = 60.0


LOAD_IN_FLIGHT = 16
"""Preload: send_batch calls in flight at once."""


Say = Callable[[str], None]
Meter = Callable[[str, int, int], None]
"""(what, done, total): progress of a long step, for a progress bar."""


def nothing(*_args: Any) -> None:
    return None


# ---------------------------------------------------------------------------- own cluster


@dataclass(slots=True)
class Target:
    namesrv: str
    own: bool
    """True: a NameServer + Broker this benchmark started (and stops)."""
    data_dir: str = ""
    flush: str = ""


@contextlib.contextmanager
def target_cluster(namesrv: str | None, data_dir: Path | None, say: Say) -> Iterator[Target]:
    """The cluster to measure: ``namesrv`` as given, or a NameServer + Broker started here
    (``python -m orbitmq up`` on 127.0.0.1 free ports) and stopped (SIGTERM by pid) after."""
    if namesrv:
        yield Target(namesrv, own=False)
        return
    made = data_dir is None
    folder = Path(tempfile.mkdtemp(prefix="orbitmq-bench-")) if made else Path(data_dir or ".")
    folder.mkdir(parents=True, exist_ok=True)
    child = ServerChild(
        [
            "orbitmq", "up", "--namesrv-port", "0", "--broker-port", "0",
            "--data-dir", str(folder), "--host", "127.0.0.1", "--log-level", "WARNING",
        ],
        folder / "up.log",
        "orbitmq up ready ",
    )  # fmt: skip
    try:
        pairs = (p.partition("=") for p in child.start(READY_TIMEOUT_S).split())
        endpoints = {k: v for k, _, v in pairs}
        say(
            f"started NameServer {endpoints.get('namesrv')} + Broker {endpoints.get('broker')} "
            f"({endpoints.get('flush', '?')}) in {folder}"
        )
        yield Target(
            endpoints["namesrv"], own=True, data_dir=str(folder), flush=endpoints.get("flush", "")
        )
    finally:
        child.stop(30.0)
        if made:
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------- topic + load


async def ensure_topic(admin: AsyncAdminClient, topic: str, queues: int, say: Say) -> int:
    """Create the topic with ``queues`` queues per broker unless it exists; its read queues."""
    if topic not in await admin.list_topics():
        addrs = await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        say(f"topic {topic}: {queues} queues on {len(addrs)} broker(s)")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while True:
        try:
            found = await admin.queues(topic)
        except MQError:
            found = []
        if found:
            return len(found)
        if loop.time() >= deadline:
            raise ClientError(f"the NameServers do not route {topic!r}")
        await asyncio.sleep(0.1)


async def kept_messages(admin: AsyncAdminClient, topic: str) -> tuple[int, int]:
    """(messages kept in the topic's queues, sum of max offsets)."""
    desc = await admin.describe_topic(topic)
    kept = sum(max(0, q.max_offset - q.min_offset) for s in desc.stats for q in s.queues)
    return kept, sum(q.max_offset for s in desc.stats for q in s.queues)


async def flush_types(admin: AsyncAdminClient, topic: str) -> dict[str, str]:
    info = await admin.routes.refresh(topic)
    names = sorted(info.broker_addrs)
    runtime = await asyncio.gather(
        *(admin.broker_runtime_info(info.broker_addrs[n]) for n in names), return_exceptions=True
    )
    return {
        n: str(rt.get("flush_disk_type", "?")) if isinstance(rt, dict) else "?"
        for n, rt in zip(names, runtime, strict=True)
    }


@dataclass(slots=True)
class LoadResult:
    messages: int
    seconds: float
    skipped: bool

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def load_topic(
    namesrv: str,
    topic: str,
    count: int,
    size: int,
    batch: int,
    say: Say,
    meter: Meter,
) -> float:
    """Send ``count`` bodies of ``size`` bytes with explicit send_batch calls, queues in turn,
    LOAD_IN_FLIGHT at once. Returns the seconds it took."""
    body = (b"bench-consume " + b"x" * size)[:size]
    async with AsyncProducer(namesrv, ProducerConfig(compress_over_bytes=-1)) as producer:
        info = await producer.routes.get(topic)
        queues = list(info.write_queues)
        if not queues:
            raise ClientError(f"topic {topic!r} has no writable queue")
        slots = asyncio.Semaphore(LOAD_IN_FLIGHT)
        failure: list[BaseException] = []
        done = 0
        tasks = TaskSet("bench preload")

        async def one(msgs: list[Message], mq: MessageQueue) -> None:
            nonlocal done
            try:
                await producer.send_batch(msgs, queue=mq)
                done += len(msgs)
            except MQError as exc:
                failure.append(exc)
            finally:
                slots.release()

        started = time.perf_counter()
        last_meter = 0.0
        sent = 0
        i = 0
        while sent < count and not failure:
            await slots.acquire()
            n = min(batch, count - sent)
            msgs = [Message(topic, body)] * n
            tasks.spawn(one(msgs, queues[i % len(queues)]))
            sent += n
            i += 1
            now = time.perf_counter()
            if now - last_meter > 0.2:
                meter("load", done, count)
                last_meter = now
        await tasks.wait()
        if tasks.failures:  # not an MQError: a bug, already logged by the set
            raise ClientError(f"{tasks.failures} send task(s) failed unexpectedly (see the log)")
        if failure:
            raise ClientError(f"preload failed after {done:,} messages: {failure[0]}")
        meter("load", done, count)
        seconds = time.perf_counter() - started
    say(f"loaded {count:,} messages in {seconds:.1f} s ({count / seconds:,.0f} msgs/s)")
    return seconds


async def wait_dispatched(admin: AsyncAdminClient, topic: str, at_least: int) -> int:
    """Wait until the topic's queues hold ``at_least`` messages (dispatch runs behind)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DISPATCH_WAIT_S
    while True:
        kept, _ = await kept_messages(admin, topic)
        if kept >= at_least or loop.time() >= deadline:
            return kept
        await asyncio.sleep(0.2)


def target_text(target: Target, data_dir: Path | None) -> str:
    if not target.own:
        return f"NameServer {target.namesrv}"
    where = f"data in {data_dir}" if data_dir is not None else "temporary data folder"
    return f"own NameServer + Broker on 127.0.0.1 ({where})"


def machine() -> dict[str, str]:
    cpus = os.cpu_count() or 0
    return {
        "cpu": cpu_model(),
        "cpus": str(cpus),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "load average at start": loadavg(),
    }


def new_group(prefix: str, run: int) -> str:
    return f"{prefix}-{os.getpid()}-{now_ms() % 10**9}-{run}"


def new_push_consumer(
    namesrv: str,
    group: str,
    options: Any,
    where: ConsumeFromWhere,
    sink: Callable[[list[ConsumedMessage]], None],
) -> PushConsumer:
    """A push consumer of ``options.topic`` whose listener (async or thread, as the options
    say) hands every batch to ``sink``; not started. Shared by bench consume and bench e2e."""
    from orbitmq.client.consumer.push import PushConsumer

    consumer = PushConsumer(
        namesrv,
        group,
        PushConfig(
            consume_from_where=where,
            consume_batch_size=options.batch,
            pull_batch_size=options.pull_batch,
            consume_threads=options.threads,
        ),
    )
    consumer.subscribe(options.topic, "*")
    if options.listener == "async":

        async def on_async(msgs: list[ConsumedMessage]) -> ConsumeResult:
            sink(msgs)
            return ConsumeResult.SUCCESS

        consumer.register_listener(on_async)
    else:

        def on_sync(msgs: list[ConsumedMessage]) -> ConsumeResult:
            sink(msgs)
            return ConsumeResult.SUCCESS

        consumer.register_listener(on_sync)
    return consumer


def prepare_topics(namesrv: str, topics: list[str], *, queues: int, wait_s: float) -> None:
    """Create the ``topics`` that do not exist (``queues`` queues each) and wait, at most
    ``wait_s``, until the NameServer routes every one; ClientError if one stays unrouted."""
    admin = BlockingAdminClient(namesrv)
    try:
        existing = set(admin.list_topics())
        for topic in topics:
            if topic not in existing:
                admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        deadline = time.monotonic() + wait_s
        for topic in topics:
            while True:
                try:
                    if admin.topic_route(topic).queue_datas:
                        break
                except MQError:
                    pass
                if time.monotonic() > deadline:
                    raise ClientError(f"the NameServer does not route {topic!r}")
                time.sleep(0.1)
    finally:
        admin.close()
