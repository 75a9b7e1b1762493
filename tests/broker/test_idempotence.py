"""Idempotent producers: the broker stores a numbered send once and answers its replays with
the original offset, also when the copies race, also after a SIGKILL and restart (the table is
rebuilt from the queue's tail); the SDK numbers its sends per queue.

ORBITMQ_IDEMPOTENCE_CYCLES (default 1) sets the kill/replay cycles of the process test."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.idempotence import DUPLICATE, OK, STALE, IdempotenceTable
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests import harness
from tests.harness import ProcessCluster

cluster = harness.cluster


def numbered(topic: str, pid: int, seq: int, bodies: list[bytes], queue_id: int = 0) -> Frame:
    first = encode_properties(
        {"PRODUCER_ID": str(pid), "PRODUCER_SEQ": str(seq), "PRODUCER_COUNT": str(len(bodies))}
    )
    props = [first] + [b""] * (len(bodies) - 1)
    code = RequestCode.SEND_BATCH_MESSAGE if len(bodies) > 1 else RequestCode.SEND_MESSAGE
    return Frame(
        code, fields={"topic": topic, "queue_id": queue_id}, body=encode_send_body(bodies, props)
    )


async def test_table_claims_duplicates_gaps_and_stale() -> None:
    table = IdempotenceTable(retained=3)
    a = table.claim(7, "T", 0, 0)
    assert a.verdict == OK
    dup = table.claim(7, "T", 0, 0)
    assert dup.verdict == DUPLICATE and dup.future is a.future  # racing copy waits for it
    table.stored(a, 10, 1000)
    assert dup.future is not None and await dup.future == (10, 1000)
    late = table.claim(7, "T", 0, 5)  # a gap: the send of 1-4 failed for good
    assert late.verdict == OK
    retry = table.claim(7, "T", 0, 3)  # below the last, never stored: a retry, stored
    assert retry.verdict == OK
    table.failed(retry, RuntimeError("busy"))
    assert table.claim(7, "T", 0, 3).verdict == OK  # forgotten: the next retry may store it
    table.claim(7, "T", 0, 9)  # four remembered, three kept: 0 leaves, the low mark moves
    assert table.claim(7, "T", 0, 0).verdict == STALE
    assert table.claim(8, "T", 0, 0).verdict == OK  # another producer
    assert table.claim(7, "T", 1, 0).verdict == OK  # another queue


async def test_replays_return_the_original_offset_and_store_nothing(tmp_path: Path) -> None:
    broker = BrokerController(small_broker_config(tmp_path / "store"))
    await broker.start()
    client = RemotingClient()
    try:
        first = await client.invoke(broker.address, numbered("Idem", 1, 0, [b"a", b"b"]))
        assert first.code == ResponseCode.SUCCESS, first.remark
        # replays, some racing each other, and one racing a new send
        answers = await asyncio.gather(
            *(client.invoke(broker.address, numbered("Idem", 1, 0, [b"a", b"b"])) for _ in range(3)),
            client.invoke(broker.address, numbered("Idem", 1, 2, [b"c"])),
            client.invoke(broker.address, numbered("Idem", 1, 2, [b"c"])),
        )  # fmt: skip
        assert [r.code for r in answers] == [ResponseCode.SUCCESS] * 5
        assert {r.fields["queue_offset"] for r in answers[:3]} == {first.fields["queue_offset"]}
        assert answers[3].fields["queue_offset"] == answers[4].fields["queue_offset"] == 2
        assert broker.store.max_offset("Idem", 0) == 3
        # a plain send is not judged; another producer's sequence 0 is its own
        other = await client.invoke(broker.address, numbered("Idem", 2, 0, [b"d"]))
        assert other.fields["queue_offset"] == 3 and broker.store.max_offset("Idem", 0) == 4
    finally:
        await client.close()
        await broker.stop()


async def test_sdk_numbers_its_sends_per_queue(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        config = small_broker_config(tmp_path / "s", namesrv_addrs=(addr,))
        async with run_broker(config) as b, AsyncAdminClient(namesrv_addrs=[addr]) as admin:
            await admin.create_topic("IdemSdk", read_queue_nums=2, write_queue_nums=2,
                                         broker_addr=b.address)  # fmt: skip
            cfg = ProducerConfig(idempotent=True)
            async with AsyncProducer(namesrv_addrs=[addr], config=cfg) as prod:
                q0 = MessageQueue("IdemSdk", b.config.broker_name, 0)
                await prod.send(Message("IdemSdk", b"x"), queue=q0)
                await prod.send_batch([Message("IdemSdk", b"y"), Message("IdemSdk", b"z")],
                                          queue=q0)  # fmt: skip
                await prod.send(Message("IdemSdk", b"w"), queue=q0)
                pid = prod.sender.producer_id
            res = await admin.pull(q0, 0, max_nums=10)
            seqs = [m.properties.get("PRODUCER_SEQ") for m in res.messages]
            assert seqs == ["0", "1", None, "3"]
            assert {m.properties.get("PRODUCER_ID") for m in res.messages} == {str(pid), None}


CYCLES = int(os.environ.get("ORBITMQ_IDEMPOTENCE_CYCLES", "1"))


@pytest.mark.timeout(60 + 30 * CYCLES)
async def test_replays_after_sigkill_and_restart_store_nothing(cluster: ProcessCluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker("idem-broker", [ns.address], flush="SYNC_FLUSH")
    client = RemotingClient()
    try:
        offsets: dict[int, int] = {}
        seq = 0
        for cycle in range(CYCLES):
            for _ in range(5):  # acknowledged sends, then a crash
                resp = await client.invoke(
                    broker.address, numbered("IdemKill", 9, seq, [b"m%d" % seq])
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                offsets[seq] = resp.fields["queue_offset"]
                seq += 1
            broker.kill()
            await client.close()
            await asyncio.to_thread(broker.restart)
            client = RemotingClient()
            for s, want in sorted(offsets.items())[-10:]:  # replays of the last sends
                resp = await client.invoke(broker.address, numbered("IdemKill", 9, s, [b"m%d" % s]))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                assert resp.fields["queue_offset"] == want, (cycle, s)
            got = await client.invoke(broker.address, Frame(RequestCode.GET_MAX_OFFSET,
                                      fields={"topic": "IdemKill", "queue_id": 0}))  # fmt: skip
            assert got.fields["offset"] == seq, f"cycle {cycle}: something was stored twice"
    finally:
        await client.close()
