"""A partitioned master (#13): replica i of a sync factor-3 group runs in network namespace i
(NameServer + controller node + broker, ``cluster up --netns``), all joined by one bridge; the
master's namespace is cut off (its veth goes down) under load, then healed.

- A sender *inside* the master's namespace keeps writing to the old master: none of its sends
  is acknowledged later than ``master_lease_ms`` (+100 ms) after the cut (the lease; in
  ``sync`` mode the missing slaves' acks refuse them too).
- The SDK producer outside follows the new master; the checker's recovery time is printed.
- After healing, the old master rejoins as a slave (the SyncStateSet is whole again), cutting
  the tail it wrote alone: the three CommitLogs end byte-identical, every acknowledged message
  (of both senders) is on every replica and read back through the NameServers; 0 lost.
- After healing, every NameServer routes the group to the new master within
  :data:`ROUTED_WITHIN_S` (clients ask any one of them). The NameServer inside the cut-off
  namespace heard the old master step down but not the new one: it learns it at the new
  master's next registration, which once waited for TCP's backed-off retransmission on the
  connection the partition had frozen (fixed in orbitmq.net.client; docs/ha.md "Fault tests").

Needs root and iproute2 (skipped otherwise, with the reason). Partition: 8 s here, 30 s with
ORBITMQ_CHAOS_ITERATIONS (``make test-chaos``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.common.errors import MQError
from orbitmq.testing.checker import History, check, now_ms, read_back
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.chaos.ha_cluster import GROUP, HaCluster, Load, chaos_seed
from tests.chaos.netns import NetLab
from tests.harness import REPO, ProcessCluster

LONG = bool(os.environ.get("ORBITMQ_CHAOS_ITERATIONS"))
PARTITION_S = 30.0 if LONG else 8.0
LEASE_MS = 2000  # the broker's master_lease_ms default
ROUTED_WITHIN_S = 5.0
"""Worst case about 2 s: a connect begun in the cut gets through at its SYN retry (1 s) or gives
up at 3 s and the next registration connects at once (measured 0.5-2.2 s, loaded machine;
5.6-5.7 s before the fix in orbitmq.net.client, when registrations waited on the frozen
connection for TCP's backed-off retransmission)."""
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout(240 + PARTITION_S),
]
TOPIC = "HaPartition"


def start_ns_sender(
    lab: NetLab, i: int, broker: str, out: Path, log: Path
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", lab.netns[i], sys.executable, "-m", "tests.chaos.ns_sender",
             "--broker", broker, "--topic", TOPIC, "--client", "inside", "--out", str(out)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else b""
    if not line.startswith(b"orbitmq sender ready"):
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"the sender did not start: {log.read_text(errors='replace')}")
    return proc


async def routed_everywhere(namesrvs: list[str], master: str, since: float) -> float:
    """Seconds from ``since`` until every NameServer routes :data:`TOPIC`'s group to
    ``master`` (polled every 0.1 s; the caller bounds the wait)."""
    admins = [AsyncAdminClient([addr]) for addr in namesrvs]
    try:
        for admin in admins:
            await admin.start()
        while True:
            masters: set[str | None] = set()
            for admin in admins:
                try:
                    route = await admin.topic_route(TOPIC)
                    masters.update(b.master_addr() for b in route.broker_datas)
                except MQError:
                    masters.add(None)
            if masters == {master}:
                return time.monotonic() - since
            await asyncio.sleep(0.1)
    finally:
        for admin in admins:
            await admin.close()


async def test_a_partitioned_master_stops_acknowledging_and_rejoins(
    cluster: ProcessCluster, tmp_path: Path, lab: NetLab
) -> None:
    chaos_seed()
    extra = ["--hosts", ",".join(lab.hosts), "--netns", ",".join(lab.netns)]
    ha = HaCluster(cluster, tmp_path, extra=extra)
    history = History()
    load: Load | None = None
    inside: subprocess.Popen[bytes] | None = None
    inside_out = tmp_path / "inside.jsonl"
    cut = -1
    routed: asyncio.Task[float] | None = None
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=90)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history).start()
        await load.wait_acked(200)
        cut = lab.hosts.index(info.master_address.rpartition(":")[0])
        inside = await asyncio.to_thread(
            start_ns_sender, lab, cut, info.master_address, inside_out, tmp_path / "inside.log"
        )
        await asyncio.sleep(1.0)
        history.fault(f"partition of master {info.master_broker_id} at {info.master_address}")
        isolated_at = now_ms()
        lab.isolate(cut)
        started = time.monotonic()
        new = await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
        elected_s = time.monotonic() - started
        await load.wait_acked(load.acked() + 200)
        await asyncio.sleep(max(0.0, PARTITION_S - (time.monotonic() - started)))
        lab.heal(cut)
        cut = -1
        healed = time.monotonic()
        routed = asyncio.create_task(routed_everywhere(ha.namesrv, new.master_address, healed))
        await ha.wait_master(in_sync=3, timeout_s=60)  # the old master is back, as a slave
        rejoined_s = time.monotonic() - healed
        inside.send_signal(signal.SIGTERM)
        await asyncio.to_thread(inside.wait, 20)
        await load.wait_acked(load.acked() + 100)
        await load.stop()
        try:
            routed_s = await asyncio.wait_for(routed, 30)
        except TimeoutError:
            routed_s = math.inf
        ours = History.load(inside_out)
        outside = history.snapshot()
        history.merge(ours)
        async with AsyncAdminClient(ha.namesrv) as admin:
            found = await read_back(admin, [TOPIC])
        report = check(history, found)
        recovery = check(outside, found, history.faults).recovery_ms()  # the SDK's, outside
    finally:
        if routed is not None:
            routed.cancel()
        if cut >= 0:
            lab.heal(cut)
        if inside is not None and inside.poll() is None:
            inside.kill()
            inside.wait(10)
        if inside is not None and inside.stdout is not None:
            inside.stdout.close()
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()

    late = [r for r in ours.ok() if r.done_ms > isolated_at + LEASE_MS + 100]
    before = [r for r in ours.ok() if r.done_ms <= isolated_at]
    print(f"partition {PARTITION_S:.0f}s: new master {new.master_address} after {elected_s:.1f}s, "
          f"old master rejoined {rejoined_s:.1f}s after healing, every NameServer routed the "
          f"new master {routed_s:.1f}s after healing; inside sender: "
          f"{len(ours.ok())} acked ({len(before)} before the cut), {len(late)} late; "
          f"{report.summary()}; outside: recovery {recovery} ms, send errors {load.errors}")  # fmt: skip
    assert late == [], late[:5]
    assert before, "the sender inside never got an acknowledgement before the cut"
    assert routed_s <= ROUTED_WITHIN_S, f"NameServers routed the new master {routed_s:.1f}s late"
    report.assert_ok(max_duplicates=60)
    assert len(recovery) == 1 and recovery[0] <= 12_000, recovery  # target p99 8 s, docs/ha.md
    stores = {p["name"]: tmp_path / "ha-cluster" / p["name"] for p in ha.processes("broker")}
    with contextlib.ExitStack() as stack:
        replicas = {n: stack.enter_context(opened(p, **CLUSTER_STORE)) for n, p in stores.items()}
        for name, store in replicas.items():
            mine = check(history.snapshot(), read_store(store, [TOPIC], GROUP))
            assert not mine.lost and not mine.misplaced, f"{name}: {mine.summary()}"
        ends = {n: s.commit_log.max_offset for n, s in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []
