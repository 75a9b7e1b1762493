"""The per-batch paths: Produce builds one send body from a Kafka batch (no Message per record)
and Fetch builds Kafka batches from a raw pull body (no message object for the usual record).
Both must give what the per-record mapping gives: records produced through Kafka (text keys,
binary keys, null values, headers, tags, idempotent numbers) and messages sent by the SDK
(tags, keys, properties, compressed bodies) are pulled raw and encoded both ways, from every
start offset."""

from __future__ import annotations

import asyncio
import random

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue, _codec
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.message import decode_properties
from orbitmq.kafka.fetch_encode import encode_messages, encode_pull
from orbitmq.kafka.mapping import to_message, to_send_body
from orbitmq.protocol.kafka.records import Record, build_batch, read_batches
from orbitmq.protocol.messages import decode_records, decode_send_body
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient

PRODUCE = 0


def _records(rng: random.Random, n: int) -> list[Record]:
    out = []
    for i in range(n):
        kind = rng.randrange(6)
        key = {0: b"k%d" % i, 1: None, 2: bytes([0xFF, i % 256]), 3: b"has space",
               4: b"k%d" % i, 5: b""}[kind]  # fmt: skip
        value = None if kind == 1 and rng.random() < 0.5 else b"v%d" % i
        headers: list[tuple[str, bytes | None]] = []
        if kind == 4:
            headers = [("unit", b"C"), ("bin", b"\x00\x01"), ("rocketmq.tag", b"T")]
        elif kind == 0 and i % 3 == 1:  # plain only, a repeated key, the tag not first
            headers = [("a", b"1"), ("a", b"2"), ("rocketmq.tag", b"T")]
        elif kind == 0 and i % 3 == 2:  # plain only: properties, in order
            headers = [("z", b"1"), ("y", b"2")]
        out.append(Record(i, rng.randrange(-5, 50), key, value, headers))
    return out


def test_send_body_matches_the_per_record_mapping() -> None:
    rng = random.Random(7)
    recs = _records(rng, 60)
    body = decode_send_body(to_send_body("T", recs, 1_700_000_000_000, {"KAFKA_PID": "5"}))
    assert len(body.bodies) == len(recs)
    for i, (rec, got_body, props) in enumerate(
        zip(recs, body.bodies, body.properties, strict=True)
    ):
        want = to_message("T", rec, 1_700_000_000_000 + rec.timestamp_delta)
        got = decode_properties(props)
        assert got.pop("UNIQ_CLIENT_MESSAGE_ID_KEYIDX")
        expected = want.system_properties()
        if i == 0:
            expected["KAFKA_PID"] = "5"
        assert got == expected, (rec, got)
        assert bytes(got_body) == want.body


async def test_fetch_encoding_matches_the_decoded_path(stack: Stack) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    async with AsyncAdminClient(stack.namesrv) as admin:
        masters = sorted((await admin.masters()).values())
        await admin.create_topic("PerBatch", read_queue_nums=1, write_queue_nums=1,
                                 broker_addr=masters[0])  # fmt: skip
        deadline = asyncio.get_running_loop().time() + 10
        while not await stack.gateway.partitions.of("PerBatch", fresh=True):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        mq = (await admin.queues("PerBatch"))[0]
        # SDK messages: tags, keys, properties, compressed bodies
        cfg = ProducerConfig(compress_over_bytes=100)
        async with AsyncProducer(stack.namesrv, cfg) as prod:
            q = MessageQueue("PerBatch", mq.broker_name, mq.queue_id)
            await prod.send_batch([
                Message("PerBatch", b"plain"),
                Message("PerBatch", b"x" * 500, tags="TagA", keys=["a", "b"]),
                Message("PerBatch", b"p", properties={"color": "red"}),
                Message("PerBatch", b"k", keys=["only"]),
            ], queue=q)  # fmt: skip

        produced: list[Record] = []

        def produce() -> None:
            c = RawClient(stack.bootstrap)
            try:
                for n in (1, 7, 30):
                    recs = _records(rng, n)
                    produced.extend(recs)
                    batch = build_batch(recs, base_timestamp=1_700_000_000_000)
                    body = {"acks": -1, "timeout_ms": 5000, "topic_data": [
                        {"name": "PerBatch", "partition_data": [{"index": 0, "records": batch}]}]}  # fmt: skip
                    part = c.call(PRODUCE, 8, body)["responses"][0]["partition_responses"][0]
                    assert part["error_code"] == 0
            finally:
                c.close()

        await asyncio.to_thread(produce)
        total = 4 + 1 + 7 + 30
        while await admin.max_offset(mq) < total:
            await asyncio.sleep(0.02)
        raw = await admin.pull_raw(mq, 0, max_nums=100)
        msgs = [_codec.plain(m) for m in decode_records(raw.body)]
        assert len(msgs) == total
        for start in range(total):
            want = encode_messages([m for m in msgs if m.queue_offset >= start])
            got = encode_pull(raw.body, start)
            assert got == want, start
        # the batches read back as Kafka records: every offset once, in order
        back = [(b.base_offset + r.offset_delta, r) for b in read_batches(encode_pull(raw.body, 0))
                for r in b.records()]  # fmt: skip
        assert [o for o, _ in back] == list(range(total))
        for (_, got), sent in zip(back[4:], produced, strict=True):  # null and empty values too
            assert (got.key, got.value) == (sent.key, sent.value)
            assert got.headers == sent.headers  # order and repeats kept
