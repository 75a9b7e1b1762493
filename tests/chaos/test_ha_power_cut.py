"""All replicas of a sync group die at once (#13: "power cut of all replicas"): the three brokers
of a factor-3 group (``sync``, ``min_in_sync_replicas = 2``, ASYNC_FLUSH) are SIGKILLed in the
same instant under SDK load, by PID, and restarted by ``orbitmq cluster up --restart-after``.

Checked, with orbitmq.testing.checker: the group elects a master again and takes sends; 0
acknowledged messages lost or misplaced (read back through the NameServers and from every
replica's store), no order violation among ordered sends, the CommitLogs byte-identical.

What a SIGKILL is and is not: the page cache survives it, so ASYNC_FLUSH loses nothing here;
a power cut of the machine also loses what was never fsynced (SYNC_FLUSH, or the store's
in-process power-cut tests, tests/store/powercut.py, cover that). Each broker keeps its confirm
offset (store/confirm.py): restarted, it serves nothing above it until a master confirms more.

Rounds: ORBITMQ_CHAOS_ITERATIONS (``make test-chaos``), else 1. The seed is printed.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, check, read_back
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.chaos.ha_cluster import GROUP, HaCluster, Load, chaos_seed, iterations
from tests.harness import ProcessCluster

ROUNDS = iterations(1)
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(150 + 60 * ROUNDS)]
TOPIC = "HaPowerCut"
RESTART_AFTER_S = 2.0


async def test_all_replicas_killed_at_once_lose_nothing_acknowledged(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    rng = random.Random(chaos_seed())
    ha = HaCluster(cluster, tmp_path, restart_after_s=RESTART_AFTER_S)
    history = History()
    load: Load | None = None
    try:
        await asyncio.to_thread(ha.start)
        await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history, senders=4, ordered=2).start()
        await load.wait_acked(100)
        for k in range(ROUNDS):
            info = await ha.wait_master(in_sync=3, timeout_s=60)
            await load.wait_acked(load.acked() + rng.randrange(50, 300))
            brokers = [p["endpoints"]["broker"] for p in ha.processes("broker")]
            history.fault(f"power cut {k}: every broker of {GROUP}")
            pids = [ha.kill(addr) for addr in brokers]
            for p, pid in zip(ha.processes("broker"), pids, strict=True):
                await ha.wait_restarted(p["name"], pid, timeout_s=60)
            await ha.wait_master(after_epoch=info.master_epoch, in_sync=2, timeout_s=60)
            await load.wait_acked(load.acked() + 50, timeout_s=60)
        await load.stop()
        await ha.wait_master(in_sync=3, timeout_s=60)
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
    finally:
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()

    print(f"{ROUNDS} power cuts; {report.summary()}")
    report.assert_ok(max_duplicates=60 * ROUNDS)
    assert not report.unrecovered, report.unrecovered
    stores = {p["name"]: tmp_path / "ha-cluster" / p["name"] for p in ha.processes("broker")}
    with (
        opened(stores[f"{GROUP}-1"], **CLUSTER_STORE) as s1,
        opened(stores[f"{GROUP}-2"], **CLUSTER_STORE) as s2,
        opened(stores[f"{GROUP}-3"], **CLUSTER_STORE) as s3,
    ):
        replicas = {f"{GROUP}-1": s1, f"{GROUP}-2": s2, f"{GROUP}-3": s3}
        for name, store in replicas.items():
            mine = check(history.snapshot(), read_store(store, [TOPIC], GROUP))
            assert not mine.lost and not mine.misplaced, f"{name}: {mine.summary()}"
        ends = {n: s.commit_log.max_offset for n, s in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []
