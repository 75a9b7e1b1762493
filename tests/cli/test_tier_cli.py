"""``orbitmq tier status`` and the local/tier ranges of ``orbitmq topic describe``, against an
in-process NameServer and a broker whose tier is a directory."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from typer.testing import CliRunner, Result

from orbitmq.cli.main import app
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.testing import run_broker, run_namesrv, small_broker_config
from tests.broker.test_broker import send_frame


def cli(namesrv: str, *args: str) -> Result:
    result = CliRunner().invoke(app, list(args), env={"ORBITMQ_NAMESRV": namesrv, "COLUMNS": "250"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, (args, result.output)
    return result


async def test_tier_status_and_topic_ranges(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        config = small_broker_config(
            tmp_path / "store",
            namesrv_addrs=(ns.address,),
            store={
                "tier_backend": "directory",
                "tier_path": str(tmp_path / "tier"),
                "tier_upload_interval_ms": 3_600_000,
            },
        )
        async with run_broker(config) as broker:
            client = RemotingClient()
            try:
                for q in range(2):
                    resp = await client.invoke(
                        broker.address, send_frame("Tiered", [b"x" * 10] * 5, queue_id=q)
                    )
                    assert resp.code == ResponseCode.SUCCESS
            finally:
                await client.close()
            store = broker.store
            assert store.tier is not None
            await asyncio.to_thread(store.wait_for_dispatch)
            await asyncio.to_thread(store.commit_log.flush)
            await asyncio.to_thread(store.tier.run_once)
            for _ in range(100):  # until the broker has registered the topic (every 0.5 s)
                probe = await asyncio.to_thread(
                    CliRunner().invoke, app, ["topic", "describe", "-t", "Tiered"],
                    env={"ORBITMQ_NAMESRV": ns.address},
                )  # fmt: skip
                if probe.exit_code == 0:
                    break
                await asyncio.sleep(0.1)
            out = (
                await asyncio.to_thread(cli, ns.address, "tier", "status", "-t", "Tiered")
            ).stdout
            assert "available" in out and "unavailable" not in out, out
            assert re.search(r"Tiered\s*│\s*0\s*│\s*\[0, 5\)\s*│\s*\[0, 5\)\s*│\s*0\s*│", out), out
            desc = await asyncio.to_thread(cli, ns.address, "topic", "describe", "-t", "Tiered")
            assert re.search(r"│\s*0\s*│.*│\s*\[0, 5\)\s*│\s*\[0, 5\)", desc.stdout), desc.stdout
