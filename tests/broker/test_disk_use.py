"""The store's real disk use (issue #14): runtime info's ``disk_used_bytes`` (the ``on disk``
column of ``orbitmq cluster list``) is the blocks the store's files occupy, measured by the
retention run off the event loop and cached, and it grows with the data."""

from __future__ import annotations

import os
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.store.retention import store_disk_use
from tests.broker.test_broker import send_frame


def blocks_under(root: Path) -> int:
    return sum(
        os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _s, fs in os.walk(root) for f in fs
    )


async def disk_used(broker: BrokerController, client: RemotingClient) -> int:
    resp = await client.invoke(broker.address, Frame(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert resp.code == ResponseCode.SUCCESS
    return int(resp.fields["disk_used_bytes"])


async def test_runtime_info_reports_blocks_the_store_occupies(
    broker: BrokerController, client: RemotingClient
) -> None:
    before = await disk_used(broker, client)  # measured at open (a new store: next to nothing)
    body = os.urandom(64 * 1024)  # incompressible, so blocks are really taken
    for _ in range(32):
        resp = await client.invoke(broker.address, send_frame("DiskUse", [body]))
        assert resp.code == ResponseCode.SUCCESS
    assert broker.store.wait_for_dispatch()
    await broker.bridge.call(broker.store.checkpoint)
    await broker.bridge.call(broker.store.retention.run)  # the cached value is refreshed here
    after = await disk_used(broker, client)
    root = Path(broker.store.config.store_path)
    assert after == store_disk_use(root) == blocks_under(root)
    assert after >= before + 32 * len(body)


def test_store_disk_use_counts_blocks_not_apparent_size(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with open(tmp_path / "sub" / "sparse", "wb") as f:
        f.truncate(64 * 1024 * 1024)  # 64 MiB apparent, no blocks
    (tmp_path / "dense").write_bytes(b"x" * 100_000)
    used = store_disk_use(tmp_path)
    assert used == blocks_under(tmp_path)
    assert 100_000 <= used < 1024 * 1024
    assert store_disk_use(tmp_path / "missing") == 0
