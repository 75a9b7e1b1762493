"""Real Kafka clients bootstrap against a server built on the sans-IO codec alone.

A small asyncio server answers ApiVersions and Metadata with `ServerConnection` and
`encode_response`; librdkafka (confluent-kafka, which negotiates ApiVersions v3 and flexible
Metadata) and kafka-python (ApiVersions v4 first, then its own choice) must list the topic with
its partitions. This proves the framing, header versions and both encodings on the wire with
clients we did not write; the gateway's own tests build on it."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orbitmq.protocol.kafka.connection import Rejected, ServerConnection, encode_response

SUPPORTED = {18: (0, 4), 3: (0, 12)}
PARTITIONS = 3


def _metadata(port: int, body: dict[str, Any]) -> dict[str, Any]:
    wanted = body.get("topics")
    names = ["plant"] if wanted is None else [t["name"] for t in wanted]
    topics = []
    for name in names:
        known = name == "plant"
        topics.append({
            "error_code": 0 if known else 3,
            "name": name,
            "topic_id": bytes(16),
            "partitions": [
                {"partition_index": i, "leader_id": 0, "leader_epoch": 0, "replica_nodes": [0],
                 "isr_nodes": [0], "offline_replicas": []}
                for i in range(PARTITIONS if known else 0)
            ],
        })  # fmt: skip
    return {
        "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": port}],
        "cluster_id": "orbitmq-codec-test",
        "controller_id": 0,
        "topics": topics,
    }


@pytest.fixture
def server() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = ServerConnection(SUPPORTED)
        try:
            while data := await reader.read(65536):
                for ev in conn.receive(data):
                    if isinstance(ev, Rejected):
                        if ev.reply is None:
                            return
                        writer.write(ev.reply)
                        continue
                    if ev.api_key == 18:
                        body: dict[str, Any] = {"api_keys": [
                            {"api_key": k, "min_version": lo, "max_version": hi}
                            for k, (lo, hi) in SUPPORTED.items()
                        ]}  # fmt: skip
                    else:
                        body = _metadata(port, ev.body)
                    writer.write(
                        encode_response(ev.api_key, ev.api_version, ev.correlation_id, body)
                    )
                await writer.drain()
        finally:
            writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(handle, sock=sock)

    srv = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:

        async def stop() -> None:
            # Connection handlers are cancelled and awaited, so each closes its transport
            # before the loop stops (else an unclosed-transport ResourceWarning surfaces later,
            # in whichever test is running, as an error under filterwarnings=error).
            srv.close()
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await srv.wait_closed()
            for _ in range(3):  # transports finish closing on the following iterations
                await asyncio.sleep(0)
            loop.stop()

        loop.call_soon_threadsafe(lambda: loop.create_task(stop()))
        thread.join(5)
        loop.close()


def test_librdkafka_lists_topics(server: int) -> None:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    admin = admin_mod.AdminClient({"bootstrap.servers": f"127.0.0.1:{server}"})
    md = admin.list_topics(timeout=10)
    assert md.cluster_id == "orbitmq-codec-test"
    assert sorted(md.topics["plant"].partitions) == list(range(PARTITIONS))
    assert md.brokers[0].port == server


def test_kafka_python_lists_topics(server: int) -> None:
    kafka = pytest.importorskip("kafka")
    consumer = kafka.KafkaConsumer(bootstrap_servers=f"127.0.0.1:{server}", request_timeout_ms=5000)
    try:
        assert consumer.partitions_for_topic("plant") == set(range(PARTITIONS))
    finally:
        consumer.close()
