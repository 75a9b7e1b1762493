"""The broker under a failing store service (issue #14): sends are refused with
SERVICE_NOT_AVAILABLE while the dispatcher cannot make them visible, runtime info (the
``health`` column of ``orbitmq cluster list``) says what is degraded, and it all recovers by
itself."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.common.files import WriteOps, set_write_ops
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig, encode_body
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


async def test_config_file_write_fault_is_an_error_answer_not_a_dead_broker(
    broker: BrokerController, client: RemotingClient
) -> None:
    """ENOSPC writing topics.json (write_atomically's seam): the request fails with an error
    code, the broker goes on serving, and the next write works once the fault clears."""

    class Full(WriteOps):
        def write_file(self, path: Path, fd: int, data: bytes | bytearray | memoryview) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    previous = set_write_ops(Full())
    try:
        cfg = TopicConfig(topic_name="Full", read_queue_nums=2, write_queue_nums=2)
        resp = await client.invoke(
            broker.address, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
        )
        assert resp.code != ResponseCode.SUCCESS
    finally:
        set_write_ops(previous)
    resp = await client.invoke(broker.address, send_frame("H", [b"still serving"]))
    assert resp.code == ResponseCode.SUCCESS
    cfg = TopicConfig(topic_name="Later", read_queue_nums=2, write_queue_nums=2)
    resp = await client.invoke(
        broker.address, Frame(RequestCode.UPDATE_AND_CREATE_TOPIC, body=encode_body(cfg))
    )
    assert resp.code == ResponseCode.SUCCESS
