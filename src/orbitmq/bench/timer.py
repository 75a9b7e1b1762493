"""Timer benchmark: ``orbitmq bench timer`` (docs/timers.md, figures in docs/benchmarks.md).

**accuracy**: ``count`` messages (default 10,000) sent with TIMER_DELIVER_MS = send time + a
random delay in [min_delay_s, max_delay_s] (default 1-30 s), in batches; one long-polling
puller per queue takes ``time.time_ns()`` when a pull answer arrives. Lateness = receive time -
TIMER_OUT_MS (the due time the broker stamped): p50/p90/p99/max over every message. It includes
the pull round trip, so it is what a consumer sees.

**pending**: ``pending`` messages (default 1,000,000) with delays of an hour or more, sent in
batches by ``inflight`` concurrent senders: the insert rate (acknowledged messages per second),
the time until the broker's timer index holds them all, the broker's resident memory before
and after (anonymous memory, the index and interpreter; and file-backed, the mapped CommitLog
and ConsumeQueue pages), then a restart (SIGTERM, start again) and the time until it is ready
with every timer pending again (rebuilt from the timer topic's ConsumeQueue).

The benchmark starts its own broker (``python -m orbitmq broker`` on 127.0.0.1, a free port, no
NameServer, data in a temporary folder) so it can read the broker's memory from /proc, and
stops it at the end. Linux only (reads /proc/<pid>/status).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orbitmq.bench._child import ServerChild
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError
from orbitmq.common.message import encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.messages import decode_records, encode_send_body
from orbitmq.protocol.requests import (
    GetBrokerRuntimeInfoRequest,
    PullMessageRequest,
    SendBatchMessageRequest,
    UpdateTopicRequest,
)

Say = Callable[[str], None]
DEFAULT_TOPIC = "BenchTimer"
READY_TIMEOUT_S = 120.0


@dataclass(slots=True)
class TimerBenchOptions:
    count: int = 10_000
    min_delay_s: float = 1.0
    max_delay_s: float = 30.0
    pending: int = 1_000_000
    pending_delay_s: float = 3600.0
    batch: int = 256
    inflight: int = 8
    size: int = 64
    queues: int = 4
    flush: str = "ASYNC_FLUSH"
    accuracy: bool = True
    pending_test: bool = True
    restart: bool = True
    data_dir: Path | None = None
    command: str = ""

    def validate(self) -> None:
        if not 0 <= self.min_delay_s <= self.max_delay_s:
            raise ValueError("need 0 <= min delay <= max delay")
        if self.batch < 1 or self.inflight < 1 or self.size < 1 or self.queues < 1:
            raise ValueError("batch, inflight, size and queues must be at least 1")
        if self.flush not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise ValueError("flush is ASYNC_FLUSH or SYNC_FLUSH")


@dataclass(slots=True)
class TimerBenchResult:
    machine: dict[str, str]
    options: dict[str, Any]
    accuracy: dict[str, float] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- own broker


class OwnBroker:
    """``python -m orbitmq broker`` on 127.0.0.1 with a free port; stopped by pid."""

    def __init__(self, folder: Path, flush: str) -> None:
        self.folder = folder
        self.flush = flush
        self.address = ""
        self.port = 0
        self._child: ServerChild | None = None

    def start(self) -> float:
        """Start it (again, on the same port after a restart); seconds until it said ready."""
        began = time.monotonic()
        self._child = ServerChild(
            [
                "orbitmq", "broker", "--host", "127.0.0.1", "--port", str(self.port),
                "--namesrv", "", "--store-path", str(self.folder / "store"),
                "--flush", self.flush, "--auto-create-topic",
            ],
            self.folder / "broker.log",
            "orbitmq broker ready ",
        )  # fmt: skip
        ready = self._child.start(READY_TIMEOUT_S)  # broker=<host:port> cluster=... namesrv=...
        self.address = ready.split()[0].removeprefix("broker=")
        self.port = int(self.address.rpartition(":")[2])
        return time.monotonic() - began

    def memory(self) -> dict[str, float]:
        """VmRSS / RssAnon / RssFile of the broker, in MB."""
        assert self._child is not None
        return self._child.memory_mb()

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()


@contextlib.contextmanager
def own_broker(data_dir: Path | None, flush: str, say: Say) -> Iterator[OwnBroker]:
    made = data_dir is None
    folder = Path(tempfile.mkdtemp(prefix="orbitmq-bench-timer-")) if made else Path(str(data_dir))
    folder.mkdir(parents=True, exist_ok=True)
    broker = OwnBroker(folder, flush)
    try:
        broker.start()
        say(f"started broker {broker.address} ({flush}) in {folder}")
        yield broker
    finally:
        broker.stop()
        if made:
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------- requests


async def _create_topic(client: RemotingClient, addr: str, topic: str, queues: int) -> None:
    body = encode_body(
        TopicConfig(topic_name=topic, read_queue_nums=queues, write_queue_nums=queues)
    )
    resp = await client.invoke(addr, UpdateTopicRequest().frame(body), 10.0)
    if resp.code != ResponseCode.SUCCESS:
        raise ClientError(f"cannot create {topic}: {resp.remark}")


async def _send(
    client: RemotingClient, addr: str, topic: str, queue_id: int, bodies: list[bytes],
    props: list[bytes],
) -> None:  # fmt: skip
    frame = SendBatchMessageRequest(topic=topic, queue_id=queue_id).frame(
        encode_send_body(bodies, props)
    )
    for _ in range(50):
        resp = await client.invoke(addr, frame, 30.0)
        if resp.code == ResponseCode.SUCCESS:
            return
        if resp.code != ResponseCode.SYSTEM_BUSY:
            raise ClientError(f"send failed: {resp.remark}")
        await asyncio.sleep(0.05)
    raise ClientError("send kept answering SYSTEM_BUSY")


async def _runtime_info(client: RemotingClient, addr: str) -> dict[str, Any]:
    resp = await client.invoke(addr, GetBrokerRuntimeInfoRequest().frame(), 10.0)
    return dict(resp.fields)


# ---------------------------------------------------------------------------- accuracy


async def run_accuracy(
    client: RemotingClient, addr: str, opts: TimerBenchOptions, say: Say
) -> dict[str, float]:
    topic = f"{DEFAULT_TOPIC}Acc{os.getpid()}"
    await _create_topic(client, addr, topic, opts.queues)
    rng = random.Random(1)
    lateness: list[int] = []
    early = 0
    body = b"x" * opts.size
    done = asyncio.Event()
    last_due = 0

    async def puller(queue_id: int) -> None:
        nonlocal early
        offset = 0
        while not done.is_set():
            frame = PullMessageRequest(
                topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=512,
                suspend_timeout_ms=1000,
            ).frame()  # fmt: skip
            resp = await client.invoke(addr, frame, 10.0)
            at = now_ms()
            if resp.code == ResponseCode.SUCCESS:
                for m in decode_records(resp.body):
                    late = at - int(m.properties["TIMER_OUT_MS"])
                    lateness.append(late)
                    early += late < 0
            offset = int(resp.fields.get("next_begin_offset", offset))
            if len(lateness) >= opts.count:
                done.set()

    pullers = [asyncio.create_task(puller(q)) for q in range(opts.queues)]
    began = time.monotonic()
    sent = 0
    q = 0
    while sent < opts.count:
        n = min(opts.batch, opts.count - sent)
        now = now_ms()
        dues = [now + int(rng.uniform(opts.min_delay_s, opts.max_delay_s) * 1000) for _ in range(n)]
        last_due = max(last_due, *dues)
        props = [encode_properties({"TIMER_DELIVER_MS": str(d)}) for d in dues]
        await _send(client, addr, topic, q % opts.queues, [body] * n, props)
        sent += n
        q += 1
    send_s = time.monotonic() - began
    say(f"accuracy: sent {sent:,} timers in {send_s:.1f}s; waiting for them to fall due")
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0, last_due - now_ms()) / 1000 + 15):
            await done.wait()
    done.set()
    for t in pullers:
        t.cancel()
    await asyncio.gather(*pullers, return_exceptions=True)
    arr = np.array(lateness, dtype=np.int64)
    if not len(arr):
        return {"messages": opts.count, "received": 0}
    return {
        "messages": opts.count,
        "received": len(arr),
        "missing": opts.count - len(arr),
        "early": early,
        "lateness_ms_min": float(arr.min()),
        "lateness_ms_p50": float(np.percentile(arr, 50)),
        "lateness_ms_p90": float(np.percentile(arr, 90)),
        "lateness_ms_p99": float(np.percentile(arr, 99)),
        "lateness_ms_max": float(arr.max()),
    }


# ---------------------------------------------------------------------------- pending


async def run_pending(
    client: RemotingClient, broker: OwnBroker, opts: TimerBenchOptions, say: Say
) -> dict[str, float]:
    addr = broker.address
    topic = f"{DEFAULT_TOPIC}Pend{os.getpid()}"
    await _create_topic(client, addr, topic, opts.queues)
    before = broker.memory()
    base_pending = int((await _runtime_info(client, addr)).get("timer_pending", 0))
    body = b"p" * opts.size
    rng = random.Random(2)
    total = opts.pending
    next_at = 0
    lock = asyncio.Lock()

    async def sender(k: int) -> None:
        nonlocal next_at
        while True:
            async with lock:
                if next_at >= total:
                    return
                n = min(opts.batch, total - next_at)
                next_at += n
            delay = int(opts.pending_delay_s * 1000)
            props = [
                encode_properties({"TIMER_DELAY_MS": str(delay + rng.randrange(3_600_000))})
                for _ in range(n)
            ]
            await _send(client, addr, topic, k % opts.queues, [body] * n, props)

    began = time.monotonic()
    await asyncio.gather(*(sender(k) for k in range(opts.inflight)))
    send_s = time.monotonic() - began
    say(f"pending: {total:,} timers acknowledged in {send_s:.1f}s ({total / send_s:,.0f}/s)")
    while True:
        info = await _runtime_info(client, addr)
        if int(info.get("timer_pending", 0)) >= base_pending + total:
            break
        await asyncio.sleep(0.05)
    indexed_s = time.monotonic() - began
    await asyncio.sleep(1.0)
    after = broker.memory()
    out: dict[str, float] = {
        "timers": total,
        "send_s": round(send_s, 2),
        "insert_rate_per_s": round(total / send_s),
        "indexed_s": round(indexed_s, 2),
        "index_mb": round(int(info.get("timer_index_bytes", 0)) / 1e6, 1),
        "rss_before_mb": round(before.get("VmRSS", 0), 1),
        "rss_after_mb": round(after.get("VmRSS", 0), 1),
        "rss_anon_before_mb": round(before.get("RssAnon", 0), 1),
        "rss_anon_after_mb": round(after.get("RssAnon", 0), 1),
        "rss_file_after_mb": round(after.get("RssFile", 0), 1),
    }
    if opts.restart:
        await client.close()
        broker.stop()
        ready_s = broker.start()
        restarted = RemotingClient()
        try:
            info = await _runtime_info(restarted, broker.address)
        finally:
            await restarted.close()
        out["restart_ready_s"] = round(ready_s, 2)
        out["pending_after_restart"] = int(info.get("timer_pending", 0))
        out["rss_after_restart_mb"] = round(broker.memory().get("VmRSS", 0), 1)
        out["rss_anon_after_restart_mb"] = round(broker.memory().get("RssAnon", 0), 1)
    return out


# ---------------------------------------------------------------------------- entry


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    return {
        "cpu": cpu,
        "cpus": str(os.cpu_count() or 0),
        "memory": mem,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
    }


def run_timer_bench(opts: TimerBenchOptions, say: Say) -> TimerBenchResult:
    opts.validate()
    result = TimerBenchResult(machine(), {k: str(v) for k, v in asdict(opts).items()})

    async def main(broker: OwnBroker) -> None:
        client = RemotingClient()
        try:
            if opts.accuracy:
                result.accuracy = await run_accuracy(client, broker.address, opts, say)
            if opts.pending_test:
                result.pending = await run_pending(client, broker, opts, say)
        finally:
            await client.close()

    with own_broker(opts.data_dir, opts.flush, say) as broker:
        asyncio.run(main(broker))
    return result


def format_report(result: TimerBenchResult) -> str:
    lines = ["orbitmq bench timer"]
    if result.options.get("command"):
        lines.append(f"  command: {result.options['command']}")
    lines.append("  machine: " + ", ".join(f"{k} {v}" for k, v in result.machine.items() if v))
    if result.accuracy:
        a = result.accuracy
        lines.append(
            f"  accuracy: {int(a.get('received', 0)):,}/{int(a.get('messages', 0)):,} received, "
            f"delays {result.options['min_delay_s']}-{result.options['max_delay_s']} s"
        )
        if "lateness_ms_p50" in a:
            lines.append(
                f"    lateness ms: p50 {a['lateness_ms_p50']:.0f}  p90 {a['lateness_ms_p90']:.0f}  "
                f"p99 {a['lateness_ms_p99']:.0f}  max {a['lateness_ms_max']:.0f}  "
                f"min {a['lateness_ms_min']:.0f}  (early: {int(a['early'])})"
            )
    if result.pending:
        p = result.pending
        lines.append(
            f"  pending: {int(p['timers']):,} timers acknowledged in {p['send_s']} s "
            f"({int(p['insert_rate_per_s']):,}/s), all indexed after {p['indexed_s']} s; "
            f"index {p['index_mb']} MB"
        )
        lines.append(
            f"    broker RSS: {p['rss_before_mb']} MB before -> {p['rss_after_mb']} MB after "
            f"(anonymous {p['rss_anon_before_mb']} -> {p['rss_anon_after_mb']} MB, "
            f"file-backed {p['rss_file_after_mb']} MB)"
        )
        if "restart_ready_s" in p:
            lines.append(
                f"    restart: ready in {p['restart_ready_s']} s with "
                f"{int(p['pending_after_restart']):,} pending; RSS {p['rss_after_restart_mb']} MB "
                f"(anonymous {p['rss_anon_after_restart_mb']} MB)"
            )
    return "\n".join(lines)
