"""A sender for partition tests, run inside a network namespace (``ip netns exec NS python -m
tests.chaos.ns_sender --broker H:P --topic T --out FILE``): raw SEND_MESSAGE frames to one
broker, each send recorded in a checker history (client ``--client``, body ``client:seq:``),
written as JSON lines to ``--out`` when SIGTERM comes. It prints ``orbitmq sender ready <pid>``
once running, so a test knows it started.

It talks to the broker it is given and nothing else: beside an old master cut off by a
partition, it shows whether that master still acknowledges anything (it must not, past its
lease).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.net.client import RemotingClient
from orbitmq.testing.checker import History, now_ms
from tests.broker.test_broker import send_frame

QUEUES = 4


async def main(broker: str, topic: str, client: str, out: Path, group: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    history = History()
    remoting = RemotingClient(connect_timeout=1.0)
    print(f"orbitmq sender ready {client}", flush=True)
    seq = 0
    while not stop.is_set():
        body = f"{client}:{seq}:".encode() + bytes(64)
        queue = seq % QUEUES
        sent = now_ms()
        try:
            resp = await remoting.invoke(broker, send_frame(topic, [body], queue), timeout=2.0)
        except MQError as exc:
            history.unknown(client, seq, topic, sent, exc)
            await asyncio.sleep(0.05)
        else:
            if resp.code == ResponseCode.SUCCESS:
                history.acked(client, seq, topic, group, resp.fields["queue_id"],
                              resp.fields["queue_offset"], sent)  # fmt: skip
            else:
                history.unknown(client, seq, topic, sent, resp.remark or str(resp.code))
                await asyncio.sleep(0.05)
        seq += 1
    await remoting.close(1.0)
    history.dump(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--client", default="ns")
    parser.add_argument("--group", default="broker-a")
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    asyncio.run(main(a.broker, a.topic, a.client, a.out, a.group))
