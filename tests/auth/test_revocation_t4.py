"""Brief T4: revoke a user with 100 clients connected: every one is refused within 1 s.

100 Remoting connections to the broker, each signing as alice and sending a small message every
50 ms (each has been served before the revocation). The revocation is committed through the
NameServer (``user update --status disable``, then, after re-enabling, ``acl delete`` of her
only topic grant); for every client the time from just before the revoking request was sent
(so the figure includes its round trip: an upper bound) to the arrival of its first refusal is
measured, and the maximum printed and checked against 1 s. The servers re-read the auth store
at most every 0.25 s; a disabled user's refusal is also delayed 0.1 s (``ServerAuth.penalize``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from orbitmq.auth.store import AuthStore
from orbitmq.client import AdminConfig, AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.grpc_v2 import service_pb2_grpc
from tests.auth.conftest import SECRETS, Cluster
from tests.auth.test_servers import send, signer
from tests.proxy.conftest import endpoints_pb, res
from tests.proxy.test_authz import Env, auth
from tests.proxy.test_authz import env as env  # the fixture: a proxy with ACL on

CLIENTS = 100
INTERVAL_S = 0.05
BOUND_S = 1.0


Call = Callable[[], Awaitable[int]]
"""One request of one client: its answer code (0: served)."""


async def _client(call: Call, served: asyncio.Event, refused_at: list[float], stop: float) -> None:
    """Call every INTERVAL_S until the first refusal (its arrival time appended) or ``stop``."""
    while time.monotonic() < stop:
        code = await call()
        now = time.monotonic()
        if code != 0:
            assert served.is_set(), f"refused before the revocation: {code}"
            refused_at.append(now)
            return
        served.set()
        await asyncio.sleep(INTERVAL_S)


async def _revoke_and_measure(
    clients: list[Call], revoke: Callable[[], Awaitable[None]], what: str
) -> float:
    served = [asyncio.Event() for _ in clients]
    refused: list[list[float]] = [[] for _ in clients]
    stop = time.monotonic() + 30  # bounded; the assertion below is the real limit
    tasks = [
        asyncio.create_task(_client(call, ev, out, stop))
        for call, ev, out in zip(clients, served, refused, strict=True)
    ]
    waits: list[asyncio.Future[object]] = []
    try:
        async with asyncio.timeout(15):  # every client served once (a failed one raises)
            waits = [asyncio.ensure_future(ev.wait()) for ev in served]
            await asyncio.wait([asyncio.gather(*waits), *tasks], return_when="FIRST_COMPLETED")
        for t in tasks:
            if t.done():
                t.result()  # raises why a client stopped before the revocation
        assert all(ev.is_set() for ev in served)
        started = time.monotonic()
        await revoke()
        committed = time.monotonic()
        async with asyncio.timeout(started + 5 - time.monotonic()):
            await asyncio.gather(*tasks)
    finally:
        for t in [*tasks, *waits]:
            t.cancel()
    delays = sorted(out[0] - started for out in refused if out)
    assert len(delays) == len(clients), f"{len(clients) - len(delays)} clients never refused"
    print(
        f"T4 {what}: {len(delays)} clients refused; max {delays[-1]:.3f} s, median "
        f"{delays[len(delays) // 2]:.3f} s after the revoking request was sent "
        f"(it was answered after {committed - started:.3f} s)"
    )
    assert delays[-1] < BOUND_S, f"a client was served {delays[-1]:.3f} s after {what}"
    return delays[-1]


def _sender(addr: str, rc: RemotingClient) -> Call:
    async def call() -> int:
        code = (await rc.invoke(addr, send("orders"), 5.0)).code
        return 0 if code == ResponseCode.SUCCESS else int(code)

    return call


async def test_revoking_a_user_refuses_100_connected_clients_within_a_second(
    cluster: Cluster,
) -> None:
    b = cluster.broker.address
    clients = [RemotingClient(signer=signer("alice")) for _ in range(CLIENTS)]
    admin = AsyncAdminClient(
        cluster.namesrv.address, AdminConfig(access_key="admin", secret_key=SECRETS["admin"])
    )
    try:
        async with admin:

            async def disable() -> None:
                await admin.update_user("alice", user_status="disable")

            async def delete_grant() -> None:
                await admin.delete_acl("User:alice", ["Topic:orders"])

            calls = [_sender(b, rc) for rc in clients]
            await _revoke_and_measure(calls, disable, "Remoting, disabling the user")
            await admin.update_user("alice", user_status="enable")
            deadline = time.monotonic() + 5  # bounded: the servers see it within 0.25 s
            while (await clients[0].invoke(b, send("orders"), 5.0)).code != ResponseCode.SUCCESS:
                assert time.monotonic() < deadline, "re-enabled alice is still refused"
                await asyncio.sleep(0.05)
            await _revoke_and_measure(calls, delete_grant, "Remoting, deleting her ACL entry")
    finally:
        await asyncio.gather(*(rc.close() for rc in clients))


async def test_revoking_a_user_refuses_100_grpc_clients_of_the_proxy_within_a_second(
    env: Env, tmp_path: Path
) -> None:
    """The same through the gRPC proxy: 100 channels (connections) of alice, each querying a
    route every 50 ms; the revocation is committed by writing the auth file (its atomic
    replace is the commit), measured from just before that write."""
    own = [("grpc.use_local_subchannel_pool", 1)]  # else channels share one connection
    channels = [grpc.aio.insecure_channel(env.proxy.address, options=own) for _ in range(CLIENTS)]
    request = svc.QueryRouteRequest(topic=res("orders"), endpoints=endpoints_pb(env.proxy.address))
    metadata = auth("alice")

    def route(channel: grpc.aio.Channel) -> Call:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        async def call() -> int:
            resp = await stub.QueryRoute(request, metadata=metadata, timeout=5)
            return 0 if resp.status.code == 20000 else int(resp.status.code)

        return call

    async def disable() -> None:
        await asyncio.to_thread(
            AuthStore(tmp_path / "auth.json").update_user, "alice", enabled=False
        )

    try:
        async with asyncio.timeout(15):
            await asyncio.gather(*(c.channel_ready() for c in channels))
        port = int(env.proxy.address.rsplit(":", 1)[1])
        assert _established_to(port) >= CLIENTS, "the channels do not have a connection each"
        await _revoke_and_measure([route(c) for c in channels], disable, "gRPC proxy, disabling")
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def _established_to(port: int) -> int:
    """ESTABLISHED TCP connections (of this host) whose remote port is ``port``."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "01" and int(cols[2].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count
