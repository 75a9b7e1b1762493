"""Fixtures for the proxy tests: an in-process cluster plus a ProxyServer, and our own stubs.

The cluster (NameServer, broker(s), proxy) runs on a loop thread of its own, shared by a test
module; async tests talk to it over sockets from their own loops. The stubs are OrbitMQ's
generated ``apache.rocketmq.v2`` modules: the official client registers the same symbols under
other file names, so it is never imported here (tests/compat runs it in subprocesses).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.client import AsyncAdminClient
from orbitmq.client._loop_thread import LoopThread
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.proxy.config import ProxyConfig
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from orbitmq.proxy.server import ProxyServer
from orbitmq.testing import small_broker_config as broker_config


@dataclass
class ProxyEnv:
    thread: LoopThread
    namesrv: NamesrvController
    brokers: list[BrokerController]
    proxy: ProxyServer

    @property
    def ns(self) -> str:
        return self.namesrv.address

    @property
    def endpoint(self) -> str:
        return self.proxy.address

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the cluster's loop (to reach server-side objects safely)."""
        return self.thread.run(coro, timeout=timeout)


async def _wait_routes(admin: AsyncAdminClient, topics: Mapping[str, str], want: int) -> None:
    deadline = time.monotonic() + 20
    for topic in topics:
        while True:
            try:
                if len(await admin.queues(topic)) >= want:
                    break
            except Exception:  # noqa: BLE001 - not registered yet
                pass
            assert time.monotonic() < deadline, f"route of {topic} incomplete"
            await asyncio.sleep(0.05)


async def _start(
    base: Path,
    thread: LoopThread,
    topics: Mapping[str, str],
    brokers: tuple[str, ...],
    queues: int,
    proxy_options: Mapping[str, Any],
    broker_options: Mapping[str, Any],
) -> ProxyEnv:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    started: list[BrokerController] = []
    try:
        for name in brokers:
            b = BrokerController(
                broker_config(
                    base / name,
                    broker_name=name,
                    namesrv_addrs=(ns.address,),
                    default_queue_nums=queues,
                    **broker_options,
                )
            )
            await b.start()
            started.append(b)
        async with AsyncAdminClient([ns.address]) as admin:
            for topic, kind in topics.items():
                await admin.create_topic(
                    topic, read_queue_nums=queues, write_queue_nums=queues, message_type=kind
                )
            await _wait_routes(admin, topics, queues * len(brokers))
        config = ProxyConfig(namesrv_addrs=(ns.address,), port=0, **proxy_options)
        proxy = await ProxyServer(config).start()
    except BaseException:
        for b in started:
            await b.stop()
        await ns.stop()
        raise
    return ProxyEnv(thread, ns, started, proxy)


async def _stop(env: ProxyEnv) -> None:
    try:
        await env.proxy.stop(0)
    finally:
        for b in env.brokers:
            await b.stop()
        await env.namesrv.stop()


def proxy_env_fixture(
    topics: Mapping[str, str],
    *,
    brokers: tuple[str, ...] = ("broker-a",),
    queues: int = 2,
    proxy_options: Mapping[str, Any] | None = None,
    broker_options: Mapping[str, Any] | None = None,
) -> Callable[..., Iterator[ProxyEnv]]:
    """A module-scoped fixture: cluster + proxy with ``topics`` (name -> message type) created."""

    @pytest.fixture(scope="module")
    def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyEnv]:
        thread = LoopThread("proxy-test", asyncio.new_event_loop)
        try:
            started = thread.run(
                _start(
                    tmp_path_factory.mktemp("proxy"),
                    thread,
                    topics,
                    brokers,
                    queues,
                    proxy_options or {},
                    broker_options or {},
                ),
                timeout=60,
            )
            try:
                yield started
            finally:
                thread.run(_stop(started), timeout=30)
        finally:
            thread.stop()

    return env


@pytest.fixture
async def stub(env: ProxyEnv) -> AsyncIterator[service_pb2_grpc.MessagingServiceStub]:
    """A stub over a fresh grpc.aio channel to the module's proxy."""
    async with grpc.aio.insecure_channel(env.endpoint) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


def sign(secret_key: str, date_time: str) -> str:
    """The signature as the brief specifies it (independent of orbitmq.proxy.auth)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def metadata(
    client_id: str = "test-client",
    *,
    ak: str | None = None,
    sk: str | None = None,
    date_time: str | None = None,
) -> list[tuple[str, str]]:
    """The headers an official client sends; signed with ``ak``/``sk`` when given (an empty
    credential, as clients without one send, otherwise)."""
    stamp = date_time or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    headers = [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-date-time", stamp),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", client_id),
        ("x-mq-namespace", ""),
    ]
    signature = sign(sk or "", stamp)
    headers.append(
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={ak or ''}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        )
    )
    return headers


def endpoints_pb(endpoint: str) -> pb.Endpoints:
    host, _, port = endpoint.rpartition(":")
    return pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
    )


def res(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)
