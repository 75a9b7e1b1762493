"""The NameServer over the wire: an in-process NamesrvController on 127.0.0.1, port 0, talked
to with RemotingClient; and ``python -m orbitmq namesrv`` as a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import (
    PERM_READ,
    PERM_READ_WRITE,
    ClusterInfo,
    TopicList,
    TopicRouteData,
    decode_body,
)
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.namesrv.conftest import FakeClock, identity, register_frame, topic_configs


async def call(client: RemotingClient, ns: NamesrvController, frame: Frame) -> Frame:
    return await client.invoke(ns.address, frame, timeout=3.0)


async def route(client: RemotingClient, ns: NamesrvController, topic: str) -> TopicRouteData | None:
    resp = await call(
        client, ns, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})
    )
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        assert topic in resp.remark
        return None
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return decode_body(resp.body, TopicRouteData)


async def perms(client: RemotingClient, ns: NamesrvController, topic: str) -> dict[str, int]:
    r = await route(client, ns, topic)
    return {} if r is None else {q.broker_name: q.perm for q in r.queue_datas}


async def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def test_register_route_cluster_info_topic_list(
    namesrv: NamesrvController, client: RemotingClient
) -> None:
    resp = await call(client, namesrv, register_frame(topics=topic_configs("T1", "T2")))
    assert resp.code == ResponseCode.SUCCESS and resp.fields["master_addr"] == "127.0.0.1:10911"
    slave = register_frame(bid=1, addr="127.0.0.1:10921")
    assert (await call(client, namesrv, slave)).code == ResponseCode.SUCCESS
    other = register_frame(
        name="broker-b", addr="127.0.0.1:10931", cluster="c2", topics=topic_configs("T2")
    )
    assert (await call(client, namesrv, other)).code == ResponseCode.SUCCESS

    r = await route(client, namesrv, "T2")
    assert r is not None
    assert [(q.broker_name, q.read_queue_nums, q.perm) for q in r.queue_datas] == [
        ("broker-a", 4, PERM_READ_WRITE),
        ("broker-b", 4, PERM_READ_WRITE),
    ]
    assert {b.broker_name: b.broker_addrs for b in r.broker_datas} == {
        "broker-a": {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"},
        "broker-b": {0: "127.0.0.1:10931"},
    }
    assert await route(client, namesrv, "Nope") is None

    resp = await call(client, namesrv, Frame(RequestCode.GET_BROKER_CLUSTER_INFO))
    info = decode_body(resp.body, ClusterInfo)
    assert info.cluster_addr_table == {"c1": ["broker-a"], "c2": ["broker-b"]}
    assert info.broker_addr_table["broker-b"].cluster == "c2"

    resp = await call(client, namesrv, Frame(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert decode_body(resp.body, TopicList).topics == ["T1", "T2"]


async def test_reregistration_replaces_topics_and_unregister_removes(
    namesrv: NamesrvController, client: RemotingClient
) -> None:
    await call(client, namesrv, register_frame(topics=topic_configs("T1", "T2")))
    await call(client, namesrv, register_frame(bid=1, addr="127.0.0.1:10921"))
    await call(client, namesrv, register_frame(topics=topic_configs("T2", "T3"), version=2))
    assert await route(client, namesrv, "T1") is None
    assert await perms(client, namesrv, "T3") == {"broker-a": PERM_READ_WRITE}

    unreg = Frame(RequestCode.UNREGISTER_BROKER, fields=identity())
    assert (await call(client, namesrv, unreg)).code == ResponseCode.SUCCESS
    r = await route(client, namesrv, "T2")  # the slave still serves reads
    assert r is not None and r.broker_datas[0].broker_addrs == {1: "127.0.0.1:10921"}
    unreg = Frame(RequestCode.UNREGISTER_BROKER, fields=identity(bid=1, addr="127.0.0.1:10921"))
    assert (await call(client, namesrv, unreg)).code == ResponseCode.SUCCESS
    assert await route(client, namesrv, "T2") is None
    assert namesrv.routes.broker_count == 0


async def test_wipe_and_add_write_perm(namesrv: NamesrvController, client: RemotingClient) -> None:
    topics = topic_configs("T1", "T2") | topic_configs("RO", perm=PERM_READ)
    await call(client, namesrv, register_frame(topics=topics))
    wipe = Frame(RequestCode.WIPE_WRITE_PERM_OF_BROKER, fields={"broker_name": "broker-a"})
    resp = await call(client, namesrv, wipe)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["wipe_topic_count"] == 3
    assert await perms(client, namesrv, "T1") == {"broker-a": PERM_READ}
    # the broker's next heartbeat must not make it writable again
    await call(client, namesrv, register_frame(topics=topics))
    assert await perms(client, namesrv, "T1") == {"broker-a": PERM_READ}
    add = Frame(RequestCode.ADD_WRITE_PERM_OF_BROKER, fields={"broker_name": "broker-a"})
    resp = await call(client, namesrv, add)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["add_topic_count"] == 3
    assert await perms(client, namesrv, "T1") == {"broker-a": PERM_READ_WRITE}
    assert await perms(client, namesrv, "RO") == {"broker-a": PERM_READ}
    wipe_unknown = Frame(RequestCode.WIPE_WRITE_PERM_OF_BROKER, fields={"broker_name": "nobody"})
    assert (await call(client, namesrv, wipe_unknown)).fields["wipe_topic_count"] == 0


async def test_delete_topic(namesrv: NamesrvController, client: RemotingClient) -> None:
    await call(client, namesrv, register_frame(topics=topic_configs("T1", "T2")))
    other = register_frame(name="broker-b", addr="127.0.0.1:10931", cluster="c2")
    other.body = register_frame(topics=topic_configs("T2")).body
    await call(client, namesrv, other)
    delete = Frame(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields={"topic": "T1"})
    assert (await call(client, namesrv, delete)).code == ResponseCode.SUCCESS
    assert await route(client, namesrv, "T1") is None
    delete = Frame(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields={"topic": "T2", "cluster": "c2"})
    assert (await call(client, namesrv, delete)).code == ResponseCode.SUCCESS
    assert await perms(client, namesrv, "T2") == {"broker-a": PERM_READ_WRITE}


async def test_unknown_code_and_bad_fields_get_error_responses(
    namesrv: NamesrvController, client: RemotingClient
) -> None:
    resp = await call(client, namesrv, Frame(RequestCode.SEND_MESSAGE, fields={"topic": "T"}))
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and resp.remark
    resp = await call(client, namesrv, Frame(4242))
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    bad = register_frame()
    bad.fields["broker_id"] = "zero"
    resp = await call(client, namesrv, bad)
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "broker_id" in resp.remark
    bad = register_frame()
    bad.body = b"\xc1 not msgpack"
    resp = await call(client, namesrv, bad)
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "RegisterBrokerBody" in resp.remark
    resp = await call(client, namesrv, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "topic" in resp.remark
    assert namesrv.routes.broker_count == 0
    assert (
        namesrv.metrics.registry.get_sample_value(
            "orbitmq_namesrv_requests_total",
            {"request": "UNSUPPORTED", "response": "REQUEST_CODE_NOT_SUPPORTED"},
        )
        == 2
    )


async def test_closed_registering_connection_drops_the_broker(
    namesrv: NamesrvController, client: RemotingClient
) -> None:
    broker = RemotingClient(name="broker")
    try:
        await call(broker, namesrv, register_frame(topics=topic_configs("T1")))
        # a second connection of the same broker: the newest registration's connection counts
        again = RemotingClient(name="broker-again")
        try:
            await call(again, namesrv, register_frame(topics=topic_configs("T1")))
        finally:
            await again.close()
        await eventually(lambda: namesrv.routes.broker_count == 0)
        assert await route(client, namesrv, "T1") is None
        # while an older connection closing does not drop a broker that re-registered since
        await call(broker, namesrv, register_frame(topics=topic_configs("T1")))
        third = RemotingClient(name="broker-third")
        try:
            await call(third, namesrv, register_frame(topics=topic_configs("T1")))
            await broker.close()
            await asyncio.sleep(0.1)
            assert await perms(client, namesrv, "T1") == {"broker-a": PERM_READ_WRITE}
        finally:
            await third.close()
        await eventually(lambda: namesrv.routes.broker_count == 0)
    finally:
        await broker.close()
    assert (
        namesrv.metrics.registry.get_sample_value(
            "orbitmq_namesrv_broker_removals_total", {"reason": "disconnected"}
        )
        == 2
    )


async def test_silent_broker_expires_on_the_injected_clock(client: RemotingClient) -> None:
    clock = FakeClock()
    config = NamesrvConfig(port=0, scan_not_active_broker_interval_s=0.01)
    ns = NamesrvController(config, clock=clock)
    await ns.start()
    try:
        await call(client, ns, register_frame(topics=topic_configs("T1")))
        other = register_frame(name="broker-b", addr="127.0.0.1:10931")
        other.body = register_frame(topics=topic_configs("T1")).body
        await call(client, ns, other)
        clock.now += 100
        await call(client, ns, other)  # broker-b heartbeats, broker-a stays silent
        clock.now += 30
        await eventually(lambda: ns.routes.broker_count == 1)
        assert await perms(client, ns, "T1") == {"broker-b": PERM_READ_WRITE}
        assert (
            ns.metrics.registry.get_sample_value(
                "orbitmq_namesrv_broker_removals_total", {"reason": "expired"}
            )
            == 1
        )
    finally:
        await ns.stop()


async def test_name_servers_share_nothing(client: RemotingClient) -> None:
    a = NamesrvController(NamesrvConfig(port=0))
    b = NamesrvController(NamesrvConfig(port=0))
    await a.start()
    await b.start()
    try:
        assert a.port != b.port
        await call(client, a, register_frame(topics=topic_configs("OnlyA")))
        assert await perms(client, a, "OnlyA") == {"broker-a": PERM_READ_WRITE}
        assert await route(client, b, "OnlyA") is None
        await call(client, b, register_frame(topics=topic_configs("OnlyB")))
        assert await route(client, a, "OnlyB") is None
    finally:
        await a.stop()
        await b.stop()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


async def test_metrics_endpoints_of_two_name_servers(client: RemotingClient) -> None:
    a = NamesrvController(NamesrvConfig(port=0, metrics_port=0))
    b = NamesrvController(NamesrvConfig(port=0, metrics_port=0))
    await a.start()
    await b.start()
    try:
        assert a.metrics_port and b.metrics_port and a.metrics_port != b.metrics_port
        await call(client, a, register_frame(topics=topic_configs("T1", "T2")))
        await call(client, a, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "T1"}))
        text = await asyncio.to_thread(_scrape, a.metrics_port)
        assert "orbitmq_namesrv_brokers 1.0" in text
        assert "orbitmq_namesrv_topics 2.0" in text
        assert "orbitmq_namesrv_connections 1.0" in text
        assert (
            'orbitmq_namesrv_requests_total{request="GET_ROUTEINFO_BY_TOPIC",response="SUCCESS"} 1.0'
            in text
        )
        text_b = await asyncio.to_thread(_scrape, b.metrics_port)
        assert "orbitmq_namesrv_brokers 0.0" in text_b
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_main_runs_until_signalled(client: RemotingClient, sig: signal.Signals) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "orbitmq",
        "namesrv",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--log-level",
        "WARNING",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        prefix = "orbitmq namesrv ready "
        assert line.startswith(prefix), line
        addr = line[len(prefix) :].split()[0].removeprefix("namesrv=")
        resp = await client.invoke(addr, register_frame(topics=topic_configs("T1")), timeout=3.0)
        assert resp.code == ResponseCode.SUCCESS
        resp = await client.invoke(
            addr, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "T1"}), timeout=3.0
        )
        assert resp.code == ResponseCode.SUCCESS
        proc.send_signal(sig)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
