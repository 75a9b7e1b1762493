"""Unclean election off (the default): when every SyncStateSet member is dead and only a replica
outside the set is alive, the group has no master and takes no send; nothing acknowledged is
lost, and the group comes back when a member does.

A slave is paused (SIGSTOP) until the master drops it from the SyncStateSet; then the master and
the other slave are SIGKILLed and the paused one resumed: the only live replica is behind and
outside the set. Until the killed two are restarted (7 s later; short failover timings) the
controller must elect nobody (it is never master) and no send may be acknowledged; the
killed two come back (``--restart-after``), a master is elected among them, the stale replica
catches up, and the checker finds every acknowledged message, on every replica, the CommitLogs
byte-identical.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, check, now_ms, read_back
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.chaos.ha_cluster import (
    FAST_FAILOVER,
    GROUP,
    HaCluster,
    Load,
    chaos_seed,
    fast_failover_args,
)
from tests.harness import ProcessCluster

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(240)]
TOPIC = "HaUnclean"
RESTART_AFTER_S = 7.0
LEASE_MS = FAST_FAILOVER["broker.master_lease_ms"]
CLEARED_MS = 3000
"""By then the dead master is cleared (lease + margin + heartbeat timeout + a scan and a commit,
about 1 s with the short timings) and nobody else may be master."""


async def test_no_master_outside_the_sync_state_set(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    chaos_seed()
    # Short timings: the paused slave leaves the set 2 s after its last frame (HA link timeout).
    ha = HaCluster(cluster, tmp_path, restart_after_s=RESTART_AFTER_S, extra=fast_failover_args())
    history = History()
    load: Load | None = None
    paused = 0
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history).start()
        await load.wait_acked(200)
        stale, other = [r for r in info.replicas if r.broker_id != info.master_broker_id]
        paused = ha.signal(stale.address, signal.SIGSTOP)
        deadline = time.monotonic() + 40
        while True:  # the master drops the silent slave from the set
            now = await ha.replica_info()
            if now is not None and stale.broker_id not in now.sync_state_set:
                break
            assert time.monotonic() < deadline, f"the paused slave stayed in the set: {now}"
            await asyncio.sleep(0.2)
        await load.wait_acked(load.acked() + 50)  # sends go on without it
        history.fault("SyncStateSet members killed, a stale replica alive")
        killed_at = now_ms()
        ha.kill(now.master_address)
        ha.kill(other.address)
        os.kill(paused, signal.SIGCONT)
        paused = 0
        masters = []
        while now_ms() < killed_at + (RESTART_AFTER_S - 2) * 1000:
            seen = await ha.replica_info()
            if seen is not None and seen.has_master:
                masters.append((now_ms() - killed_at, seen.master_broker_id))
            await asyncio.sleep(0.2)
        refused_until = now_ms()
        await ha.wait_master(in_sync=3, timeout_s=90)  # a member back, the stale one caught up
        await load.wait_acked(load.acked() + 200)
        await load.stop()
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
    finally:
        if paused:
            os.kill(paused, signal.SIGCONT)
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()

    window = [r for r in history.ok() if killed_at + LEASE_MS + 500 < r.done_ms < refused_until]
    late = [m for at, m in masters if at > CLEARED_MS]
    print(f"{(refused_until - killed_at) / 1000:.1f}s watched: masters seen {masters[-3:]}; "
          f"acked in the window {len(window)}; {report.summary()}; errors {load.errors}")  # fmt: skip
    assert stale.broker_id not in {m for _at, m in masters}, masters
    assert late == [], late  # the dead master cleared, nobody elected in its place
    assert window == [], window[:3]
    report.assert_ok(max_duplicates=60)
    stores = {p["name"]: tmp_path / "ha-cluster" / p["name"] for p in ha.processes("broker")}
    with contextlib.ExitStack() as stack:
        replicas = {n: stack.enter_context(opened(p, **CLUSTER_STORE)) for n, p in stores.items()}
        for name, store in replicas.items():
            mine = check(history.snapshot(), read_store(store, [TOPIC], GROUP))
            assert not mine.lost and not mine.misplaced, f"{name}: {mine.summary()}"
        ends = {n: s.commit_log.max_offset for n, s in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []
