"""Real NameServer and Broker processes on loopback, spoken to with the Remoting client."""

from __future__ import annotations

import asyncio

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicRouteData, decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from tests.harness import ProcessCluster

pytestmark = pytest.mark.integration


async def _route(
    client: RemotingClient, namesrv: str, topic: str, timeout: float = 10
) -> TopicRouteData:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        resp = await client.invoke(
            namesrv, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": topic})
        )
        if resp.code == ResponseCode.SUCCESS:
            return decode_body(resp.body, TopicRouteData)
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no route for {topic}: {resp.remark}")
        await asyncio.sleep(0.1)


async def test_broker_registers_with_every_namesrv(cluster: ProcessCluster) -> None:
    ns1, ns2 = cluster.namesrv(), cluster.namesrv()
    broker = cluster.broker("broker-a", [ns1.address, ns2.address])
    client = RemotingClient()
    try:
        resp = await client.invoke(
            broker.address,
            Frame(
                RequestCode.SEND_MESSAGE,
                fields={"topic": "Reg", "queue_id": 0},
                body=encode_send_body([b"x"], [b""]),
            ),
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        for ns in (ns1, ns2):
            route = await _route(client, ns.address, "Reg")
            assert route.broker_datas[0].broker_addrs[0] == broker.address
        # A clean stop unregisters: the route goes away.
        broker.stop()
        for ns in (ns1, ns2):
            for _ in range(50):
                resp = await client.invoke(
                    ns.address, Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "Reg"})
                )
                if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                    break
                await asyncio.sleep(0.1)
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        await client.close()
