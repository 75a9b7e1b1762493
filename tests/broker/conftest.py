from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.net.client import RemotingClient
from orbitmq.testing import small_broker_config

broker_config = small_broker_config
"""A broker on a free port with a small store at ``path`` (orbitmq.testing)."""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[BrokerController]:
    b = BrokerController(broker_config(tmp_path / "store"))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    c = RemotingClient()
    try:
        yield c
    finally:
        await c.close()
