"""Tiered storage through the broker: remoting pull and lookups by offset get cold data unchanged;
an object-store outage answers SERVICE_NOT_AVAILABLE (retryable), never a skip."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metrics import TierCollector
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_records
from tests.broker.conftest import broker_config
from tests.broker.test_broker import pull_frame, send_frame
from tests.store.tier.test_tier_store import Flaky

QUEUES = 4
SEG = 64 * 1024 + 8 * 1024


async def pull_everything(
    client: RemotingClient, broker: BrokerController
) -> dict[tuple[int, int], tuple[bytes, int]]:
    got: dict[tuple[int, int], tuple[bytes, int]] = {}
    for q in range(QUEUES):
        offset = 0
        for _ in range(1000):
            resp = await client.invoke(broker.address, pull_frame("Cold", q, offset))
            if resp.code != ResponseCode.SUCCESS:
                assert resp.code == ResponseCode.PULL_NOT_FOUND, (resp.code, resp.remark)
                break
            for m in decode_records(resp.body):
                assert (m.queue_id, m.queue_offset) not in got
                got[(m.queue_id, m.queue_offset)] = (m.body, m.physical_offset)
            offset = resp.fields["next_begin_offset"]
    return got


async def test_pull_reads_uploaded_data_after_local_deletion(tmp_path: Path) -> None:
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
        sent: dict[tuple[int, int], bytes] = {}
        for r in range(30):
            for q in range(QUEUES):
                bodies = [f"cold-{q}-{r}-{j}-".encode() * 10 for j in range(8)]
                resp = await client.invoke(broker.address, send_frame("Cold", bodies, queue_id=q))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                first = resp.fields["queue_offset"]
                sent |= {(q, first + j): b for j, b in enumerate(bodies)}
        store = broker.store
        assert store.tier is not None
        await asyncio.to_thread(store.wait_for_dispatch)
        await asyncio.to_thread(store.commit_log.flush)
        await asyncio.to_thread(store.tier.run_once)
        await asyncio.to_thread(store.retention.run)
        assert len(store.commit_log.segments.segments) == 1
        assert store.queues.get("Cold", 0).min_offset > 0  # type: ignore[union-attr]
        got = await pull_everything(client, broker)
        assert {k: v[0] for k, v in got.items()} == sent
        # A lookup by CommitLog offset (what a message id encodes) resolves cold records too.
        phy = got[(0, 0)][1]
        assert phy < store.commit_log.min_offset
        resp = await client.invoke(
            broker.address, Frame(RequestCode.VIEW_MESSAGE_BY_ID, fields={"offset": phy})
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert decode_records(resp.body)[0].body == sent[(0, 0)]

        flaky = Flaky(store.tier.backend)
        store.tier.backend = store.tier.cache.backend = flaky
        store.tier.cache.max_bytes = 0
        store.tier.cache.forget_all()
        flaky.down = True
        resp = await client.invoke(broker.address, pull_frame("Cold", 1, 0))
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, (resp.code, resp.remark)
        hot = store.queues.get("Cold", 1).min_offset  # type: ignore[union-attr]
        resp = await client.invoke(broker.address, pull_frame("Cold", 1, hot))
        assert resp.code == ResponseCode.SUCCESS  # hot reads go on
        resp = await client.invoke(broker.address, send_frame("Cold", [b"during"], queue_id=1))
        assert resp.code == ResponseCode.SUCCESS  # and so do writes
        flaky.down = False
        resp = await client.invoke(broker.address, pull_frame("Cold", 1, 0))
        assert resp.code == ResponseCode.SUCCESS
        assert decode_records(resp.body)[0].body == sent[(1, 0)]
    finally:
        await client.close()
        await broker.stop()


async def test_topic_tier_ttl_and_the_tier_metrics(tmp_path: Path) -> None:
    config = broker_config(
        tmp_path / "store",
        store={"tier_backend": "directory", "tier_path": str(tmp_path / "tier")},
    )
    broker = BrokerController(config)
    await broker.start()
    client = RemotingClient()
    try:
        cfg = TopicConfig(topic_name="Ttl", tier_retention_ms=60_000)
        resp = await client.invoke(
            broker.address, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert broker.store.tier is not None
        assert broker.store.tier.topic_ttl["Ttl"] == 60_000
        assert await asyncio.to_thread(broker.store.tier.wait_uploaded, 10)  # first turn done
        registry = CollectorRegistry()
        registry.register(TierCollector(broker.store.tier.stats))
        text = generate_latest(registry)
        assert b"orbitmq_tier_available 1.0" in text, text
        assert b"orbitmq_tier_upload_lag_messages 0.0" in text, text
    finally:
        await client.close()
        await broker.stop()


async def test_pop_with_ack_reads_the_tier(tmp_path: Path) -> None:
    from tests.broker.test_pop import ack, make_topic, pop

    config = broker_config(tmp_path / "store", store=tier_settings(tmp_path))
    broker = BrokerController(config)
    await broker.start()
    client = RemotingClient()
    try:
        make_topic(broker, "PopCold", 2)
        sent: dict[tuple[int, int], bytes] = {}
        for r in range(30):
            for q in range(2):
                bodies = [f"pop-{q}-{r}-{j}-".encode() * 10 for j in range(8)]
                resp = await client.invoke(
                    broker.address, send_frame("PopCold", bodies, queue_id=q)
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                first = resp.fields["queue_offset"]
                sent |= {(q, first + j): b for j, b in enumerate(bodies)}
        store = broker.store
        assert store.tier is not None
        await asyncio.to_thread(store.wait_for_dispatch)
        await asyncio.to_thread(store.commit_log.flush)
        await asyncio.to_thread(store.tier.run_once)
        await asyncio.to_thread(store.retention.run)
        assert store.queues.get("PopCold", 0).min_offset > 0  # type: ignore[union-attr]
        got: dict[tuple[int, int], bytes] = {}
        for _ in range(200):
            resp, msgs, handles = await pop(client, broker, "PopCold", max_msg_nums=32)
            if resp.code != ResponseCode.SUCCESS:
                assert resp.code == ResponseCode.PULL_NOT_FOUND, (resp.code, resp.remark)
                break
            for m, h in zip(msgs, handles, strict=True):
                assert (m.queue_id, m.queue_offset) not in got
                got[(m.queue_id, m.queue_offset)] = m.body
                assert (await ack(client, broker, "PopCold", h)).code == ResponseCode.SUCCESS
        assert got == sent
    finally:
        await client.close()
        await broker.stop()


def tier_settings(tmp_path: Path) -> dict[str, object]:
    return {
        "mapped_file_size_commit_log": SEG,
        "max_message_size": 4096,
        "tier_backend": "directory",
        "tier_path": str(tmp_path / "tier"),
        "tier_upload_interval_ms": 3_600_000,
        "tier_chunk_max_messages": 50,
        "tier_local_retention_ms": 0,
        "delete_when": ";".join(str(h) for h in range(24)),
    }
