"""Cold reads never block the broker's event loop: with an object store that takes 0.4 s per
call, a cold pull and a lookup by CommitLog offset (a message id) whose records only the tier
holds wait on reader threads, and meanwhile the loop answers other requests at once (a hot
pull, GET_MAX_OFFSET) and the cold requests still get their data. (Key queries and lookups by
unique id read their records on the reader thread too: processor.py ``_records_by_key``.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records
from orbitmq.store.tier.backend import TierBackend
from tests.broker.conftest import broker_config
from tests.broker.test_broker import pull_frame, send_frame
from tests.broker.test_tier_pull import SEG
from tests.store.tier.test_tier_store import Flaky

SLOW_S = 0.4


class Slow(Flaky):
    """Every call of the object store takes SLOW_S (a distant or overloaded store)."""

    def __init__(self, inner: TierBackend) -> None:
        super().__init__(inner)
        self.slow = False

    def _check(self) -> None:
        if self.slow:
            time.sleep(SLOW_S)
        super()._check()


async def test_cold_reads_wait_off_the_loop(tmp_path: Path) -> None:
    config = broker_config(
        tmp_path / "store",
        store={
            "mapped_file_size_commit_log": SEG,
            "max_message_size": 4096,
            "tier_backend": "directory",
            "tier_path": str(tmp_path / "tier"),
            "tier_upload_interval_ms": 3_600_000,
            "tier_chunk_max_messages": 50,
            "tier_local_retention_ms": 0,
            "delete_when": ";".join(str(h) for h in range(24)),
        },
    )
    broker = BrokerController(config)
    await broker.start()
    client = RemotingClient()
    try:
        first_phy = -1
        for r in range(30):
            bodies = [f"slow-{r}-{j}-".encode() * 50 for j in range(8)]
            resp = await client.invoke(broker.address, send_frame("Slow", bodies, queue_id=0))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        store = broker.store
        assert store.tier is not None
        await asyncio.to_thread(store.wait_for_dispatch)
        await asyncio.to_thread(store.commit_log.flush)
        await asyncio.to_thread(store.tier.run_once)
        await asyncio.to_thread(store.retention.run)
        hot = store.queues.get("Slow", 0).min_offset  # type: ignore[union-attr]
        assert hot > 8
        resp = await client.invoke(broker.address, pull_frame("Slow", 0, 0))
        first_phy = decode_records(resp.body)[0].physical_offset
        slow = Slow(store.tier.backend)
        store.tier.backend = store.tier.cache.backend = slow
        store.tier.cache.max_bytes = 0  # every cold read goes to the store
        store.tier.cache.forget_all()
        slow.slow = True
        cold = [
            pull_frame("Slow", 0, 0),
            Frame(RequestCode.VIEW_MESSAGE_BY_ID, fields={"offset": first_phy}),
        ]
        for frame in cold:
            t0 = time.monotonic()
            task = asyncio.ensure_future(client.invoke(broker.address, frame, timeout=30))
            await asyncio.sleep(0.05)  # the cold request is in the broker, waiting on the store
            assert not task.done()
            quick = await client.invoke(broker.address, pull_frame("Slow", 0, hot))
            assert quick.code == ResponseCode.SUCCESS
            offset = await client.invoke(
                broker.address,
                Frame(RequestCode.GET_MAX_OFFSET, fields={"topic": "Slow", "queue_id": 0}),
            )
            assert offset.code == ResponseCode.SUCCESS
            answered = time.monotonic() - t0
            resp = await task
            took = time.monotonic() - t0
            assert resp.code == ResponseCode.SUCCESS, (frame.code, resp.code, resp.remark)
            bodies = {m.body for m in decode_records(resp.body)}
            assert b"slow-0-0-" * 50 in bodies
            # The loop answered while the cold request waited for the store.
            assert answered < took and answered < SLOW_S, (frame.code, answered, took)
    finally:
        await client.close()
        await broker.stop()
