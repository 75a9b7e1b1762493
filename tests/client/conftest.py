from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from orbitmq.client import AsyncAdminClient, AsyncProducer
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.producer.config import ProducerConfig
from tests.client.fakes import FakeBroker, FakeNamesrv


def dead_addr() -> str:
    """A loopback address nobody listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@dataclass
class FakeCluster:
    namesrv: FakeNamesrv
    brokers: list[FakeBroker]

    @property
    def a(self) -> FakeBroker:
        return self.brokers[0]

    @property
    def b(self) -> FakeBroker:
        return self.brokers[1]

    def reregister(self) -> None:
        self.namesrv.register(self.brokers)


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    """One fake NameServer, brokers broker-a and broker-b, topic T with 4 queues on each."""
    brokers = [await FakeBroker("broker-a").start(), await FakeBroker("broker-b").start()]
    namesrv = await FakeNamesrv().start()
    try:
        for b in brokers:
            b.add_topic("T", 4)
        namesrv.register(brokers)
        yield FakeCluster(namesrv, brokers)
    finally:
        for b in brokers:
            await b.stop()
        await namesrv.stop()


MakeProducer = Callable[..., Awaitable[AsyncProducer]]


@pytest.fixture
async def make_producer(cluster: FakeCluster) -> AsyncIterator[MakeProducer]:
    """Started AsyncProducers on the cluster (or given addresses); closed at the end."""
    made: list[AsyncProducer] = []

    async def make(namesrv_addrs: list[str] | None = None, **opts: Any) -> AsyncProducer:
        opts.setdefault("send_timeout_s", 2.0)
        opts.setdefault("namesrv_timeout_s", 1.0)
        p = AsyncProducer(namesrv_addrs or [cluster.namesrv.addr], ProducerConfig(**opts))
        made.append(p)
        return await p.start()

    yield make
    for p in made:
        await p.close()


@pytest.fixture
async def admin(cluster: FakeCluster) -> AsyncIterator[AsyncAdminClient]:
    async with AsyncAdminClient([cluster.namesrv.addr], AdminConfig(timeout_s=2.0)) as client:
        yield client
