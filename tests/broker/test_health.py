"""The broker under a failing store service (issue #14): sends are refused with
SERVICE_NOT_AVAILABLE while the dispatcher cannot make them visible, runtime info (the
``health`` column of ``orbitmq cluster list``) says what is degraded, and it all recovers by
itself."""

from __future__ import annotations

import asyncio
from typing import Any

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from tests.broker.test_broker import pull_frame, send_frame


async def runtime_health(broker: BrokerController, client: RemotingClient) -> str:
    resp = await client.invoke(broker.address, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert resp.code == ResponseCode.SUCCESS
    return str(resp.fields["health"])


async def test_sends_refused_while_dispatch_fails_then_served(
    broker: BrokerController, client: RemotingClient
) -> None:
    resp = await client.invoke(broker.address, send_frame("H", [b"a"]))
    assert resp.code == ResponseCode.SUCCESS
    acked = 1
    assert await runtime_health(broker, client) == "ok"
    dispatcher = broker.store.dispatcher
    real = dispatcher.dispatch_until

    def broken(end: int) -> Any:
        raise RuntimeError("injected")

    dispatcher.dispatch_until = broken  # type: ignore[method-assign]  # fault injection
    try:
        for _ in range(200):
            if dispatcher.failure is not None:
                break
            resp = await client.invoke(broker.address, send_frame("H", [b"racing"]))
            acked += resp.code == ResponseCode.SUCCESS  # taken before the failure showed
            await asyncio.sleep(0.02)
        assert dispatcher.failure is not None
        for _ in range(5):
            resp = await client.invoke(broker.address, send_frame("H", [b"refused"]))
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
            assert "dispatcher" in (resp.remark or "")
        health = await runtime_health(broker, client)
        assert health.startswith("dispatcher: RuntimeError: injected"), health
    finally:
        dispatcher.dispatch_until = real  # type: ignore[method-assign]
    for _ in range(500):
        if await runtime_health(broker, client) == "ok":
            break
        await asyncio.sleep(0.02)
    assert await runtime_health(broker, client) == "ok"
    resp = await client.invoke(broker.address, send_frame("H", [b"after"]))
    assert resp.code == ResponseCode.SUCCESS
    acked += 1
    assert broker.store.wait_for_dispatch()
    resp = await client.invoke(broker.address, pull_frame("H", 0, 0))
    assert resp.code == ResponseCode.SUCCESS
    # every acknowledged send is readable: nothing went into a black hole
    assert int(resp.fields["next_begin_offset"]) == broker.store.max_offset("H", 0) == acked
