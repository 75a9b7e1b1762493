from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.controller import BrokerController
from orbitmq.net.client import RemotingClient
from orbitmq.store.config import StoreConfig


def broker_config(path: Path, **overrides: Any) -> BrokerConfig:
    store_opts = overrides.pop("store", {})
    store = StoreConfig(
        store_path=path,
        mapped_file_size_commit_log=8 * 1024 * 1024,
        max_message_size=1024 * 1024,
        consume_queue_entries_per_file=1024,
        max_hash_slot_num=1024,
        max_index_num=4096,
        **store_opts,
    )
    opts: dict[str, Any] = {
        "port": 0,
        "namesrv_addrs": (),
        "auto_create_topic": True,
        "store": store,
        "register_interval_s": 0.5,
    }
    opts.update(overrides)
    return BrokerConfig(**opts)


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
