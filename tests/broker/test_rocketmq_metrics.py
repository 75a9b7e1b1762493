"""The RocketMQ 5 metric family on the broker's Prometheus endpoint: names, labels and values
after sends, pulls, commits and a dead-letter move (broker/rocketmq_metrics.py,
broker/consumer_lag.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.broker.conftest import broker_config
from tests.broker.test_broker import pull_frame, send_frame
from tests.broker.test_consumer_groups import Member
from tests.broker.test_pop import GROUP, ack, make_topic, pop, send

BASE = {"cluster": "C1", "node_type": "broker", "node_id": "bk-1"}


def value(b: BrokerController, name: str, **labels: str) -> float | None:
    return b.metrics.registry.get_sample_value(name, {**BASE, **labels})


async def test_counters_lag_and_labels_after_send_pull_commit_and_dlq(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = BrokerController(
        broker_config(tmp_path / "s", cluster="C1", broker_name="bk-1", metrics_port=0)
    )
    await b.start()
    try:
        bodies = [b"x" * 10, b"y" * 2000, b"z" * 5000]
        resp = await client.invoke(b.address, send_frame("T", bodies))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await asyncio.to_thread(b.store.wait_for_dispatch)
        normal = {"topic": "T", "message_type": "normal", "is_system": "false"}
        assert value(b, "rocketmq_messages_in_total", **normal) == 3
        assert value(b, "rocketmq_throughput_in_total", **normal) == 7010
        assert value(b, "rocketmq_message_size_bucket", **normal, le="1024.0") == 1
        assert value(b, "rocketmq_message_size_bucket", **normal, le="4096.0") == 2
        assert value(b, "rocketmq_message_size_bucket", **normal, le="16384.0") == 3
        assert value(b, "rocketmq_message_size_bucket", **normal, le="+Inf") == 3
        assert value(b, "rocketmq_message_size_sum", **normal) == 7010

        # Group G pulls two, commits one: 1 in flight, 1 ready, lag 2.
        resp = await client.invoke(b.address, pull_frame("T", 0, 0, group="G", max_msg_nums=2))
        assert resp.code == ResponseCode.SUCCESS and resp.fields["next_begin_offset"] == 2
        b.offsets.set("G", "T", 0, 1)
        tg = {"topic": "T", "consumer_group": "G"}
        out = lag = {**tg, "is_system": "false", "is_retry": "false"}
        assert value(b, "rocketmq_messages_out_total", **out) == 2
        assert (value(b, "rocketmq_throughput_out_total", **out) or 0) > 2010
        assert value(b, "rocketmq_consumer_inflight_messages", **lag) == 1
        assert value(b, "rocketmq_consumer_ready_messages", **lag) == 1
        assert value(b, "rocketmq_consumer_lag_messages", **lag) == 2
        await asyncio.sleep(0.06)
        assert (value(b, "rocketmq_consumer_lag_latency_milliseconds", **lag) or 0) >= 50
        assert (value(b, "rocketmq_consumer_queueing_latency_milliseconds", **lag) or 0) >= 50

        # All consumed and committed: every lag gauge is 0.
        resp = await client.invoke(b.address, pull_frame("T", 0, 2, group="G"))
        assert resp.code == ResponseCode.SUCCESS
        b.offsets.set("G", "T", 0, 3)
        for name in ("lag_messages", "inflight_messages", "ready_messages",
                     "lag_latency_milliseconds", "queueing_latency_milliseconds"):  # fmt: skip
            assert value(b, f"rocketmq_consumer_{name}", **lag) == 0, name

        # A dead-letter move is counted under the message's topic and the group.
        send_back = Frame(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            fields={"group": "G", "offset": int(resp.fields.get("offset", 0)), "to_dlq": True},
        )
        sent = await client.invoke(b.address, send_frame("T", [b"dead"]))
        send_back.fields["offset"] = int(sent.fields["offset"])
        await asyncio.to_thread(b.store.wait_for_dispatch)
        resp = await client.invoke(b.address, send_back)
        assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True
        assert value(b, "rocketmq_send_to_dlq_messages_total", **tg, is_system="false") == 1

        # RocketMQ 5's labels: code names in lower case, is_long_polling, result
        rpc = {"protocol_type": "remoting", "request_code": "pull_message",
               "is_long_polling": "false", "result": "success"}  # fmt: skip
        assert (value(b, "rocketmq_rpc_latency_count", **rpc, response_code="success") or 0) >= 2
        batch = {**rpc, "request_code": "send_batch_message"}
        assert value(b, "rocketmq_rpc_latency_count", **batch, response_code="success") == 1
        assert (value(b, "rocketmq_topic_number") or 0) >= 2  # T and %DLQ%G
        assert value(b, "rocketmq_consumer_group_number") == 1
        assert value(b, "rocketmq_storage_size", storage_type="local") is not None

        # The HTTP endpoint: both families, every rocketmq_* series with the node labels.
        url = f"http://127.0.0.1:{b.metrics_port}/metrics"

        def scrape() -> bytes:
            with urllib.request.urlopen(url, timeout=5) as r:
                body: bytes = r.read()
                return body

        text = await asyncio.to_thread(scrape)
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        assert "orbitmq_broker_messages_in" in families
        expected = {
            "rocketmq_messages_in", "rocketmq_throughput_in", "rocketmq_messages_out",
            "rocketmq_throughput_out", "rocketmq_message_size", "rocketmq_consumer_lag_messages",
            "rocketmq_consumer_inflight_messages", "rocketmq_consumer_ready_messages",
            "rocketmq_consumer_lag_latency_milliseconds", "rocketmq_send_to_dlq_messages",
            "rocketmq_topic_number", "rocketmq_consumer_group_number", "rocketmq_storage_size",
            "rocketmq_rpc_latency",
        }  # fmt: skip
        assert expected <= set(families), expected - set(families)
        for name, fam in families.items():
            if name.startswith("rocketmq_"):
                for sample in fam.samples:
                    assert {k: sample.labels[k] for k in BASE} == BASE, sample
    finally:
        await b.stop()


async def test_pop_counts_out_and_in_flight(tmp_path: Path, client: RemotingClient) -> None:
    b = BrokerController(broker_config(tmp_path / "s", cluster="C1", broker_name="bk-1"))
    await b.start()
    try:
        make_topic(b, "P")
        await send(client, b, "P", [b"a", b"bb", b"ccc"])
        _, msgs, handles = await pop(client, b, "P")
        assert len(msgs) == 3
        tg = {"topic": "P", "consumer_group": GROUP}
        out = lag = {**tg, "is_system": "false", "is_retry": "false"}
        assert value(b, "rocketmq_messages_out_total", **out) == 3
        # Pop moved the group's offset to 3; the three are in flight until acked.
        assert value(b, "rocketmq_consumer_inflight_messages", **lag) == 3
        assert value(b, "rocketmq_consumer_ready_messages", **lag) == 0
        assert value(b, "rocketmq_consumer_lag_messages", **lag) == 3
        for h in handles:
            assert (await ack(client, b, "P", h)).code == ResponseCode.SUCCESS
        assert value(b, "rocketmq_consumer_lag_messages", **lag) == 0
        pop_code = {"request_code": "pop_message", "response_code": "success",
                    "is_long_polling": "false", "result": "success"}  # fmt: skip
        assert value(b, "rocketmq_rpc_latency_count", protocol_type="remoting", **pop_code) == 1
    finally:
        await b.stop()


async def test_consumer_connections_by_group_language_and_mode(tmp_path: Path) -> None:
    b = BrokerController(broker_config(tmp_path / "s", cluster="C1", broker_name="bk-1"))
    await b.start()
    made: list[Member] = []
    try:
        a, c = Member(b.address, "client-a"), Member(b.address, "client-c")
        s = Member(b.address, "client-s")
        made += [a, c, s]
        assert (await a.beat(group="GC", consume_type="PULL")).code == ResponseCode.SUCCESS
        assert (await c.beat(group="GC", consume_type="POP")).code == ResponseCode.SUCCESS
        assert (await s.beat(group="CID_RMQ_SYS_X", consume_type="PUSH")).code == 0
        m = b.consumers.groups["GC"].members["client-a"]
        # RocketMQ 5's label set: language and version in lower case, the protocol, is_system.
        assert m.language != m.language.lower()
        labels = {"consumer_group": "GC", "language": m.language.lower(),
                  "version": m.version.lower(), "protocol_type": "remoting"}  # fmt: skip
        user = {**labels, "is_system": "false"}
        assert value(b, "rocketmq_consumer_connections", **user, consume_mode="pull") == 1
        assert value(b, "rocketmq_consumer_connections", **user, consume_mode="pop") == 1
        system = {**labels, "consumer_group": "CID_RMQ_SYS_X", "is_system": "true"}
        assert value(b, "rocketmq_consumer_connections", **system, consume_mode="push") == 1
        await a.close()
        for _ in range(100):  # bounded: the broker sees the connection close
            if value(b, "rocketmq_consumer_connections", **user, consume_mode="pull") is None:
                break
            await asyncio.sleep(0.02)
        assert value(b, "rocketmq_consumer_connections", **user, consume_mode="pull") is None
    finally:
        for x in made:
            await x.close()
        await b.stop()
