"""A power cut of every replica of a group at once, through the store's file-ops fault layer
(#13; tests/store/powercut.py): a master and two slaves in one process (static mode, ``sync``,
every replica in sync), senders under way, then the power goes: each store keeps only what it
had fsynced (page by page, ``torn``), all three at the same instant, and each is reopened as
after the power came back.

- **SYNC_FLUSH on the master + ``ha_slave_ack_after_flush``** (docs/ha.md, "Ack modes and
  their loss windows"): nothing acknowledged is lost, on *any* of the three stores.
- **ASYNC_FLUSH** (slaves ack after their write): the loss is measured and printed; the docs
  promise that only what no replica had fsynced can go: every lost message was acknowledged
  less than ``flush_commit_log_thorough_interval_ms`` (the longest an ASYNC_FLUSH store waits
  between fsyncs) before the cut, and each recovered store is a clean prefix (nothing after a
  hole).

The seed is printed (``ORBITMQ_SEED`` replays it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.store.config import FlushDiskType
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_broker_config, small_store_config
from tests.broker.ha.test_replication import TOPIC, ha_of, in_sync, master_config, send
from tests.store.powercut import PowerCut

pytestmark = pytest.mark.timeout(90)
SEGMENT = 256 * 1024  # the fault layer copies a whole file per fsync: keep files small
THOROUGH_MS = 1000
SENDERS, SENDS = 4, 5000  # each sends until the cut (at most SENDS)


def store_options(flush: FlushDiskType) -> dict[str, Any]:
    return {
        "flush_disk_type": flush,
        "mapped_file_size_commit_log": SEGMENT,
        "max_message_size": 64 * 1024,
        "flush_commit_log_thorough_interval_ms": THOROUGH_MS,
    }


def queue_offsets(path: Path) -> dict[int, set[int]]:
    """Queue id -> the queue offsets a reopened store holds (after recovery)."""
    store = MessageStore(
        small_store_config(path, mapped_file_size_commit_log=SEGMENT, max_message_size=64 * 1024)
    )
    store.open()
    try:
        store.wait_for_dispatch()
        return {q: set(range(store.min_offset(TOPIC, q), store.max_offset(TOPIC, q)))
                for q in range(4)}  # fmt: skip
    finally:
        store.close()


@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
async def test_a_power_cut_of_every_replica(tmp_path: Path, flush: FlushDiskType) -> None:
    env = os.environ.get("ORBITMQ_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"seed: ORBITMQ_SEED={seed}")
    sync = flush is FlushDiskType.SYNC_FLUSH
    paths = [tmp_path / n for n in ("m", "s1", "s2")]
    acked: list[tuple[int, int, float]] = []  # (queue id, queue offset, when) of SEND_OK
    client = RemotingClient()
    brokers: list[BrokerController] = []
    with PowerCut(tmp_path, random.Random(seed), torn=True) as pc:
        try:
            master = BrokerController(
                master_config(
                    paths[0],
                    replication_mode="sync",
                    min_in_sync_replicas=3,
                    store=store_options(flush),
                )
            )
            await master.start()
            brokers.append(master)
            for i, path in enumerate(paths[1:], 1):
                slave = BrokerController(
                    small_broker_config(path, ha_enable=True, broker_id=i,
                                        ha_master_address=f"127.0.0.1:{ha_of(master).port}",
                                        ha_slave_ack_after_flush=sync, store=store_options(flush))
                )  # fmt: skip
                await slave.start()
                brokers.append(slave)
            await in_sync(master, 3)

            async def sender(n: int) -> None:
                for i in range(SENDS):
                    resp = await send(client, master, n * SENDS + i, queue_id=n)
                    if resp.code == ResponseCode.SUCCESS:
                        acked.append((n, int(resp.fields["queue_offset"]), time.monotonic()))

            tasks = [asyncio.create_task(sender(n)) for n in range(SENDERS)]
            await asyncio.sleep(random.Random(seed).uniform(0.2, 0.8))
            # The power goes: every store at the same instant, senders still running.
            pc.freeze()
            cut_at = time.monotonic()
            for b in brokers:
                b.store.crash_for_test()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for b in brokers:
                with contextlib.suppress(Exception):
                    await b.stop()
            await client.close()
        log = pc.cut(None)  # the disk as the power left it (recording frozen since the cut)
    assert acked, "nothing was acknowledged before the cut"
    lost_anywhere: dict[str, list[tuple[int, int, float]]] = {}
    for path in paths:
        held = queue_offsets(path)
        lost_anywhere[path.name] = [a for a in acked if a[1] not in held[a[0]]]
        for offsets in held.values():  # a clean prefix: no hole
            assert offsets == set(range(min(offsets, default=0), max(offsets, default=-1) + 1))
    summary = {n: len(lost) for n, lost in lost_anywhere.items()}
    ages = sorted(round((cut_at - a[2]) * 1000) for lost in lost_anywhere.values() for a in lost)
    print(f"{flush.value}: {len(acked)} acknowledged; lost per store {summary}; "
          f"ages at the cut (ms) {ages[:3]}..{ages[-3:]}; fsyncs {pc.fsyncs}")  # fmt: skip
    if sync:
        assert all(not lost for lost in lost_anywhere.values()), (summary, str(log)[:2000])
    else:
        assert all(age <= THOROUGH_MS + 500 for age in ages), ages[-5:]
