"""Advertised listeners: the configured ``advertised_host``/``advertised_port`` are what Metadata
(brokers) and FindCoordinator (the group's node) answer, in old and flexible versions, and a real
client that bootstraps through the listen address then works through the advertised one.

The gateway listens on 127.0.0.1:<free port> and advertises 127.0.0.2:<another port>, where a
forwarder of this test relays to it and records the API key of every request it relays: the
client's Produce, JoinGroup (sent to the node FindCoordinator named), OffsetCommit and Fetch
must pass there, which they can only do if the client took the advertised address (the gateway itself
does not listen on 127.0.0.2). Without advertised settings the listen address and bound port
are answered."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time

import pytest

from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from tests.kafka.conftest import Stack
from tests.kafka.raw import RawClient

confluent = pytest.importorskip("confluent_kafka")

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, JOIN_GROUP, OFFSET_COMMIT = 0, 1, 3, 10, 11, 8
ADVERTISED_HOST = "127.0.0.2"


class Forwarder:
    """Relays connections on ADVERTISED_HOST to the gateway; notes each request's API key."""

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.connections = 0
        self.target = ("127.0.0.1", 0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, ADVERTISED_HOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_r, up_w = await asyncio.open_connection(*self.target)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        back = asyncio.ensure_future(self._pipe(up_r, writer))
        try:
            while True:  # client -> gateway, frame by frame
                head = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", head)[0])
                self.keys.add(struct.unpack(">h", frame[:2])[0])
                up_w.write(head + frame)
                await up_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            back.cancel()
            up_w.close()
            writer.close()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _answers(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of every node in Metadata v1/v8/v12 and FindCoordinator v1/v3/v4."""
    c = RawClient(bootstrap)
    try:
        nodes = []
        for v in (1, 8, 12):
            body = {"topics": [{"name": "adv"}], "allow_auto_topic_creation": True,
                    "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False}  # fmt: skip
            out = c.call(METADATA, v, body)
            assert out["topics"][0]["error_code"] == 0, out
            nodes += [(b["host"], b["port"]) for b in out["brokers"]]
            assert {p["leader_id"] for p in out["topics"][0]["partitions"]} == {
                b["node_id"] for b in out["brokers"]
            }
        for v in (1, 3):
            out = c.call(FIND_COORDINATOR, v, {"key": "adv-group", "key_type": 0})
            assert out["error_code"] == 0, out
            nodes.append((out["host"], out["port"]))
        out = c.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["adv-group"]})
        nodes += [(k["host"], k["port"]) for k in out["coordinators"]]
        assert len(nodes) == 6, nodes
        return nodes
    finally:
        c.close()


def _round_trip(bootstrap: str) -> list[bytes]:
    """Produce 3 records and read them in a group, bootstrapping through ``bootstrap`` only."""
    p = confluent.Producer({"bootstrap.servers": bootstrap, "client.id": "adv"})
    for i in range(3):
        p.produce("adv", value=b"r%d" % i, partition=0)
    assert p.flush(30) == 0
    c = confluent.Consumer({"bootstrap.servers": bootstrap, "group.id": "adv-group",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "session.timeout.ms": 6000})  # fmt: skip
    try:
        c.subscribe(["adv"])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None and m.partition() == 0:
                got.append(m.value())
                c.commit(message=m, asynchronous=False)
        return got
    finally:
        c.close()


async def test_metadata_and_coordinator_answer_the_listen_address_by_default(stack: Stack) -> None:
    port = stack.gateway.port
    nodes = await asyncio.to_thread(_answers, stack.bootstrap)
    assert set(nodes) == {("127.0.0.1", port)}


async def test_clients_are_sent_to_the_advertised_address(stack: Stack) -> None:
    fwd = Forwarder()
    fwd_port = await fwd.start()
    cfg = KafkaConfig(namesrv_addrs=(stack.namesrv,), port=0, advertised_host=ADVERTISED_HOST,
                      advertised_port=fwd_port, default_partitions=2)  # fmt: skip
    gw = KafkaGateway(cfg)
    await gw.start()
    try:
        fwd.target = ("127.0.0.1", gw.port)
        bootstrap = f"127.0.0.1:{gw.port}"
        nodes = await asyncio.to_thread(_answers, bootstrap)
        assert set(nodes) == {(ADVERTISED_HOST, fwd_port)}
        assert fwd.connections == 0  # raw requests only: nothing went to the advertised address
        got = await asyncio.to_thread(_round_trip, bootstrap)
        assert got == [b"r0", b"r1", b"r2"]
        assert fwd.connections > 0
        # data, group and commit requests reached the gateway only through the advertised address
        assert {PRODUCE, FETCH, JOIN_GROUP, OFFSET_COMMIT} <= fwd.keys, sorted(fwd.keys)
    finally:
        await gw.stop()
        await fwd.stop()
