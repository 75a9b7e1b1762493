"""Hot reads on the event loop (issue #15, "readers for hot data on the loop"): a pull within
``TAIL_READ`` records of a queue's end is read on the loop thread itself, with no hand-off to
the read pool; a pull further back goes to the pool (mapped pages may have to come from disk),
and both answer the same records."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.processor import TAIL_READ
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from tests.broker.test_broker import pull_frame, send_frame


async def test_tail_pulls_read_on_the_loop_and_older_ones_in_the_pool(
    broker: BrokerController, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [f"m{i:04d}".encode() for i in range(TAIL_READ * 3)]
    for at in range(0, len(bodies), 32):
        resp = await client.invoke(broker.address, send_frame("Hot", bodies[at : at + 32]))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(broker.store.wait_for_dispatch)

    pool: list[str] = []
    readers: list[str] = []
    real_read, real_get = broker.bridge.read, broker.store.get_messages

    async def counted_read(fn: Any, *args: object) -> Any:
        pool.append(getattr(fn, "__name__", "?"))
        return await real_read(fn, *args)

    def traced_get(*args: Any, **kwargs: Any) -> Any:
        readers.append(threading.current_thread().name)
        return real_get(*args, **kwargs)

    monkeypatch.setattr(broker.bridge, "read", counted_read)
    monkeypatch.setattr(broker.store, "get_messages", traced_get)
    loop_thread = threading.current_thread().name  # the broker runs on this test's loop

    tail = len(bodies) - TAIL_READ // 2
    resp = await client.invoke(broker.address, pull_frame("Hot", 0, tail, max_msg_nums=64))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert [m.body for m in decode_records(resp.body)] == bodies[tail:]
    assert pool == [] and readers == [loop_thread]  # read where it arrived: no hand-off

    old = 0  # TAIL_READ * 3 records behind the end: the read pool
    resp = await client.invoke(broker.address, pull_frame("Hot", 0, old, max_msg_nums=16))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert [m.body for m in decode_records(resp.body)] == bodies[:16]
    assert pool == ["traced_get"] and readers[1].startswith("orbitmq-store-read")
