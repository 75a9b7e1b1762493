"""Encryption at rest on replicas (docs/security.md, "With HA replication"): a replica installs
its master's wrapped DEK and then holds and serves the master's ciphertext; a DEK of its own for
that segment (from a tail it lost) is replaced, its cached cipher included; another master key
is refused; writer epochs take the floor a new master gives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbitmq.common.errors import StoreError
from tests.store.test_encryption import batch, key_file, open_store


def _bytes(store: object, lo: int, hi: int) -> bytes:
    return bytes(store.read_replication(lo, hi - lo))  # type: ignore[attr-defined]


def test_a_replica_installs_the_master_key_and_serves_its_ciphertext(tmp_path: Path) -> None:
    kf = key_file(tmp_path)
    master = open_store(tmp_path / "m", encrypt_at_rest=True, encryption_key_file=kf)
    replica = open_store(tmp_path / "r", encrypt_at_rest=True, encryption_key_file=kf)
    try:
        assert master.sealer is not None and replica.sealer is not None
        # the replica wrote a tail of its own in segment 0 (another DEK), read it, then lost it
        replica.put(batch("T", 0, ["own"]))
        assert replica.wait_for_dispatch()
        assert replica.get_messages("T", 0, 0, 1).count == 1
        replica.truncate_to(0)
        master.put(batch("T", 0, ["a", "b", "c"]))
        end = master.commit_log.max_offset
        raw = master.sealer.deks.raw(0)
        assert raw is not None and raw != replica.sealer.deks.raw(0)
        assert replica.sealer.install_key(0, raw)
        assert not replica.sealer.install_key(0, raw)  # the same key again: nothing to do
        replica.append_replicated(0, _bytes(master, 0, end))
        assert replica.wait_for_dispatch()
        got = replica.get_messages("T", 0, 0, 8)
        assert got.count == 3 and not got.skipped  # every record authenticates here
        assert _bytes(replica, 0, end) == _bytes(master, 0, end)
    finally:
        master.close()
        replica.close()
    other = open_store(tmp_path / "o", encrypt_at_rest=True, encryption_key_file=key_file(
        tmp_path, "other.key"))  # fmt: skip
    try:
        assert other.sealer is not None
        with pytest.raises(StoreError, match="master key"):
            other.sealer.install_key(0, raw)
    finally:
        other.close()


def test_writer_epoch_floor(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", encrypt_at_rest=True, encryption_key_file=key_file(tmp_path))
    try:
        assert store.sealer is not None
        opened_at = store.sealer.epoch.value
        assert store.sealer.epoch.bump(floor=3 << 16) == 3 << 16 > opened_at
        assert store.sealer.epoch.bump(floor=3 << 16) == (3 << 16) + 1  # never twice
        assert store.sealer.epoch.bump() == (3 << 16) + 2
    finally:
        store.close()
