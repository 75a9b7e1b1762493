"""The console's trace page: a message consumed by a simple (Pop) consumer on a traced broker
shows Pub -> SubBefore -> SubAfter with the group and times, linked from the messages page,
and still shows (no body needed) with bodies hidden."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from orbitmq.client import AsyncProducer, Message
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.simple import AsyncSimpleConsumer
from orbitmq.client.consumer_types import ConsumeFromWhere
from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from orbitmq.testing import run_broker, run_namesrv, small_broker_config

pytestmark = pytest.mark.timeout(120)


async def test_trace_page_shows_the_timeline(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        config = small_broker_config(
            tmp_path / "s", namesrv_addrs=(ns.address,), trace_enable=True,
            trace_flush_interval_ms=20,
        )  # fmt: skip
        async with run_broker(config) as broker:
            producer = await AsyncProducer([ns.address]).start()
            consumer = AsyncSimpleConsumer(
                [ns.address], "GPage",
                SimpleConfig(await_duration_s=0.5, consume_from_where=ConsumeFromWhere.FIRST_OFFSET),
                subscriptions={"Paged": "*"},
            )  # fmt: skip
            try:
                sent = await producer.send(Message("Paged", b"secret", keys=["k-7"]))
                await consumer.start()
                got = []
                deadline = time.monotonic() + 10
                while not got and time.monotonic() < deadline:
                    got = await consumer.receive(4, 15.0)
                assert got
                await consumer.ack(got[0])
            finally:
                await consumer.close()
                await producer.close()
            await broker.trace.flush()
            msg_id = sent.msg_id

            def run(hide: bool) -> tuple[str, str]:
                cfg = ConsoleConfig(
                    namesrv_addrs=(ns.address,), port=0, audit_log=str(tmp_path / "audit.jsonl"),
                    allow_message_bodies=not hide,
                )  # fmt: skip
                with TestClient(create_app(cfg)) as web:
                    listing = web.get("/messages", params={"topic": "Paged", "key": "k-7"}).text
                    page = ""
                    for _ in range(50):  # bounded: the trace topic's route registers within 1 s
                        page = web.get("/trace", params={"msg_id": msg_id}).text
                        if "trace-SubAfter" in page:
                            break
                        time.sleep(0.1)
                    return listing, page

            listing, page = await asyncio.to_thread(run, False)
            assert f'href="/trace?msg_id={msg_id}&amp;topic=Paged"' in listing
            assert '<td class="keys">k-7</td>' in listing  # the keys, not dict.keys
            rows = re.findall(r'<tr class="trace-(\w+)">.*?</tr>', page, re.S)
            assert rows == ["Pub", "SubBefore", "SubAfter"], page
            assert page.count(">GPage<") == 2 and "topic=Paged" in page and "keys=k-7" in page
            _, hidden = await asyncio.to_thread(run, True)
            assert "trace-SubAfter" in hidden and "secret" not in hidden
            none = await asyncio.to_thread(lambda: _missing(ns.address, tmp_path))
            assert 'id="no-trace"' in none


def _missing(namesrv: str, tmp: Path) -> str:
    cfg = ConsoleConfig(namesrv_addrs=(namesrv,), port=0, audit_log=str(tmp / "audit.jsonl"))
    with TestClient(create_app(cfg)) as web:
        return web.get("/trace", params={"msg_id": "0" * 32}).text
