"""``python -m tests.cli.abuser <host> <port> <seconds> <flood> [kinds]``: the abusive peers of brief
T15 against one Remoting port, from a process of their own (so that the well-behaved client
measured by the test shares neither its event loop nor its interpreter lock). Each kind of
abuse comes from its own loopback address, so that per-address limits meet only it:

- 127.0.0.3: a connection flood, ``flood`` connections opened (2,000 a second) and held;
- 127.0.0.4: 20 slowloris connections, each writing one byte of a frame every 0.5 s;
- 127.0.0.5: a producer at 10x its byte quota (8 pipelined sends of 20 kB);
- 127.0.0.6: 2 GiB and negative length prefixes, a new connection for each;
- 127.0.0.7: 1,000 pipelined requests on one connection whose answers are never read.

``kinds``: a comma-separated subset of flood, slowloris, greedy, prefix, unread (default: all).
It waits for a line on stdin (started in standby beside the server), runs for ``seconds``, and
prints one ``abuser done {json}`` line with what each abuse achieved. It imports only the
frame codec, for a fast start.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time

from orbitmq.protocol.frame import Frame, encode_bytes
from orbitmq.protocol.messages import encode_send_body

SEND_MESSAGE = 10


def frame(code: int, opaque: int, fields: dict[str, object], body: bytes) -> bytes:
    """One encoded Remoting request."""
    return encode_bytes(Frame(code, opaque=opaque, fields=dict(fields), body=body))


def send_body(payload: bytes) -> bytes:
    return bytes(encode_send_body([payload], [b""]))


async def run(
    host: str, port: int, seconds: float, flood: int, kinds: list[str] | None = None
) -> dict[str, int]:
    end = time.monotonic() + seconds
    stats = {"flood_open": 0, "flood_refused": 0, "slowloris_cut": 0, "greedy_acked": 0,
             "prefix_sent": 0, "prefix_closed": 0, "unread_sent": 0}  # fmt: skip
    held: list[asyncio.StreamWriter] = []

    async def connect(source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(host, port, local_addr=(source, 0))

    async def flooder() -> None:
        for i in range(flood):
            if time.monotonic() > end:
                return
            if i % 100 == 99:  # 2,000 a second: ten times what an address may open
                await asyncio.sleep(0.05)
            try:
                _r, w = await connect("127.0.0.3")
            except OSError:
                stats["flood_refused"] += 1
                continue
            held.append(w)
            stats["flood_open"] += 1

    async def slowloris() -> None:
        async def one() -> None:
            r, w = await connect("127.0.0.4")
            held.append(w)
            while time.monotonic() < end:
                try:
                    w.write(b"\x00")
                    await w.drain()
                except ConnectionError:
                    stats["slowloris_cut"] += 1
                    return
                if r.at_eof():
                    stats["slowloris_cut"] += 1
                    return
                await asyncio.sleep(0.5)

        await asyncio.gather(*(one() for _ in range(20)), return_exceptions=True)

    async def greedy() -> None:
        r, w = await connect("127.0.0.5")
        held.append(w)
        body = send_body(bytes(20_000))
        opaque = 0

        async def reader() -> None:
            while True:
                head = await r.readexactly(4)
                await r.readexactly(struct.unpack(">I", head)[0])
                stats["greedy_acked"] += 1

        task = asyncio.create_task(reader())
        while time.monotonic() < end:
            while opaque - stats["greedy_acked"] < 8:
                opaque += 1
                w.write(frame(SEND_MESSAGE, opaque, {"topic": "T15Greedy", "queue_id": 0}, body))
            await asyncio.sleep(0.005)
        task.cancel()

    async def prefixes() -> None:
        while time.monotonic() < end:
            for length in (2**31, 2**32 - 5):  # 2 GiB, and -5 as a signed length
                r, w = await connect("127.0.0.6")
                w.write(struct.pack(">IBBHII", length, 1, 0, SEND_MESSAGE, 1, 0))  # a prefix
                stats["prefix_sent"] += 1
                try:
                    async with asyncio.timeout(0.5):  # at once, not by a timeout (1 s)
                        if await r.read(100) == b"":
                            stats["prefix_closed"] += 1
                except (TimeoutError, ConnectionError):
                    pass
                w.close()
            await asyncio.sleep(0.05)

    async def unread() -> None:
        _r, w = await connect("127.0.0.7")
        held.append(w)
        for i in range(1000):
            w.write(frame(SEND_MESSAGE, i + 1, {"topic": "T15Unread", "queue_id": 0}, b""))
            stats["unread_sent"] += 1
        await asyncio.sleep(max(0.0, end - time.monotonic()))

    every = {"flood": flooder, "slowloris": slowloris, "greedy": greedy, "prefix": prefixes,
             "unread": unread}  # fmt: skip
    chosen = [every[k]() for k in (kinds or list(every))]
    results = await asyncio.gather(*chosen, return_exceptions=True)
    for w in held:
        w.close()
    for res in results:
        if isinstance(res, BaseException) and not isinstance(res, ConnectionError):
            print(f"abuser error {res!r}", file=sys.stderr, flush=True)
    return stats


def main() -> None:
    host, port, seconds, flood = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    kinds = sys.argv[5].split(",") if len(sys.argv) > 5 else None
    print("abuser standby", flush=True)
    sys.stdin.readline()
    stats = asyncio.run(run(host, port, seconds, flood, kinds))
    print(f"abuser done {json.dumps(stats)}", flush=True)


if __name__ == "__main__":
    main()
