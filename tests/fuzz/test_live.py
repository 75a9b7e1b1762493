"""A live broker and NameServer fed random and mutated frames keep serving everyone else: each
bad connection is closed (or answered), no handler crash takes the server down, and a
well-behaved client is answered throughout. ORBITMQ_FUZZ_LIVE_CONNECTIONS sets the count."""

from __future__ import annotations

import asyncio
import os
import random

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame, encode_bytes
from orbitmq.protocol.requests import REQUESTS
from orbitmq.testing.servers import run_broker, run_namesrv
from tests.broker.test_broker import pull_frame, send_frame
from tests.fuzz.mutate import mutate

CONNECTIONS = int(os.environ.get("ORBITMQ_FUZZ_LIVE_CONNECTIONS", "150"))


def _seeds() -> tuple[bytes, ...]:
    frames = [send_frame("Fz", [b"a", b"b"]), pull_frame("Fz", 0, 0)]
    frames += [Frame(code, fields={"topic": "Fz", "group": "G"}) for code in sorted(REQUESTS)]
    return tuple(encode_bytes(f) for f in frames)


async def _abuse(port: int, payload: bytes) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(payload)
        await writer.drain()
        async with asyncio.timeout(0.5):
            while await reader.read(65536):
                pass
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


async def test_mutated_frames_leave_the_servers_serving() -> None:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    seeds = _seeds()
    async with run_namesrv() as ns, run_broker(namesrv=ns.address) as broker:
        client = RemotingClient()
        try:
            resp = await client.invoke(broker.address, send_frame("Fz", [b"ok"]), timeout=5)
            assert resp.code == ResponseCode.SUCCESS
            for round_start in range(0, CONNECTIONS, 25):
                batch = [
                    _abuse(rng.choice((ns.port, broker.port)), mutate(rng, seeds))
                    for _ in range(min(25, CONNECTIONS - round_start))
                ]
                await asyncio.gather(*batch)
                for addr in (broker.address, ns.address):
                    probe = Frame(RequestCode.GET_BROKER_CLUSTER_INFO)
                    if addr == broker.address:
                        probe = send_frame("Fz", [b"still"])
                    resp = await client.invoke(addr, probe, timeout=5)
                    assert resp.code == ResponseCode.SUCCESS, (addr, resp.remark)
            await asyncio.sleep(0.2)
            assert len(broker.server.connections) <= 2  # the abusers are gone
        finally:
            await client.close()
