"""A broker over an encrypted store: sends and pulls (with a tag filter) work unchanged, the
CommitLog holds no body, and encryption with HA replication is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ConfigError
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from orbitmq.testing import small_broker_config
from tests.broker.ha.test_replication import running
from tests.broker.test_broker import pull_frame, send_frame


async def test_send_and_pull_through_an_encrypted_store(tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    store = {"encrypt_at_rest": True, "encryption_key_file": str(key)}
    config = small_broker_config(tmp_path / "store", store=store)
    client = RemotingClient()
    try:
        async with running(config) as broker:
            for tag in ("red", "blue"):
                bodies = [f"secret-{tag}-{i}".encode() for i in range(3)]
                resp = await client.invoke(
                    broker.address, send_frame("Enc", bodies, TAGS=tag), timeout=5
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert broker.store.wait_for_dispatch()
            resp = await client.invoke(broker.address, pull_frame("Enc", 0, 0), timeout=5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert [m.body for m in decode_records(resp.body)] == [
                f"secret-{t}-{i}".encode() for t in ("red", "blue") for i in range(3)
            ]
            resp = await client.invoke(
                broker.address,
                pull_frame("Enc", 0, 0, expression_type="TAG", expression="blue"),
                timeout=5,
            )
            assert [m.tags for m in decode_records(resp.body)] == ["blue"] * 3
    finally:
        await client.close()
    data = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert b"secret-" not in data


def test_encryption_with_replication_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="encrypt_at_rest"):
        small_broker_config(
            tmp_path, ha_enable=True, store={"encrypt_at_rest": True, "encryption_key_file": "k"}
        )
