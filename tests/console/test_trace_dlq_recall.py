"""DLQ and Recall trace records where people look: ``orbitmq message trace`` and the console's
trace page show a dead-lettered message (Pub -> DLQ, with the group and the DLQ topic) and a
recalled delayed message (Pub -> Recall, done, then refused)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from orbitmq.client import AsyncAdminClient, AsyncProducer, Message
from orbitmq.client.recall import recall_message
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.console.app import create_app
from orbitmq.console.config import ConsoleConfig
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests.cli.test_trace import trace_cli

pytestmark = pytest.mark.timeout(120)


async def test_cli_and_console_show_dlq_and_recall(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        config = small_broker_config(
            tmp_path / "s", namesrv_addrs=(ns.address,), trace_enable=True,
            trace_flush_interval_ms=20,
        )  # fmt: skip
        async with run_broker(config) as broker:
            producer = await AsyncProducer([ns.address]).start()
            admin = await AsyncAdminClient([ns.address]).start()
            try:
                dead = await producer.send(Message("Traced", b"bad", keys=["k-dead"]))
                frame = Frame(
                    RequestCode.CONSUMER_SEND_MSG_BACK,
                    fields={"group": "GDead", "offset": dead.offset,
                            "max_reconsume_times": 0},
                )  # fmt: skip
                resp = await admin.remoting.invoke(broker.address, frame, 5.0)
                assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True
                later = await producer.send(Message("Traced", b"later").set_delay_ms(60_000))
                await asyncio.to_thread(broker.store.wait_for_dispatch)
                await recall_message(admin, "Traced", later.msg_id, producer_group="PGR")
                with pytest.raises(MQError):
                    await recall_message(admin, "Traced", later.msg_id, producer_group="PGR")
            finally:
                await admin.close()
                await producer.close()
            await broker.trace.flush()

            def cli_rows(msg_id: str, want: str) -> str:
                out = ""
                for _ in range(50):  # the trace topic's route registers within 1 s
                    code, out = trace_cli("--msg-id", msg_id, "--namesrv", ns.address)
                    if code == 0 and want in out:
                        break
                    time.sleep(0.1)
                return out

            out = await asyncio.to_thread(cli_rows, dead.msg_id, "DLQ")
            lines = [ln for ln in out.splitlines()[1:] if ln.strip()]
            assert [ln.split()[2] for ln in lines] == ["Pub", "DLQ"], out
            assert "GDead" in lines[1] and "dead-lettered to %DLQ%GDead" in lines[1]
            out = await asyncio.to_thread(cli_rows, later.msg_id, "Recall")
            lines = [ln for ln in out.splitlines()[1:] if ln.strip()]
            assert [ln.split()[2] for ln in lines] == ["Pub", "Recall", "Recall"], out
            assert "PGR" in lines[1] and "recalled" in lines[1] and "recall failed" in lines[2]

            def page(msg_id: str) -> str:
                cfg = ConsoleConfig(
                    namesrv_addrs=(ns.address,), port=0, audit_log=str(tmp_path / "audit.jsonl")
                )
                with TestClient(create_app(cfg)) as web:
                    return web.get("/trace", params={"msg_id": msg_id}).text

            html = await asyncio.to_thread(page, dead.msg_id)
            assert re.findall(r'<tr class="trace-(\w+)">', html) == ["Pub", "DLQ"], html
            assert "%DLQ%GDead" in html and ">GDead<" in html
            html = await asyncio.to_thread(page, later.msg_id)
            assert re.findall(r'<tr class="trace-(\w+)">', html) == ["Pub", "Recall", "Recall"]
            assert "recall failed" in html
