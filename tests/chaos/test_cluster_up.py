"""``orbitmq cluster up --replicas 3`` end to end: it starts three NameServers with controllers
and a sync broker group of three as processes on 127.0.0.1-3, the SDK sends through it, the
master is SIGKILLed (by the PID ``cluster.json`` gives) under that load, and the checker reads
every queue back through the NameServers: nothing acknowledged lost, no order broken, and sends
acknowledged again within the failover time (the SDK follows the new master: no restart). A
push consumer running through the kill goes on from its offsets on the new master: it receives
every acknowledged message (at least once). Stopping the supervisor stops every process it
started.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from orbitmq.client import (
    AsyncAdminClient,
    AsyncPushConsumer,
    ConsumedMessage,
    ConsumeFromWhere,
    ConsumeResult,
    PushConfig,
)
from orbitmq.testing.checker import History, check, identify, read_back
from tests.chaos.ha_cluster import HaCluster, Load
from tests.harness import ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TOPIC = "ClusterUp"


async def test_cluster_up_survives_a_master_kill(cluster: ProcessCluster, tmp_path: Path) -> None:
    ha = HaCluster(cluster, tmp_path)
    history = History()
    load: Load | None = None
    consumer: AsyncPushConsumer | None = None
    consumed: set[tuple[str, int]] = set()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        consumed.update(i for m in msgs if (i := identify(m.message)) is not None)
        return ConsumeResult.SUCCESS

    try:
        await asyncio.to_thread(ha.start)
        assert [p["endpoints"]["namesrv"].rpartition(":")[0] for p in ha.processes("namesrv")] == [
            "127.0.0.1", "127.0.0.2", "127.0.0.3"
        ]  # fmt: skip
        master = await ha.wait_master(in_sync=2)
        await ha.create_topic(TOPIC)
        config = PushConfig(consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                            request_timeout_s=2.0, suspend_timeout_ms=1000)  # fmt: skip
        consumer = AsyncPushConsumer(ha.namesrv, "ClusterUpGroup", config)
        consumer.subscribe(TOPIC)
        consumer.register_listener(listener)
        await consumer.start()
        load = await Load(ha.namesrv, TOPIC, history).start()
        await load.wait_acked(300)
        history.fault("master SIGKILL")
        killed = ha.kill(master.master_address)
        started = time.monotonic()
        new = await ha.wait_master(other_than=master.master_address)
        elected_s = time.monotonic() - started
        await load.wait_acked(load.acked() + 300)
        await load.stop()
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
        print(f"new master {new.master_address} (epoch {new.master_epoch}) {elected_s:.1f}s "
              f"after the kill; {report.summary()}; errors {load.errors}")  # fmt: skip
        report.assert_ok(max_duplicates=50)
        acked = {r.identity for r in history.ok()}
        deadline = time.monotonic() + 30
        while not acked <= consumed and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        missing = acked - consumed
        assert not missing, f"{len(missing)} acknowledged never consumed: {sorted(missing)[:5]}"
        [recovery] = report.recovery_ms()
        # One failover on production timings, on a machine shared with the rest of the suite:
        # a bound, not the p99 target (<= 5 s, measured over 100 kills by `make test-chaos`).
        # Each time the controller's Raft leader is elected again (a 2-core machine busy with
        # seven starting processes delays the leader's 100 ms pings past pysyncobj's 0.4 s
        # election timeout), its election waits its tenure delay (4 s) anew: seen once in a
        # full run, two re-elections around the kill and 8.1 s.
        assert recovery < 15_000, report.summary()
        pids = [int(p["pid"]) for p in ha.processes() if int(p["pid"]) != killed]
    finally:
        if load is not None and load.tasks:
            await load.stop()
        if consumer is not None:
            await consumer.close()
        await ha.close()
    for pid in pids:  # the supervisor stopped every process it started
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    assert not any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids)
    assert os.path.exists(tmp_path / "ha-cluster" / "cluster.json")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
