"""TLS against plaintext for real clients: produce and consume through a NameServer and a broker.

Part of ``python -m orbitmq.bench security``. One in-process NameServer and broker (ASYNC_FLUSH,
a temporary store), both listening in permissive TLS mode with a self-signed certificate for
the TLS run and plaintext for the other; the broker registers in plaintext either way (not
measured). With TLS, every client connection (admin, producer, consumer) is TLS 1.3, and the
admin requests (creating the topic) need it (``admin_transport`` auto).

- **produce**: ``count`` 1 KiB messages in ``send_batch`` calls of 32, 8 calls in flight, over
  4 queues;
- **consume**: a new lite-pull consumer group reads them all back from the first offset.

Each figure is messages per second of that phase alone. The issue's target: TLS >= 70 % of
plaintext. Figures for docs/benchmarks.md are measured on an idle machine; a small count only
checks that it runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from orbitmq.auth.model import PolicyEntry, UserType
from orbitmq.auth.store import AuthStore
from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController
from orbitmq.client import AsyncAdminClient
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.consumer.config import LitePullConfig
from orbitmq.client.consumer.lite_pull import AsyncLitePullConsumer
from orbitmq.client.consumer_types import ConsumeFromWhere
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.producer import AsyncProducer
from orbitmq.common.message import Message
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.net.tls import client_context
from orbitmq.proxy.tls import self_signed
from orbitmq.store.config import FlushDiskType, StoreConfig

BODY = 1024
BATCH = 32
IN_FLIGHT = 8
QUEUES = 4
TOPIC = "BenchTls"
ADMIN_USER = ("bench-admin", "bench-admin-secret")
PRODUCER_USER = ("bench-producer", "bench-producer-secret")
DEADLINE_S = 300.0


async def _wait_route(admin: AsyncAdminClient) -> None:
    deadline = time.monotonic() + 30
    while len(await admin.queues(TOPIC)) < QUEUES:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{TOPIC} has no route")
        await asyncio.sleep(0.05)


async def _produce(
    namesrv: str, count: int, ctx: object, creds: dict[str, object]
) -> tuple[float, float]:
    """(messages per second, this process's CPU seconds per message) of the timed sends."""
    body = os.urandom(BODY)
    batch = [Message(TOPIC, body) for _ in range(BATCH)]
    config = ProducerConfig(compress_over_bytes=-1, **creds)  # type: ignore[arg-type]
    async with AsyncProducer(namesrv, config, ssl_context=ctx) as producer:  # type: ignore[arg-type]
        await producer.send_batch(batch)  # routes and connections made before the clock
        slots = asyncio.Semaphore(IN_FLIGHT)
        sent = 0

        async def one() -> None:
            nonlocal sent
            try:
                await producer.send_batch(batch)
                sent += BATCH
            finally:
                slots.release()

        start, cpu = time.perf_counter(), time.process_time()
        tasks = []
        for _ in range(max(1, count // BATCH)):
            await slots.acquire()
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
        return sent / (time.perf_counter() - start), (time.process_time() - cpu) / sent


async def _consume(namesrv: str, want: int, ctx: object) -> float:
    consumer = AsyncLitePullConsumer(
        namesrv,
        f"bench-tls-{os.getpid()}-{time.monotonic_ns()}",
        LitePullConfig(
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET, pull_batch_size=64, poll_max=256
        ),
        ssl_context=ctx,  # type: ignore[arg-type]
    )
    consumer.subscribe(TOPIC, "*")
    got = 0
    start: float | None = None
    deadline = time.monotonic() + DEADLINE_S
    async with consumer:
        while got < want and time.monotonic() < deadline:
            msgs = await consumer.poll(timeout_s=0.5)
            if msgs and start is None:
                start = time.perf_counter() - 1e-9
            got += len(msgs)
    if got < want or start is None:
        raise TimeoutError(f"consumed {got} of {want} messages")
    return got / (time.perf_counter() - start)


def _auth_file(folder: Path) -> Path:
    """Users for the ACL run: a super user for the admin client, and the producer's normal
    user, whose requests go through the policy match (Pub on the bench topic)."""
    path = folder / "auth.json"
    store = AuthStore(path)
    store.create_user(*ADMIN_USER, UserType.SUPER)
    store.create_user(*PRODUCER_USER)
    store.put_entries(
        PRODUCER_USER[0], [PolicyEntry.make(f"Topic:{TOPIC}", ["Pub"], "Allow")], create=True
    )
    return path


async def produce_consume(
    folder: Path,
    count: int,
    tls: bool,
    *,
    acl: bool = False,
    mtls: bool = False,
    consume: bool = True,
    cpu: list[float] | None = None,
) -> tuple[float, float]:
    """(produce msg/s, consume msg/s) with TLS on every client connection, or none. ``acl``:
    the broker authenticates (RocketMQ's v1 signature) and authorizes every request, and the
    clients sign theirs; with ``mtls`` too (needs ``tls``) the producer signs nothing: its
    verified client certificate names its user, so each request pays the ACL check alone.
    ``consume`` False: produce only (consume msg/s 0). ``cpu``: gets
    this process's CPU seconds per produced message appended (client and broker share the
    process, so this counts both sides' work and, unlike msg/s, little of other load)."""
    folder.mkdir(parents=True, exist_ok=True)
    listener: dict[str, str] = {}
    auth: dict[str, object] = {}
    admin_config: AdminConfig | None = None
    producer_creds: dict[str, object] = {}
    if acl:
        auth = {"auth_enabled": True, "auth_file": str(_auth_file(folder))}
        admin_config = AdminConfig(access_key=ADMIN_USER[0], secret_key=ADMIN_USER[1])
        producer_creds = {
            "access_key": PRODUCER_USER[0],
            "secret_key": PRODUCER_USER[1],
            "signature_version": 1,
        }
    ctx = producer_ctx = None
    broker_tls: dict[str, object] = {}
    if mtls and not (tls and acl):
        raise ValueError("mtls needs tls and acl")
    if tls:
        ident = self_signed(["localhost", "127.0.0.1"])
        cert = folder / "server.pem"
        cert.write_bytes(ident.cert_pem + ident.key_pem)
        listener = {"tls_mode": "permissive", "tls_cert_file": str(cert)}
        ctx = producer_ctx = client_context(ca_file=str(cert))
    if mtls:
        # the producer's certificate names its user (first DNS name) and is its own CA
        mine = self_signed([PRODUCER_USER[0]])
        pem = folder / "producer.pem"
        pem.write_bytes(mine.cert_pem + mine.key_pem)
        ca = folder / "clients-ca.pem"
        ca.write_bytes(mine.cert_pem)
        # client certificates need the broker's required mode (a plaintext client would bypass
        # them); the NameServer stays permissive, so the broker still registers in plaintext
        broker_tls = {"tls_mode": "required", "tls_ca_file": str(ca), "tls_client_auth": "optional"}
        producer_ctx = client_context(ca_file=str(cert), cert_file=str(pem), key_file=str(pem))
        producer_creds = {}
    namesrv = NamesrvController(NamesrvConfig(port=0, **listener))  # type: ignore[arg-type]
    await namesrv.start()
    broker: BrokerController | None = None
    try:
        store = StoreConfig(
            store_path=folder / "store",
            flush_disk_type=FlushDiskType.ASYNC_FLUSH,
            mapped_file_size_commit_log=64 * 1024 * 1024,
        )
        broker = BrokerController(
            BrokerConfig(
                port=0,
                namesrv_addrs=(namesrv.address,),
                register_interval_s=0.5,
                store=store,
                **(listener | broker_tls),  # type: ignore[arg-type]
                **auth,  # type: ignore[arg-type]
            )
        )
        await broker.start()
        async with AsyncAdminClient([namesrv.address], admin_config, ssl_context=ctx) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            await _wait_route(admin)
        produced, cpu_per_msg = await _produce(namesrv.address, count, producer_ctx, producer_creds)
        if cpu is not None:
            cpu.append(cpu_per_msg)
        if not consume:
            return produced, 0.0
        total = max(1, count // BATCH) * BATCH + BATCH  # the warm-up batch too
        consumed = await _consume(namesrv.address, total, ctx)
        return produced, consumed
    finally:
        if broker is not None:
            await broker.stop()
        await namesrv.stop()
