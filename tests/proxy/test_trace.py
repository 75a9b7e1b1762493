"""Message trace through the gRPC proxy: a message sent with SendMessage and received and acked
through the proxy (RocketMQ 5 clients, which write no trace themselves) shows Pub ->
SubBefore -> SubAfter with the group and times, written by the traced broker."""

from __future__ import annotations

import asyncio
from typing import Any

from orbitmq.client import AsyncAdminClient
from orbitmq.common.trace import PUB, SUB_AFTER, SUB_BEFORE, TRACE_TOPIC, decode_records, timeline
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from tests.proxy.conftest import ProxyEnv, proxy_env_fixture
from tests.proxy.test_consumer_rpcs import ack, ids_handles, prime, receive_n
from tests.proxy.test_producer_rpcs import message, send

env = proxy_env_fixture(
    {"PxTraced": "NORMAL"},
    queues=1,
    broker_options={"trace_enable": True, "trace_flush_interval_ms": 20},
)


async def test_proxy_message_trace(env: ProxyEnv, stub: Any) -> None:
    topic, group = "PxTraced", "GTraced"
    await prime(stub, group, topic)
    m = message(topic, b"via-grpc", keys=["px-key"])
    resp = await send(stub, m)
    assert resp.status.code == pb.OK, resp.status
    msg_id = resp.entries[0].message_id
    (got,) = await receive_n(stub, group, topic, 1)
    assert [x.system_properties.message_id for x in got.messages] == [msg_id]
    assert (await ack(stub, group, topic, ids_handles(got.messages))).status.code == pb.OK
    env.run(env.brokers[0].trace.flush())
    records: list[Any] = []
    async with AsyncAdminClient([env.ns]) as admin:
        for _ in range(50):  # bounded: the trace topic's route registers within a second
            try:
                found = await admin.query_by_key(TRACE_TOPIC, msg_id, max_num=64)
            except Exception:  # noqa: BLE001 - not routed yet
                found = []
            records = timeline([r for f in found for r in decode_records(f.body)], msg_id)
            if len(records) >= 3:
                break
            await asyncio.sleep(0.1)
    assert [r.type for r in records] == [PUB, SUB_BEFORE, SUB_AFTER]
    pub, before, after = records
    assert pub.topic == topic and pub.keys == "px-key" and pub.body_len == len(b"via-grpc")
    assert before.group == after.group == group and after.success
    assert pub.ts <= before.ts <= after.ts and before.request_id == after.request_id
