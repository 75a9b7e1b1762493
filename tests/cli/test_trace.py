"""``orbitmq message trace``: a message sent with the native SDK and consumed by a simple
(Pop) consumer shows Pub -> SubBefore -> SubAfter with the group and times, read from the
trace records the broker wrote (trace_enable)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path

from typer.testing import CliRunner

from orbitmq.cli.main import app
from orbitmq.client import AsyncProducer, Message
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.simple import AsyncSimpleConsumer
from orbitmq.client.consumer_types import ConsumeFromWhere
from orbitmq.testing import run_broker, run_namesrv, small_broker_config


def trace_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["message", "trace", *args], env={"COLUMNS": "250"})
    return result.exit_code, result.output


async def test_trace_of_a_native_sdk_message(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        config = small_broker_config(
            tmp_path / "s", namesrv_addrs=(ns.address,), trace_enable=True,
            trace_flush_interval_ms=20,
        )  # fmt: skip
        async with run_broker(config) as broker:
            producer = AsyncProducer([ns.address])
            consumer = AsyncSimpleConsumer(
                [ns.address], "GTrace",
                SimpleConfig(await_duration_s=0.5, consume_from_where=ConsumeFromWhere.FIRST_OFFSET),
                subscriptions={"Traced": "*"},
            )  # fmt: skip
            await producer.start()
            try:
                sent = await producer.send(Message("Traced", b"body", keys=["order-9"]))
                await consumer.start()
                deadline = time.monotonic() + 10
                got = []
                while not got and time.monotonic() < deadline:
                    got = await consumer.receive(4, 15.0)
                assert [m.message.msg_id for m in got] == [sent.msg_id]
                await consumer.ack(got[0])
            finally:
                await consumer.close()
                await producer.close()
            await broker.trace.flush()
            args = ("--msg-id", sent.msg_id, "--topic", "Traced", "--namesrv", ns.address)
            deadline = time.monotonic() + 10
            code, output = 1, ""
            while time.monotonic() < deadline:  # the trace topic's route registers within 1 s
                code, output = await asyncio.to_thread(trace_cli, *args)
                if code == 0 and "SubAfter" in output:
                    break
                await asyncio.sleep(0.2)
            assert code == 0, output
            rows = [line.split() for line in output.splitlines()[1:] if line.strip()]
            types = [next(w for w in row if w in ("Pub", "SubBefore", "SubAfter")) for row in rows]
            assert types == ["Pub", "SubBefore", "SubAfter"], output
            assert "GTrace" in rows[1] and "GTrace" in rows[2] and "topic=Traced" in output
            times = [datetime.fromisoformat(f"{row[0]} {row[1]}") for row in rows]  # the times
            assert times == sorted(times) and times[0].year >= 2024, output
            assert "keys=order-9" in output
            code, output = await asyncio.to_thread(trace_cli, "--msg-id", "0" * 32,
                                                   "--namesrv", ns.address)  # fmt: skip
            assert code == 1 and "no trace" in output
