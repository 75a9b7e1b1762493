"""Faults that must not stop a sync factor-3 group for long, under SDK load:

- **a slave SIGSTOPped** (3 s here; 30 s with ``ORBITMQ_CHAOS_ITERATIONS``, ``make
  test-chaos``): sends stall at most until the slave answers again or leaves the SyncStateSet
  (``ha_max_time_slave_not_catchup_ms``), never longer; it rejoins after SIGCONT; 0 lost.
- **the controller's Raft leader SIGKILLed** (here with the NameServer it is embedded in): a new
  leader within a few seconds, and no send fails (the master's lease is renewed by the new
  leader; a stall, if any, is printed); 0 lost.

Both read every queue back through the checker. The seed is printed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, check, now_ms, read_back
from tests.chaos.ha_cluster import HaCluster, Load, chaos_seed
from tests.harness import ProcessCluster

LONG = bool(os.environ.get("ORBITMQ_CHAOS_ITERATIONS"))
PAUSE_S = 30.0 if LONG else 3.0
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(200 + PAUSE_S)]
CATCH_UP_LIMIT_MS = 15_000  # the broker's ha_max_time_slave_not_catchup_ms default
SLAVE_TIMEOUT_MS = 3_000  # the broker's slave_timeout_ms default


async def read_report(ha: HaCluster, history: History, topic: str) -> str:
    async with AsyncAdminClient(ha.namesrv) as admin:
        report = check(history, await read_back(admin, [topic]))
    report.assert_ok(max_duplicates=60)
    return report.summary()


async def test_a_paused_slave_stalls_sends_no_longer_than_its_limits(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    chaos_seed()
    ha = HaCluster(cluster, tmp_path)
    history = History()
    load: Load | None = None
    paused = 0
    try:
        await asyncio.to_thread(ha.start)
        info = await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic("HaPause")
        load = await Load(ha.namesrv, "HaPause", history).start()
        await load.wait_acked(200)
        slave = next(r for r in info.replicas if r.broker_id != info.master_broker_id)
        history.fault(f"SIGSTOP slave {slave.broker_id}")
        stopped_at = now_ms()
        paused = ha.signal(slave.address, signal.SIGSTOP)
        await asyncio.sleep(PAUSE_S)
        os.kill(paused, signal.SIGCONT)
        paused = 0
        resumed_at = now_ms()
        await ha.wait_master(in_sync=3, timeout_s=60)  # it rejoined
        await load.wait_acked(load.acked() + 200)
        gap = load.max_ack_gap_ms(stopped_at, resumed_at)
        await load.stop()
        summary = await read_report(ha, history, "HaPause")
        print(f"slave paused {PAUSE_S:.0f}s: longest stall {gap:.0f} ms; {summary}; "
              f"send errors {load.errors}")  # fmt: skip
        # Sends wait for the paused slave until it answers again, or until it is dropped from
        # the SyncStateSet; each waits at most slave_timeout_ms before FLUSH_SLAVE_TIMEOUT.
        assert gap <= min(PAUSE_S * 1000, CATCH_UP_LIMIT_MS) + SLAVE_TIMEOUT_MS + 2000, gap
    finally:
        if paused:
            os.kill(paused, signal.SIGCONT)
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()


async def test_a_killed_controller_leader_does_not_stop_the_data_path(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    chaos_seed()
    ha = HaCluster(cluster, tmp_path, restart_after_s=3.0)
    history = History()
    load: Load | None = None
    try:
        await asyncio.to_thread(ha.start)
        await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic("HaCtl")
        load = await Load(ha.namesrv, "HaCtl", history).start()
        await load.wait_acked(200)
        leader = await ha.controller_leader()
        history.fault(f"SIGKILL controller leader {leader}")
        killed_at = now_ms()
        started = time.monotonic()
        ha.kill(leader)
        new_leader = await ha.controller_leader(other_than=leader, timeout_s=20)
        elected_s = time.monotonic() - started
        await asyncio.sleep(3.0)
        await load.wait_acked(load.acked() + 200)
        gap = load.max_ack_gap_ms(killed_at, now_ms())
        await load.stop()
        summary = await read_report(ha, history, "HaCtl")
        print(f"controller leader {leader} killed: new leader {new_leader} after "
              f"{elected_s:.1f}s; longest send stall {gap:.0f} ms; {summary}; "
              f"send errors {load.errors}")  # fmt: skip
        assert elected_s <= 6.0, elected_s  # target 3 s (pysyncobj: 0.4-1.4 s of silence)
        assert load.errors == {}, load.errors
    finally:
        if load is not None and load.tasks:
            await load.stop()
        await ha.close()
