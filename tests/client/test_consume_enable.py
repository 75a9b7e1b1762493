"""consume_enable off for a lite-pull group (RocketMQ's consumeEnable): its pulls name the group,
so the broker hands it nothing; switched on again, it gets every message (nothing skipped)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orbitmq.client import AsyncAdminClient, AsyncLitePullConsumer, ConsumedMessage, LitePullConfig
from orbitmq.protocol.group_config import SubscriptionGroupConfig
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster
from tests.client.test_lite_pull_consumer import FAST
from tests.client.test_push_consumer import create_topic, send

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def enable(addr: str, group: str, on: bool) -> None:
    async with AsyncAdminClient([addr]) as admin:
        await admin.update_group_config(
            SubscriptionGroupConfig(group_name=group, consume_enable=on)
        )


async def test_a_disabled_lite_pull_group_gets_nothing_until_enabled(real: RealCluster) -> None:
    await create_topic(real.addr, "CE-Lite")
    sent = [f"m{i}".encode() for i in range(10)]
    await send(real.addr, "CE-Lite", sent)
    await enable(real.addr, "G-CE", False)
    c = AsyncLitePullConsumer([real.addr], "G-CE", LitePullConfig(**FAST))
    c.subscribe("CE-Lite")
    await c.start()
    try:
        out: list[ConsumedMessage] = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            out += await c.poll(0.2)
        assert out == []
        await enable(real.addr, "G-CE", True)
        deadline = time.monotonic() + 20
        while len(out) < len(sent) and time.monotonic() < deadline:
            out += await c.poll(0.2)
        assert sorted(m.body for m in out) == sorted(sent)
    finally:
        await c.close()
