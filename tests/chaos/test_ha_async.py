"""``async`` replication's promise, measured: a master acknowledges on its own write, so a
SIGKILL may lose what the slaves had not received yet -- the replication lag at the kill, and
nothing older. After the old master rejoins (cutting the tail the group did not keep), the
replicas are byte-identical again.

The lost messages (acknowledged, not found by the checker) are counted and printed with their
age at the kill; each must be younger than LOSS_WINDOW_MS (the lag on loopback is milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, check, now_ms, read_back
from orbitmq.testing.replicas import compare_replicas, opened
from tests.chaos.ha_cluster import HaCluster, Load, chaos_seed, fast_failover_args
from tests.harness import ProcessCluster

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(180)]
TOPIC = "HaAsync"
LOSS_WINDOW_MS = 1000.0


async def test_async_loses_at_most_the_replication_lag(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    chaos_seed()
    # Short failover timings (the loss window does not depend on them); the old master
    # restarted once the new one is elected.
    ha = HaCluster(cluster, tmp_path, mode="async", restart_after_s=2.0, extra=fast_failover_args())
    history = History()
    load: Load | None = None
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history, senders=6, ordered=0).start()
        await load.wait_acked(2000)
        history.fault("async master SIGKILL")
        killed_at = now_ms()
        ha.kill(info.master_address)
        await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
        await load.wait_acked(load.acked() + 300)
        await load.stop()
        await ha.wait_master(in_sync=3, timeout_s=60)  # the old master rejoined
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
    finally:
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()

    ages = sorted(killed_at - r.done_ms for r in report.lost)
    print(f"async kill: {len(report.lost)} acknowledged lost of {report.acked}, aged "
          f"{[round(a) for a in ages[:5]]}..{[round(a) for a in ages[-3:]]} ms at the kill; "
          f"{report.summary()}")  # fmt: skip
    assert all(age <= LOSS_WINDOW_MS for age in ages), ages[-5:]
    assert not report.misplaced and not report.phantoms and not report.gaps
    stores = {p["name"]: tmp_path / "ha-cluster" / p["name"] for p in ha.processes("broker")}
    with contextlib.ExitStack() as stack:
        replicas = {n: stack.enter_context(opened(p, **CLUSTER_STORE)) for n, p in stores.items()}
        ends = {n: s.commit_log.max_offset for n, s in replicas.items()}
        assert len(set(ends.values())) == 1, ends
        assert compare_replicas(replicas) == []
