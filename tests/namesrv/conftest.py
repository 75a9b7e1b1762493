"""Shared NameServer test helpers: request builders and an in-process NameServer on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import PERM_READ_WRITE, RegisterBrokerBody, TopicConfig, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def topic_configs(*names: str, perm: int = PERM_READ_WRITE, queues: int = 4) -> dict[str, Any]:
    return {
        n: TopicConfig(topic_name=n, read_queue_nums=queues, write_queue_nums=queues, perm=perm)
        for n in names
    }


def identity(
    name: str = "broker-a", bid: int = 0, addr: str = "127.0.0.1:10911", cluster: str = "c1"
) -> dict[str, Any]:
    return {"cluster": cluster, "broker_name": name, "broker_id": bid, "broker_addr": addr}


def register_frame(
    name: str = "broker-a",
    bid: int = 0,
    addr: str = "127.0.0.1:10911",
    topics: dict[str, TopicConfig] | None = None,
    cluster: str = "c1",
    version: int = 0,
) -> Frame:
    body = RegisterBrokerBody(topic_configs=topics or {}, data_version=version)
    return Frame(
        RequestCode.REGISTER_BROKER,
        fields=identity(name, bid, addr, cluster),
        body=encode_body(body),
    )


@pytest.fixture
async def namesrv() -> AsyncIterator[NamesrvController]:
    controller = NamesrvController(NamesrvConfig(host="127.0.0.1", port=0))
    await controller.start()
    try:
        yield controller
    finally:
        await controller.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    c = RemotingClient(name="test-client")
    try:
        yield c
    finally:
        await c.close()
