"""``orbitmq broker resync`` (broker/ha/resync.py): a slave with no common epoch with its master
is refused; resynced (emptied, data moved aside; or cut at a known-good offset) it joins, copies
the master's log and ends byte-identical; a running broker's store is not touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orbitmq.broker.config import BrokerConfig
from orbitmq.broker.ha.resync import resync
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import StoreError
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import settings_toml
from tests.broker.ha.test_replication import (
    TOPIC,
    assert_identical,
    ha_of,
    log_bytes,
    master_config,
    running,
    send,
    slave_config,
    wait_until,
)
from tests.harness import REPO


def _diverged(config: BrokerConfig) -> int:
    """Give the slave's store a history of its own (written before replication: no epoch)."""
    store = MessageStore(config.store)
    store.open()
    store.put(MessageBatch(TOPIC, 0, [b"own"], [encode_properties({})]))
    end = store.commit_log.max_offset
    store.close()
    return end


@pytest.mark.parametrize("mode", ["empty-cli", "to-zero"])
async def test_a_refused_slave_is_resynced_and_joins(tmp_path: Path, mode: str) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        for i in range(5):
            assert (await send(client, master, i)).code == ResponseCode.SUCCESS
        s_config = slave_config(tmp_path / "s", master)
        _diverged(s_config)
        async with running(s_config) as slave:
            assert isinstance(slave.ha, HaSlave)
            ha = slave.ha
            await wait_until(lambda: "epoch" in ha.last_error)
            with pytest.raises(StoreError, match=r"running broker|another process"):
                resync(s_config.store)  # never under a running broker
        if mode == "empty-cli":
            conf = tmp_path / "s.toml"
            conf.write_text(settings_toml({"store": {"store_path": str(tmp_path / "s")}}))
            done = subprocess.run(
                [sys.executable, "-m", "orbitmq", "broker", "resync", "--config", str(conf),
                 "--yes"],
                capture_output=True, text=True, timeout=60, cwd=REPO,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "moved" in done.stdout and "commitlog" in done.stdout, done.stdout
            backups = list(tmp_path.glob("s.resync-*"))
            assert len(backups) == 1 and (backups[0] / "commitlog").is_dir()
            assert (tmp_path / "s" / "config").is_dir()  # its identity and config stay
        else:
            report = resync(s_config.store, to=0)
            assert report.cut_at == 0 and report.end_before > 0
        async with running(s_config) as slave:
            await wait_until(lambda: ha_of(master).in_sync_replicas == 2)
            assert (await send(client, master, 5)).code == ResponseCode.SUCCESS
            await assert_identical(master, slave)
            assert log_bytes(slave.store) == log_bytes(master.store)
    await client.close()
