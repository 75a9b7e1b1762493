"""Cold reads end to end: data only the tier holds (its local CommitLog segments deleted) read
through the gRPC proxy (PullMessage and ReceiveMessage/Ack, with OrbitMQ's generated
``apache.rocketmq.v2`` stubs, as the official client sends them) and through the Kafka gateway
(kafka-python fetching offsets that exist only in the tier). Each path must return exactly the
produced messages, in order, no gaps and no duplicates.

One in-process cluster (NameServer, a broker with a directory tier, the proxy, the gateway) on
a loop thread, shared by the module; the data is written once and tiered before any test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.client import AsyncAdminClient, AsyncProducer, Message, MessageQueue
from orbitmq.client._loop_thread import LoopThread
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.testing import small_broker_config

kafka = pytest.importorskip("kafka", reason="kafka-python is not installed")

TOPIC = "ColdT"
QUEUES = 2
PER_QUEUE = 240
EVERY_HOUR = ";".join(str(h) for h in range(24))


@dataclass
class Cold:
    thread: LoopThread
    namesrv: NamesrvController
    broker: BrokerController
    proxy: ProxyServer
    gateway: KafkaGateway
    sent: dict[int, list[bytes]]  # queue -> bodies by offset

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return self.thread.run(coro, timeout=timeout)


def body(q: int, i: int) -> bytes:
    return f"cold-q{q}-{i:05d}-".encode() * 24


async def _start(base: Path, thread: LoopThread) -> Cold:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    store = {
        "mapped_file_size_commit_log": 64 * 1024 + 8 * 1024,
        "max_message_size": 4096,
        "tier_backend": "directory",
        "tier_path": str(base / "tier"),
        "tier_upload_interval_ms": 3_600_000,  # the fixture drives the upload
        "tier_chunk_max_messages": 50,
        "tier_local_retention_ms": 0,
        "delete_when": EVERY_HOUR,
        "delete_commit_log_files_max_per_run": 1000,
    }
    broker = BrokerController(
        small_broker_config(
            base / "broker",
            broker_name="broker-a",
            namesrv_addrs=(ns.address,),
            default_queue_nums=QUEUES,
            store=store,
        )
    )
    await broker.start()
    proxy: ProxyServer | None = None
    gateway: KafkaGateway | None = None
    try:
        async with AsyncAdminClient([ns.address]) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            deadline = time.monotonic() + 20
            while len(await _queues(admin)) < QUEUES:
                assert time.monotonic() < deadline, "route never complete"
                await asyncio.sleep(0.05)
        sent: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
        producer = AsyncProducer([ns.address], ProducerConfig(send_timeout_s=5.0))
        await producer.start()
        try:
            for i in range(PER_QUEUE):
                for q in range(QUEUES):
                    mq = MessageQueue(TOPIC, "broker-a", q)
                    await producer.send(Message(TOPIC, body(q, i), keys=[f"key-{q}-{i}"]), queue=mq)
                    sent[q].append(body(q, i))
        finally:
            await producer.close()
        s = broker.store
        assert s.tier is not None
        assert await asyncio.to_thread(s.wait_for_dispatch)
        await asyncio.to_thread(s.commit_log.flush)
        await asyncio.to_thread(s.tier.run_once)
        await asyncio.to_thread(s.retention.run)
        for q in range(QUEUES):  # most of every queue is now only in the tier
            cq = s.queues.get(TOPIC, q)
            assert cq is not None and cq.min_offset > PER_QUEUE // 2, (q, cq and cq.min_offset)
            assert s.min_offset(TOPIC, q) == 0
        proxy = await ProxyServer(ProxyConfig(namesrv_addrs=(ns.address,), port=0)).start()
        gateway = KafkaGateway(KafkaConfig(namesrv_addrs=(ns.address,), port=0))
        await gateway.start()
    except BaseException:
        if proxy is not None:
            await proxy.stop(0)
        await broker.stop()
        await ns.stop()
        raise
    return Cold(thread, ns, broker, proxy, gateway, sent)


async def _queues(admin: AsyncAdminClient) -> list[Any]:
    try:
        return list(await admin.queues(TOPIC))
    except Exception:  # noqa: BLE001 - not registered yet
        return []


async def _stop(env: Cold) -> None:
    try:
        await env.gateway.stop()
        await env.proxy.stop(0)
    finally:
        await env.broker.stop()
        await env.namesrv.stop()


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cold]:
    thread = LoopThread("tier-cold", asyncio.new_event_loop)
    try:
        env = thread.run(_start(tmp_path_factory.mktemp("cold"), thread), timeout=120)
        try:
            yield env
        finally:
            thread.run(_stop(env), timeout=30)
    finally:
        thread.stop()


def md() -> list[tuple[str, str]]:
    return [("x-mq-client-id", "cold-client")]


def mq(q: int) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=q, broker=pb.Broker(name="broker-a"))


async def test_proxy_pull_reads_the_tier_from_the_beginning(cold: Cold) -> None:
    async with grpc.aio.insecure_channel(cold.proxy.address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for q in range(QUEUES):
            begin = await stub.QueryOffset(
                svc.QueryOffsetRequest(message_queue=mq(q), query_offset_policy=pb.BEGINNING),
                metadata=md(), timeout=10,
            )  # fmt: skip
            assert begin.status.code == pb.OK and begin.offset == 0, begin
            got: list[bytes] = []
            offset = 0
            for _ in range(200):
                if offset >= PER_QUEUE:
                    break
                req = svc.PullMessageRequest(
                    group=pb.Resource(name="cold-pull"), message_queue=mq(q), offset=offset,
                    batch_size=32, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                )  # fmt: skip
                resp = [r async for r in stub.PullMessage(req, metadata=md(), timeout=10)]
                status = next(r.status for r in resp if r.HasField("status"))
                assert status.code == pb.OK, status
                msgs = [r.message for r in resp if r.HasField("message")]
                assert [m.system_properties.queue_offset for m in msgs] == list(
                    range(offset, offset + len(msgs))
                )
                got += [m.body for m in msgs]
                offset = next(r.next_offset for r in resp if r.HasField("next_offset"))
            assert got == cold.sent[q]


async def test_proxy_receive_and_ack_reads_the_tier(cold: Cold) -> None:
    """A SimpleConsumer's ReceiveMessage (Pop) for a group whose offset is 0: cold data first."""
    group = "cold-pop"
    async with grpc.aio.insecure_channel(cold.proxy.address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for q in range(QUEUES):
            upd = svc.UpdateOffsetRequest(
                group=pb.Resource(name=group), message_queue=mq(q), offset=0
            )
            assert (await stub.UpdateOffset(upd, metadata=md(), timeout=10)).status.code == pb.OK
        got: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(QUEUES)}
        deadline = time.monotonic() + 60
        while sum(len(v) for v in got.values()) < QUEUES * PER_QUEUE:
            assert time.monotonic() < deadline, {q: len(v) for q, v in got.items()}
            for q in range(QUEUES):
                req = svc.ReceiveMessageRequest(
                    group=pb.Resource(name=group), message_queue=mq(q), batch_size=32,
                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                )  # fmt: skip
                req.invisible_duration.FromMilliseconds(30_000)
                req.long_polling_timeout.FromMilliseconds(0)
                resp = [r async for r in stub.ReceiveMessage(req, metadata=md(), timeout=10)]
                msgs = [r.message for r in resp if r.HasField("message")]
                entries = []
                for m in msgs:
                    got[m.system_properties.queue_id].append(
                        (m.system_properties.queue_offset, m.body)
                    )
                    entries.append(
                        svc.AckMessageEntry(
                            message_id=m.system_properties.message_id,
                            receipt_handle=m.system_properties.receipt_handle,
                        )
                    )
                if entries:
                    ack = svc.AckMessageRequest(
                        group=pb.Resource(name=group),
                        topic=pb.Resource(name=TOPIC),
                        entries=entries,
                    )
                    ack_resp = await stub.AckMessage(ack, metadata=md(), timeout=10)
                    assert ack_resp.status.code == pb.OK, ack_resp.status
        for q in range(QUEUES):
            assert sorted(got[q]) == list(enumerate(cold.sent[q])), q  # exactly once each


async def test_kafka_python_fetches_offsets_only_in_the_tier(cold: Cold) -> None:
    bootstrap = f"127.0.0.1:{cold.gateway.port}"

    def run() -> dict[int, list[tuple[int, bytes]]]:
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
            fetch_max_bytes=64 * 1024, max_partition_fetch_bytes=16 * 1024,
        )  # fmt: skip
        try:
            tps = [kafka.TopicPartition(TOPIC, p) for p in range(QUEUES)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(QUEUES)}
            deadline = time.monotonic() + 60
            while sum(len(v) for v in got.values()) < QUEUES * PER_QUEUE:
                assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
                for tp, records in consumer.poll(timeout_ms=500).items():
                    got[tp.partition] += [(r.offset, r.value) for r in records]
            return got
        finally:
            consumer.close()

    got = await asyncio.to_thread(run)
    for q in range(QUEUES):
        assert got[q] == list(enumerate(cold.sent[q])), q  # in order, once each
