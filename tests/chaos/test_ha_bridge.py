"""The "bridge" fault (#13, RocketMQ #6662/#7017): the master and one slave cannot reach each
other, while both still reach the third replica (and the third controller node, so the
controllers keep a majority). Replicas run in network namespaces on one bridge
(``cluster up --netns``); bridge port isolation cuts the pair.

Sync sends stall until the master drops the unreachable slave from its SyncStateSet (or time
out as unknown); nothing acknowledged is lost, no ordered send is reordered, and once the cut
is healed every replica catches up, byte-identical. Needs root and iproute2 (skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, check, now_ms, read_back
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.chaos.ha_cluster import GROUP, HaCluster, Load, chaos_seed, fast_failover_args
from tests.chaos.netns import NetLab
from tests.harness import ProcessCluster

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300)]
TOPIC = "HaBridge"
LONG = "ORBITMQ_CHAOS_ITERATIONS" in os.environ
CUT_S = 15.0 if LONG else 6.0
"""Long: the default timings (the HA link timeout, 10 s, drops the slave). Short: the short
failover timings (2 s link timeout), so 6 s still cut well past the drop."""


async def test_master_and_a_slave_cut_from_each_other_lose_nothing(
    cluster: ProcessCluster, tmp_path: Path, lab: NetLab
) -> None:
    chaos_seed()
    extra = ["--hosts", ",".join(lab.hosts), "--netns", ",".join(lab.netns)]
    if not LONG:
        extra += fast_failover_args()
    ha = HaCluster(cluster, tmp_path, extra=extra)
    history = History()
    load: Load | None = None
    cut: tuple[int, int] | None = None
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=90)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history).start()
        await load.wait_acked(200)
        m = lab.hosts.index(info.master_address.rpartition(":")[0])
        s = next(i for i in range(3) if i != m)
        history.fault(f"bridge: replicas {m + 1} and {s + 1} cut from each other")
        cut_at = now_ms()
        lab.separate(m, s)
        cut = (m, s)
        await asyncio.sleep(CUT_S)
        during = len([r for r in history.ok() if r.done_ms > cut_at])
        lab.separate(m, s, on=False)
        cut = None
        await ha.wait_master(in_sync=3, timeout_s=60)
        await load.wait_acked(load.acked() + 200)
        gap = load.max_ack_gap_ms(cut_at, now_ms())
        await load.stop()
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
    finally:
        if cut is not None:
            lab.separate(*cut, on=False)
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()
    print(f"bridge {CUT_S:.0f}s: {during} acked during the cut, longest stall {gap:.0f} ms; "
          f"{report.summary()}; send errors {load.errors}")  # fmt: skip
    report.assert_ok(max_duplicates=60)
    stores = {p["name"]: tmp_path / "ha-cluster" / p["name"] for p in ha.processes("broker")}
    with contextlib.ExitStack() as stack:
        replicas = {n: stack.enter_context(opened(p, **CLUSTER_STORE)) for n, p in stores.items()}
        for name, store in replicas.items():
            mine = check(history.snapshot(), read_store(store, [TOPIC], GROUP))
            assert not mine.lost and not mine.misplaced, f"{name}: {mine.summary()}"
        ends = {n: st.commit_log.max_offset for n, st in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []
