"""`orbitmq bench sink-commit` measures both protocols on a small count, and each really wrote
its rows: the half batches were committed (visible), the idempotent sends stored once."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orbitmq.cli.main import app
from orbitmq.client import AsyncAdminClient
from orbitmq.spark.sink_ab import run_sink_ab
from orbitmq.testing import run_broker, run_namesrv, small_broker_config


@pytest.mark.timeout(120)
async def test_both_protocols_write_every_row_once(tmp_path: Path) -> None:
    async with run_namesrv() as ns:
        addr = f"127.0.0.1:{ns.port}"
        async with run_broker(small_broker_config(tmp_path / "s", namesrv_addrs=(addr,))):
            result = await run_sink_ab(addr, rows=300, size=16, chunk=50, queues=2)
            assert result.half_rate > 0 and result.idempotent_rate > 0
            async with AsyncAdminClient(addr) as admin:
                for topic in [t for t in await admin.list_topics() if t.startswith("SinkAb")]:
                    if topic.endswith("-markers"):
                        continue
                    total = 0
                    for q in await admin.queues(topic):
                        total += await admin.max_offset(q)
                    assert total == 300, topic


@pytest.mark.timeout(180)
def test_cli_small() -> None:
    res = CliRunner().invoke(app, ["bench", "sink-commit", "--rows", "200", "--chunk", "50"])
    assert res.exit_code == 0, res.output
    assert "idempotent producer" in res.output and "half batches" in res.output
