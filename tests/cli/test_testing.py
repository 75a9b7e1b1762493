"""orbitmq.testing: in-process servers for a block, small stores, TOML for server processes."""

from __future__ import annotations

import tomllib
from pathlib import Path

from orbitmq.cli.settings import load_settings
from orbitmq.client import AsyncAdminClient
from orbitmq.client.admin.config import AdminConfig
from orbitmq.testing import (
    SMALL_STORE,
    run_broker,
    run_namesrv,
    settings_toml,
    small_broker_config,
    small_store_config,
)


def test_small_store_config_takes_overrides(tmp_path: Path) -> None:
    config = small_store_config(tmp_path, max_index_num=48)
    assert config.store_path == tmp_path and config.max_index_num == 48
    assert config.max_hash_slot_num == SMALL_STORE["max_hash_slot_num"]
    broker = small_broker_config(tmp_path, store={"max_index_num": 64}, default_queue_nums=2)
    assert broker.port == 0 and broker.store.max_index_num == 64 and broker.default_queue_nums == 2


def test_settings_toml_is_read_back_by_the_cli(tmp_path: Path) -> None:
    tables = {
        "broker": {
            "broker_name": 'b"1',
            "namesrv_addrs": ["127.0.0.1:1"],
            "auto_create_topic": True,
        },
        "store": {"store_path": tmp_path / "s", "flush_disk_type": "SYNC_FLUSH", **SMALL_STORE},
        "proxy": {"access_keys": {"AK": "SK"}, "long_polling_max_s": 25.0},
    }
    text = settings_toml(tables)
    assert tomllib.loads(text)["broker"]["broker_name"] == 'b"1'
    path = tmp_path / "orbitmq.toml"
    path.write_text(text)
    settings = load_settings(path, env={})
    assert settings.broker.store.store_path == tmp_path / "s"
    assert settings.proxy.access_keys == {"AK": "SK"}


async def test_run_namesrv_and_run_broker_serve_for_the_block() -> None:
    async with run_namesrv() as ns, run_broker(namesrv=ns.address) as broker:
        assert broker.port > 0
        async with AsyncAdminClient([ns.address], AdminConfig(timeout_s=3.0)) as admin:
            await admin.create_topic("TestingT", read_queue_nums=2, write_queue_nums=2)
            assert "TestingT" in await admin.list_topics()
