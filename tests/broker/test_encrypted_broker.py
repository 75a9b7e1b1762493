"""A broker over an encrypted store: sends and pulls (with a tag filter) work unchanged, the
CommitLog holds no body; with HA replication the ciphertext is replicated byte-identically."""

from __future__ import annotations

import os
from pathlib import Path

from orbitmq.broker.ha.slave import HaSlave
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from orbitmq.testing import small_broker_config
from tests.broker.ha.test_replication import (
    assert_identical,
    ha_of,
    in_sync,
    log_bytes,
    master_config,
    running,
    slave_config,
    wait_until,
)
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


async def test_an_encrypted_group_replicates_ciphertext_byte_identically(tmp_path: Path) -> None:
    """Encryption with replication (docs/security.md): every replica holds the same master key;
    the master sends each segment's wrapped DEK before its bytes; the slave's log is the
    master's ciphertext, byte for byte, and it serves plaintext (slave_read_enable); a replica
    without encryption is refused the link."""
    key = tmp_path / "master.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    enc = {"encrypt_at_rest": True, "encryption_key_file": str(key)}
    client = RemotingClient()
    try:
        async with running(master_config(tmp_path / "m", replication_mode="sync", store=enc)) as m:
            s_config = slave_config(tmp_path / "s", m, store=enc, slave_read_enable=True)
            async with running(s_config) as slave:
                await in_sync(m)
                for i in range(20):
                    frame = send_frame("Enc", [b"secret-%d" % i], 0)
                    resp = await client.invoke(m.address, frame, timeout=5)
                    assert resp.code == ResponseCode.SUCCESS, resp.remark
                await assert_identical(m, slave)
                assert log_bytes(slave.store) == log_bytes(m.store)
                assert m.store.sealer is not None and slave.store.sealer is not None
                segs = m.store.sealer.deks.segments()
                assert segs and slave.store.sealer.deks.segments() == segs
                assert m.store.sealer.deks.raw(segs[0]) == slave.store.sealer.deks.raw(segs[0])
                assert m.store.sealer.epoch.value >= ha_of(m).epoch << 16
                slave.topics.auto_create("Enc")
                resp = await client.invoke(slave.address, pull_frame("Enc", 0, 0), timeout=5)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                assert [x.body for x in decode_records(resp.body)] == [
                    b"secret-%d" % i for i in range(20)
                ]
            plain = slave_config(tmp_path / "p", m)
            async with running(plain) as p:  # a replica without the key cannot follow
                ha = p.ha
                assert isinstance(ha, HaSlave)
                await wait_until(lambda: "encrypt" in ha.last_error)
                assert p.store.commit_log.max_offset == 0
    finally:
        await client.close()
    for store in ("m", "s"):
        files = [p for p in (tmp_path / store).rglob("*") if p.is_file()]
        assert b"secret-" not in b"".join(p.read_bytes() for p in files), store
