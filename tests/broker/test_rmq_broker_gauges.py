"""The RocketMQ 5 families added after the first set: processor watermark, storage reserve
time, Pop revive retries and buffer scan time, the ``is_system`` / ``is_retry`` labels of the
in/out counters and the lag gauges, and the broker's producer connections, each read from a real broker's state
(broker/watermark.py, service_metrics.py, rocketmq_metrics.py, consumer_lag.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbitmq.broker.consumer_lag import _labelled
from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metrics import BrokerMetrics
from orbitmq.broker.rocketmq_metrics import is_system
from orbitmq.broker.routes import Dispatcher
from orbitmq.broker.service_metrics import earliest_message_ms
from orbitmq.broker.watermark import PROCESSORS, processor_of
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import HeartbeatData
from orbitmq.protocol.frame import Frame
from tests.broker.conftest import broker_config
from tests.broker.test_broker import pull_frame, send_frame
from tests.broker.test_pop import (
    GROUP,
    NEEDS_POP_RETRY_TOPIC,
    ack,
    call,
    make_topic,
    no_pop_backoff,
    pop,
    pop_frame,
    send,
)

NO_CONN: Any = None
"""In-process requests have no connection (as tests/broker/test_pop.py's ``call``)."""
BASE = {"cluster": "C1", "node_type": "broker", "node_id": "bk-1"}


def value(b: BrokerController | BrokerMetrics, name: str, **labels: str) -> float | None:
    registry = b.registry if isinstance(b, BrokerMetrics) else b.metrics.registry
    return registry.get_sample_value(name, {**BASE, **labels})


def broker(tmp_path: Path, **over: object) -> BrokerController:
    return BrokerController(broker_config(tmp_path / "s", cluster="C1", broker_name="bk-1", **over))


async def wait_until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Poll ``check()`` (bounded in time) until it is true."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------- rocketmq_processor_watermark


def test_request_codes_map_to_rocketmq_processors() -> None:
    assert processor_of(RequestCode.SEND_BATCH_MESSAGE) == "send"
    assert processor_of(RequestCode.POP_MESSAGE) == "pull"
    assert processor_of(RequestCode.CHANGE_MESSAGE_INVISIBLETIME) == "ack"
    assert processor_of(RequestCode.HEART_BEAT) == "heartbeat"
    assert processor_of(RequestCode.QUERY_CONSUMER_OFFSET) == "consumer_manager"
    assert processor_of(RequestCode.END_TRANSACTION) == "transaction"
    assert processor_of(RequestCode.GET_ALL_TOPIC_CONFIG) == "admin"  # the default processor
    assert processor_of(65000) == "admin"


async def test_watermark_counts_requests_being_served_per_processor() -> None:
    metrics = BrokerMetrics("C1", "bk-1")
    release = asyncio.Event()

    async def slow(frame: Frame, _conn: Any) -> Frame:
        await release.wait()
        return frame.reply(ResponseCode.SUCCESS)

    dispatcher = Dispatcher({RequestCode.SEND_MESSAGE: slow}, metrics)
    for name in PROCESSORS:  # every processor has a series, idle ones at 0
        assert value(metrics, "rocketmq_processor_watermark", processor=name) == 0
    tasks = [
        asyncio.create_task(dispatcher.handle(Frame(RequestCode.SEND_MESSAGE), NO_CONN))
        for _ in range(3)
    ]
    await wait_until(lambda: metrics.watermark.active[PROCESSORS.index("send")] == 3)
    assert value(metrics, "rocketmq_processor_watermark", processor="send") == 3
    assert value(metrics, "rocketmq_processor_watermark", processor="pull") == 0
    release.set()
    for reply in await asyncio.gather(*tasks):
        assert isinstance(reply, Frame) and reply.code == ResponseCode.SUCCESS
    assert value(metrics, "rocketmq_processor_watermark", processor="send") == 0
    # A request that fails is given back too.
    failing = await dispatcher.handle(Frame(RequestCode.GET_ALL_TOPIC_CONFIG), NO_CONN)
    assert isinstance(failing, Frame)
    assert failing.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert value(metrics, "rocketmq_processor_watermark", processor="admin") == 0


async def test_long_polled_pulls_and_pops_are_not_queued(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = broker(tmp_path)
    await b.start()
    try:
        make_topic(b, "W")
        held_pull = asyncio.create_task(
            client.invoke(
                b.address,
                pull_frame("W", 0, 0, group="GW", suspend_timeout_ms=5000),
                timeout=10,
            )
        )
        held_pop = asyncio.create_task(call(client, b, pop_frame("W", poll_time_ms=5000), 10))
        await wait_until(lambda: b.long_polling.held == 1 and b.pop.held == 1)
        pull_slot = PROCESSORS.index("pull")
        assert b.metrics.watermark.active[pull_slot] == 2  # both being served ...
        assert value(b, "rocketmq_processor_watermark", processor="pull") == 0  # ... parked
        await send(client, b, "W", [b"wake"])
        resp = await held_pull
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert (await held_pop).code == ResponseCode.SUCCESS
        await wait_until(lambda: b.metrics.watermark.active[pull_slot] == 0)
        assert value(b, "rocketmq_processor_watermark", processor="pull") == 0
    finally:
        await b.stop()


# ---------------------------------------------------------------- storage reserve time


async def test_storage_message_reserve_time_follows_the_oldest_message(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = broker(tmp_path)
    await b.start()
    labels = {"storage_type": "local", "storage_medium": "disk"}
    name = "rocketmq_storage_message_reserve_time_milliseconds"
    try:
        assert earliest_message_ms(b.store) is None
        assert value(b, name, **labels) is None  # no message: no sample, as in RocketMQ
        resp = await client.invoke(b.address, send_frame("K", [b"first"]))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await asyncio.to_thread(b.store.wait_for_dispatch)
        first = b.store.get_message(int(resp.fields["offset"]))
        assert first is not None
        assert earliest_message_ms(b.store) == first.store_timestamp_ms
        await asyncio.sleep(0.12)
        resp = await client.invoke(b.address, send_frame("K", [b"second"]))
        assert resp.code == ResponseCode.SUCCESS
        before = int(time.time() * 1000)
        age = value(b, name, **labels)
        after = int(time.time() * 1000)
        assert age is not None
        # The first message's age, not the newest one's.
        assert before - first.store_timestamp_ms - 5 <= age <= after - first.store_timestamp_ms + 5
        assert age >= 100
    finally:
        await b.stop()


# ---------------------------------------------------------------- is_system / is_retry labels


def test_is_system_label_follows_rocketmq() -> None:
    assert is_system("T") == "false"
    assert is_system("RMQ_SYS_TRACE_TOPIC") == "true"
    assert is_system("rmq_sys_REVIVE_LOG") == "true"
    assert is_system("SCHEDULE_TOPIC_XXXX") == "true"
    assert is_system("TBW102") == "true"
    assert is_system("T", "CID_RMQ_SYS_TRANS") == "true"
    assert is_system("T", "cid_rmq_sys_x") == "true"
    assert is_system("T", "G") == "false"


async def test_out_counters_label_system_groups(tmp_path: Path, client: RemotingClient) -> None:
    b = broker(tmp_path)
    await b.start()
    try:
        resp = await client.invoke(b.address, send_frame("S", [b"a", b"b"]))
        assert resp.code == ResponseCode.SUCCESS
        await asyncio.to_thread(b.store.wait_for_dispatch)
        for group in ("G", "CID_RMQ_SYS_G"):
            resp = await client.invoke(b.address, pull_frame("S", 0, 0, group=group))
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        out = {"topic": "S", "is_retry": "false"}
        name = "rocketmq_messages_out_total"
        assert value(b, name, **out, consumer_group="G", is_system="false") == 2
        assert value(b, name, **out, consumer_group="CID_RMQ_SYS_G", is_system="true") == 2
        assert value(b, "rocketmq_messages_in_total", topic="S", message_type="normal",
                     is_system="false") == 2  # fmt: skip
    finally:
        await b.stop()


@NEEDS_POP_RETRY_TOPIC
async def test_pop_revive_retries_scan_time_and_is_retry(
    tmp_path: Path, client: RemotingClient
) -> None:
    b = broker(tmp_path, pop_revive_interval_ms=50)
    await b.start()
    try:
        no_pop_backoff(b)
        make_topic(b, "R")
        await send(client, b, "R", [b"x", b"yy"])
        _, first, handles = await pop(client, b, "R", invisible_time_ms=300)
        assert [m.body for m in first] == [b"x", b"yy"]
        assert (await ack(client, b, "R", handles[0])).code == ResponseCode.SUCCESS
        resp, again, handles2 = await pop(client, b, "R", poll_time_ms=3000)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in again] == [b"yy"]
        # The lag gauges: the redelivered message is in flight on the retry series of "R".
        lag = {"topic": "R", "consumer_group": GROUP, "is_system": "false"}
        inflight = "rocketmq_consumer_inflight_messages"
        assert value(b, inflight, **lag, is_retry="true") == 1
        assert value(b, inflight, **lag, is_retry="false") == 0
        assert (await ack(client, b, "R", handles2[0])).code == ResponseCode.SUCCESS
        assert value(b, inflight, **lag, is_retry="true") == 0
        assert value(b, "rocketmq_consumer_lag_messages", **lag, is_retry="true") == 0

        retry = {"consumer_group": GROUP, "topic": "R", "put_status": "PUT_OK"}
        assert value(b, "rocketmq_pop_revive_retry_messages_total", **retry) == 1
        out = {"topic": "R", "consumer_group": GROUP, "is_system": "false"}
        assert value(b, "rocketmq_messages_out_total", **out, is_retry="false") == 2
        assert value(b, "rocketmq_messages_out_total", **out, is_retry="true") == 1
        retried_bytes = value(b, "rocketmq_throughput_out_total", **out, is_retry="true")
        assert retried_bytes is not None and retried_bytes > len(b"yy")

        scan = "rocketmq_pop_buffer_scan_time_consume_milliseconds"
        passes = value(b, f"{scan}_count") or 0
        assert passes >= 1  # the reviver ran at least the pass that revived "yy"
        assert value(b, f"{scan}_bucket", le="+Inf") == passes
        assert (value(b, f"{scan}_sum") or -1) >= 0
        await wait_until(lambda: (value(b, f"{scan}_count") or 0) > passes)  # every pass
    finally:
        await b.stop()


# ---------------------------------------------------------------- producer connections


async def test_producer_connections_by_language_and_version(tmp_path: Path) -> None:
    b = broker(tmp_path)
    await b.start()
    remoting = RemotingClient(name="producer-a")
    try:
        hb = HeartbeatData(
            client_id="producer-a", language="JAVA", version="V5_3_1",
            producer_groups=["PG1", "PG2"],
        )  # fmt: skip
        frame = Frame(RequestCode.HEART_BEAT, body=encode_body(hb))
        resp = await remoting.invoke(b.address, frame, timeout=5)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        labels = {"language": "java", "version": "v5_3_1", "protocol_type": "remoting"}
        name = "rocketmq_producer_connections"
        assert value(b, name, **labels) == 2  # one per (producer group, client), as RocketMQ
        await remoting.close()
        await wait_until(lambda: value(b, name, **labels) is None)
    finally:
        await remoting.close()
        await b.stop()


def test_lag_rows_of_retry_topics_are_labelled_as_retries() -> None:
    assert _labelled("T", "G") == ("T", False)
    assert _labelled("%RETRY%G+T", "G") == ("T", True)  # Pop: under the topic it retries
    assert _labelled("%RETRY%G", "G") == ("%RETRY%G", True)  # push: its own name
    assert _labelled("%RETRY%H+T", "G") == ("%RETRY%H+T", False)  # another group's


async def test_runtime_info_carries_reserve_time_and_queues(
    tmp_path: Path, client: RemotingClient
) -> None:
    """What the console shows: GET_BROKER_RUNTIME_INFO's message_reserve_time_ms (absent on
    an empty store) and processor_queued (the asking request itself not counted)."""
    b = broker(tmp_path)
    await b.start()
    try:
        info = (await client.invoke(b.address, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))).fields
        assert "message_reserve_time_ms" not in info
        assert info["processor_queued"] == dict.fromkeys(PROCESSORS, 0)
        sent_at = int(time.time() * 1000)
        resp = await client.invoke(b.address, send_frame("K", [b"x"]))
        assert resp.code == ResponseCode.SUCCESS
        await asyncio.sleep(0.1)
        info = (await client.invoke(b.address, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))).fields
        assert 100 <= info["message_reserve_time_ms"] <= int(time.time() * 1000) - sent_at + 5
    finally:
        await b.stop()
