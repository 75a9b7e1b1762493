"""The official RocketMQ 5 Python client keeps its guarantees across a master SIGKILL (#13).

``orbitmq cluster up --replicas 3`` (``sync`` mode, factor 3, ``--restart-after 6``) runs one
group; a gRPC proxy process sits in front of its NameServers. Two runs of the unmodified
official client (``rocketmq``, tests/compat/client_driver.py, each its own process) go on
through the faults:

- a Producer sends one message at a time (sync ``send``), bodies ``oc:<seq>:`` (the identity
  orbitmq.testing.checker reads), going on after a failed send, each result written as it ends;
- a SimpleConsumer receives and acks all along (a failed receive or ack is counted and retried).

The master is SIGKILLed (after the group has all three replicas in sync again, for every kill
after the first); the test waits for the new master and for a send *issued* after the kill to
be acknowledged. Then the producer stops and:

- the checker reads every queue back natively: every send the official client saw acknowledged
  is there (lost 0), at the queue offset its receipt named, no message nobody sent,
  duplicates bounded (the client retries a send whose answer the kill cut off);
- recovery (kill -> first acknowledgement of a send issued after it) within
  :data:`MAX_RECOVERY_MS`, printed;
- the SimpleConsumer received every acknowledged message, some of them after the failover.

Kills: ORBITMQ_CHAOS_ITERATIONS (``make test-chaos``), else 1. The seed is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any, cast

import pytest

from orbitmq.client import AsyncAdminClient, BlockingAdminClient
from orbitmq.testing.checker import (
    Delivered,
    History,
    Outcome,
    SendRecord,
    check,
    percentile,
    read_back,
)
from tests.chaos.ha_cluster import HaCluster, chaos_seed, fast_failover_args, iterations
from tests.compat.conftest import ClientRun, Orbit, need_official_client
from tests.harness import ProcessCluster

KILLS = iterations(1)
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.compat,
    pytest.mark.integration,
    pytest.mark.timeout(200 + 60 * KILLS),
]
TOPIC = "HaOfficial"
GROUP = "HaOfficialConsumers"
CLIENT = "oc"
LONG = "ORBITMQ_CHAOS_ITERATIONS" in os.environ
RESTART_AFTER_S = 6.0
TIMINGS = [] if LONG else fast_failover_args()
"""The short set (one kill, no restart waited for) on the short failover timings; the long
run's recovery figures on the defaults."""
MAX_RECOVERY_MS = 15_000
"""The official client backs off between attempts and learns routes through the proxy, so its
bound is looser than the native SDK's (test_ha_master_kill.py: 10 s); the figures are printed."""


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    # only whole lines: the last one may be half written
    return [json.loads(x) for x in path.read_text().split("\n")[:-1] if x.strip()]


async def wait_for(what: str, ready: Any, timeout_s: float, diagnostics: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s} s\n{diagnostics()}")
        await asyncio.sleep(0.1)


def history_of(sent: dict[str, Any], faults: list[tuple[str, float]]) -> History:
    history = History()
    for a in sent["acked"]:
        _, seq, _ = a["body"].split(":", 2)
        # offset -1: the receipt's queue is the one the client picked, not where the proxy put
        # the message (see offsets_reused)
        history.acked(CLIENT, int(seq), TOPIC, a["broker_name"], a["queue_id"], -1,
                      a["sent"] * 1000, msg_id=a["message_id"], done_ms=a["at"] * 1000)  # fmt: skip
    for f in sent["failed"]:
        _, seq, _ = f["body"].split(":", 2)
        history.add(SendRecord(CLIENT, int(seq), TOPIC, Outcome.UNKNOWN, f["sent"] * 1000,
                               f["at"] * 1000, error=f["error"]))  # fmt: skip
    for name, at_ms in faults:
        history.fault(name, at_ms)
    return history


def offsets_reused(sent: dict[str, Any], found: list[Delivered]) -> list[str]:
    """Acknowledged sends found at no queue offset their receipt named (an offset given twice
    across a failover: RocketMQ #7689). Only the offset is compared: the official client's
    receipt names the queue the client picked, while the proxy picks the queue itself (as
    RocketMQ's proxy does: its SendMessageQueueSelector ignores the client's choice)."""
    offsets: dict[str, set[int]] = {}
    for d in found:
        offsets.setdefault(f"{d.client}:{d.seq}:", set()).add(d.queue_offset)
    return [f"{a['body']} acked at offset {a['offset']}, found at {offsets.get(a['body'])}"
            for a in sent["acked"] if a["offset"] not in offsets.get(a["body"], set())]  # fmt: skip


async def test_official_client_through_the_proxy_survives_master_kills(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    need_official_client()
    rng = random.Random(chaos_seed())
    ha = HaCluster(cluster, tmp_path, restart_after_s=RESTART_AFTER_S, extra=TIMINGS)
    sends, receives = tmp_path / "sends.jsonl", tmp_path / "receives.jsonl"
    stop_sending, stop_receiving = tmp_path / "stop-sending", tmp_path / "stop-receiving"
    runs: list[ClientRun] = []
    faults: list[tuple[str, float]] = []
    try:
        await asyncio.to_thread(ha.start)
        await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        proxy = await asyncio.to_thread(cluster.proxy, ha.namesrv)
        # start_run uses the proxy, the folder and the run count, never the admin client
        orbit = Orbit(tmp_path, cluster, ";".join(ha.namesrv), ha.proc, proxy,
                      cast(BlockingAdminClient, None))  # fmt: skip
        consumer = orbit.start_run([
            {"op": "simple_consumer", "name": "c", "group": GROUP, "topics": {TOPIC: "*"},
             "await_s": 1},
            {"op": "receive", "consumer": "c", "max": 32, "invisible_s": 5,
             "timeout_s": 150 + 60 * KILLS, "stop_file": str(stop_receiving),
             "progress": str(receives)},
        ])  # fmt: skip
        runs.append(consumer)
        producer = orbit.start_run([
            {"op": "producer", "name": "p", "topics": [TOPIC]},
            {"op": "send_each", "producer": "p", "topic": TOPIC, "count": 1_000_000,
             "prefix": CLIENT, "checker": True, "interval_s": 0.01,
             "stop_file": str(stop_sending), "progress": str(sends)},
        ])  # fmt: skip
        runs.append(producer)

        def acked() -> list[dict[str, Any]]:
            return [x for x in lines(sends) if x["ok"]]

        def logs() -> str:
            return f"{ha.logs()}\n{orbit.diagnostics(producer.home, b'')}"

        await wait_for("100 acknowledged sends", lambda: len(acked()) >= 100, 60, logs)
        for k in range(KILLS):
            info = await ha.wait_master(in_sync=3, timeout_s=60)
            target = len(acked()) + rng.randrange(20, 200)
            await wait_for(f"{target} acknowledged", lambda t=target: len(acked()) >= t, 60, logs)
            at = time.time()
            faults.append((f"kill {k}: master {info.master_broker_id}", at * 1000))
            ha.kill(info.master_address)
            await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
            await wait_for(f"a send issued after kill {k} acknowledged",
                           lambda a=at: any(x["sent"] >= a for x in acked()), 60, logs)  # fmt: skip
        last = len(acked())
        await wait_for("100 more acknowledged", lambda: len(acked()) >= last + 100, 60, logs)
        stop_sending.touch()
        out = await asyncio.to_thread(producer.finish, 60)
        sent = out["results"][1]
        history = history_of(sent, faults)
        async with AsyncAdminClient(ha.namesrv) as admin:
            found = await read_back(admin, [TOPIC])
        report = check(history, found)
        reused = offsets_reused(sent, found.delivered)

        wanted = {a["body"] for a in sent["acked"]}
        await wait_for(
            "the SimpleConsumer received every acknowledged message",
            lambda: wanted <= {x["body"] for x in lines(receives)}, 60,
            lambda: f"missing {sorted(wanted - {x['body'] for x in lines(receives)})[:10]}",
        )  # fmt: skip
        stop_receiving.touch()
        received = await asyncio.to_thread(consumer.finish, 60)
    finally:
        stop_sending.touch()
        stop_receiving.touch()
        for run in runs:
            if run.proc.poll() is None:
                await asyncio.to_thread(run.finish, 30, allow_failure=True)
        await ha.close()

    got = received["results"][1]
    rec = report.recovery_ms()
    first_kill = faults[0][1] / 1000
    after = [m for m in got["messages"] if m["received_at"] > first_kill]
    print(f"{KILLS} kills; official client: {report.summary()}; failed sends "
          f"{len(sent['failed'])} {[f['error'] for f in sent['failed'][:3]]}")  # fmt: skip
    print(f"recovery (ms) p50 {percentile(rec, 50):.0f} p99 {percentile(rec, 99):.0f} "
          f"max {max(rec):.0f}; SimpleConsumer: {len(got['messages'])} received "
          f"({len(after)} after the first kill), receive/ack errors {len(got['errors'])}")  # fmt: skip
    report.assert_ok(max_duplicates=30 * KILLS, check_order=False)
    assert not reused, reused[:10]
    assert report.acked >= 200 and not report.unrecovered, report.summary()
    assert max(rec) <= MAX_RECOVERY_MS, rec
    assert after, "the SimpleConsumer received nothing after the failover"
