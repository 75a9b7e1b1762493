"""#13's first promise under repeated faults: a sync replicated group (factor 3,
``min_in_sync_replicas = 2``) whose master is SIGKILLed again and again under SDK load loses
no acknowledged message, keeps ordered sends in order, and its replicas end byte-identical.

``orbitmq cluster up --replicas 3 --restart-after S`` runs the group. The next kill comes as
soon as every replica is back in the SyncStateSet (the killed master, restarted in the
background by the supervisor, rejoined as a slave and cut whatever tail the group did not
keep) and every process runs again. After the last kill the load stops, the group catches
up, the cluster is stopped, and:

- the checker reads every queue back through the NameServers: 0 acknowledged lost or
  misplaced, no order violation, no message nobody sent, duplicates bounded (a send whose
  answer the kill cut off is resent by the SDK);
- each replica's store is read back on its own: every acknowledged message is on *every*
  replica at its offset;
- the three CommitLogs are byte-identical (CRC per MiB);
- failover (kill -> first ack of a send issued after it) is printed as p50/p99/max per kill.

The second of every three kills is a double failover: the new master is SIGKILLed too, within
1 s of taking office (unclean election is off: if no SyncStateSet member is left, the group has
no master and takes no send until one is back; nothing acknowledged is lost either way).
Every third kill also SIGKILLs the controller's Raft leader (with the NameServer it is embedded
in) at the same moment (RocketMQ #7689): the new leader waits out its tenure delay before it
elects, so that failover takes longer.

Two timings. ``make test`` (20 kills): ``FAST_FAILOVER`` (lease 0.8 s, margin 0.2 s, 0.1 s
heartbeats and scans: the same rules, shorter) and a restart 0.5 s after the kill, so a cycle
costs about what an election, a broker start and a rejoin take. ``ORBITMQ_CHAOS_ITERATIONS``
set (``make test-chaos``: 100): the production defaults and a restart 6 s after the kill
(after the election: a master back sooner may be master again), the run the failover figures
of docs/ha.md come from. The seed is printed.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from orbitmq.cli.cluster_up import CLUSTER_STORE
from orbitmq.client import AsyncAdminClient
from orbitmq.testing.checker import History, Recovery, check, percentile, read_back
from orbitmq.testing.replicas import compare_replicas, opened, read_store
from tests.chaos.ha_cluster import (
    GROUP,
    HaCluster,
    Load,
    chaos_seed,
    fast_failover_args,
    iterations,
)
from tests.harness import ProcessCluster

LONG = "ORBITMQ_CHAOS_ITERATIONS" in os.environ and os.environ.get("ORBITMQ_HA_TIMINGS") != "fast"
KILLS = iterations(20)
TIMINGS = [] if LONG else fast_failover_args()
RESTART_AFTER_S = 6.0 if LONG else 0.2
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout((120 + 40 * KILLS) if LONG else (90 + 6 * KILLS)),
]
TOPIC = "HaKills"
MAX_FAILOVER_MS = 10_000  # the target is p99 <= 5 s (docs/ha.md has the measured figures)


async def test_master_sigkills_lose_nothing_acknowledged(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    rng = random.Random(chaos_seed())
    ha = HaCluster(cluster, tmp_path, restart_after_s=RESTART_AFTER_S, extra=TIMINGS)
    history = History()
    load: Load | None = None
    elections: list[float] = []
    phases: list[str] = []
    t0 = time.monotonic()
    try:
        await asyncio.to_thread(ha.start)
        await ha.wait_master(in_sync=3, timeout_s=60)
        await ha.create_topic(TOPIC)
        load = await Load(ha.namesrv, TOPIC, history, senders=6, ordered=3).start()
        await load.wait_acked(100)
        phases.append(f"cluster up, topic, load: {time.monotonic() - t0:.1f} s")
        for k in range(KILLS):
            t = time.monotonic()
            await ha.wait_all_running(timeout_s=30)  # a Raft leader kill needs its 2 others
            t_run = time.monotonic()
            info = await ha.wait_master(in_sync=3, timeout_s=60)
            if k:
                phases.append(f"kill {k - 1}: all running +{t_run - t:.1f} s, "
                              f"all in sync +{time.monotonic() - t:.1f} s")  # fmt: skip
            await load.wait_acked(load.acked() + rng.randrange(30, 300))
            both = k % 3 == 2  # every third kill takes the controller's Raft leader too (#7689)
            leader = await ha.controller_leader() if both else ""
            history.fault(f"kill {k}: master {info.master_broker_id} at {info.master_address}"
                          + (f" and the controller leader {leader}" if both else ""))  # fmt: skip
            started = time.monotonic()
            ha.kill(info.master_address)
            if both:
                ha.kill(leader)
            new = await ha.wait_master(after_epoch=info.master_epoch, timeout_s=60)
            elections.append((time.monotonic() - started) * 1000)
            if k % 3 == 1:  # a double failover: the new master killed within 1 s of taking office
                await asyncio.sleep(rng.uniform(0.0, 1.0))
                history.fault(f"kill {k} (double): new master {new.master_broker_id} at "
                              f"{new.master_address}")  # fmt: skip
                ha.kill(new.master_address)
                await ha.wait_master(after_epoch=new.master_epoch, timeout_s=60)
        t = time.monotonic()
        await load.wait_acked(load.acked() + 100)
        await load.stop()
        await ha.wait_master(in_sync=3, timeout_s=60)  # the last killed one caught up
        phases.append(
            f"kills: {t - t0:.1f} s; load stopped, all in sync +{time.monotonic() - t:.1f} s"
        )
        t = time.monotonic()
        async with AsyncAdminClient(ha.namesrv) as admin:
            report = check(history, await read_back(admin, [TOPIC]))
        phases.append(f"read back, checked: {time.monotonic() - t:.1f} s")
        errors = load.errors
    finally:
        if load is not None and load.tasks:
            await load.stop()
        t = time.monotonic()
        await ha.close()
        phases.append(f"cluster stopped: {time.monotonic() - t:.1f} s")
        print("\n".join(phases))

    # A double failover may leave no alive SyncStateSet member (the set of a master that just
    # took office is itself alone): no master (unclean election is off) until the second victim
    # is back (RESTART_AFTER_S), so that recovery has its own bound. So has the first kill of
    # such a pair when the second came before any send was acknowledged: its recovery (to the
    # first ack) spans both failovers and the restart.
    starts = sorted(r.fault.at_ms for r in report.recoveries)

    def interrupted(r: Recovery) -> bool:
        later = [at for at in starts if at > r.fault.at_ms]
        return (
            bool(later)
            and r.recovered_ms is not None
            and (r.fault.at_ms + r.recovered_ms > later[0])
        )

    rec = [r.recovered_ms for r in report.recoveries if r.recovered_ms is not None
           and "(double)" not in r.fault.name and not interrupted(r)]  # fmt: skip
    doubles = [r.recovered_ms for r in report.recoveries if r.recovered_ms is not None
               and ("(double)" in r.fault.name or interrupted(r))]  # fmt: skip
    print(f"double failovers (and first kills a second one interrupted): recovery (ms) "
          f"{[round(d) for d in doubles]}")  # fmt: skip
    assert all(d <= RESTART_AFTER_S * 1000 + 15_000 for d in doubles), doubles
    print(f"{KILLS} kills ({'default' if LONG else 'fast'} timings, restart after "
          f"{RESTART_AFTER_S} s); {report.summary()}; send errors {errors}")  # fmt: skip
    print(f"recovery per fault (ms): {[round(r) for r in rec]}; p50 {percentile(rec, 50):.0f} "
          f"p99 {percentile(rec, 99):.0f} max {max(rec):.0f}")  # fmt: skip
    print(f"new master after (ms): p50 {percentile(elections, 50):.0f} "
          f"p99 {percentile(elections, 99):.0f} max {max(elections):.0f}")  # fmt: skip
    report.assert_ok(max_duplicates=60 * KILLS)
    assert not report.unrecovered, report.unrecovered
    assert max(rec) <= MAX_FAILOVER_MS, rec

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
