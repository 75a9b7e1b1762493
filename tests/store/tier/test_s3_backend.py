"""The S3 backend (obstore). Its calls are exercised against obstore's in-memory store, which
speaks the same ``obstore`` API, and against a real S3 endpoint: ``ORBITMQ_TEST_S3_ENDPOINT``
etc. when given, else OpenStack Swift's ``s3api`` started by the test (tests/store/tier/swift.py)
when Debian's Swift packages are installed and ``ORBITMQ_TEST_SWIFT=1`` (``make test-s3`` does
both); skipped, saying why, otherwise."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

obstore = pytest.importorskip("obstore", reason="the tier-s3 extra (obstore) is not installed")

from obstore.store import MemoryStore  # noqa: E402

from orbitmq.common.message import Message, MessageBatch  # noqa: E402
from orbitmq.store.config import StoreConfig  # noqa: E402
from orbitmq.store.message_store import MessageStore  # noqa: E402
from orbitmq.store.tier.s3 import S3Backend  # noqa: E402
from tests.store.conftest import small_config  # noqa: E402
from tests.store.tier.swift import SwiftS3, real_s3_or_skip, s3_settings  # noqa: E402


def memory_backend() -> S3Backend:
    return S3Backend(MemoryStore(), "memory")  # type: ignore[arg-type]  # same obstore API


def test_the_backend_calls() -> None:
    b = memory_backend()
    b.put("T/0/data/a", b"hello world")
    b.put("T/0/index/a", bytearray(b"idx"))
    b.put("T/1/manifest.json", memoryview(b"{}"))
    assert b.get("T/0/data/a") == b"hello world"
    assert b.get_range("T/0/data/a", 6, 5) == b"world"
    assert b.list("T/0/") == ["T/0/data/a", "T/0/index/a"]
    assert b.list("") == ["T/0/data/a", "T/0/index/a", "T/1/manifest.json"]
    # A prefix is a string prefix, not obstore's whole path segments: a key itself, a
    # partial name and a partial folder name all match (the identity marker is listed so).
    b.put("marker.json", b"{}")
    assert b.list("marker.json") == ["marker.json"]
    assert b.list("mark") == ["marker.json"]
    assert b.list("T/0/data/a") == ["T/0/data/a"]
    assert b.list("T/0/d") == ["T/0/data/a"]
    assert b.list("T/0/data") == ["T/0/data/a"]
    assert b.list("T/") == ["T/0/data/a", "T/0/index/a", "T/1/manifest.json"]
    assert b.list("T/0/x") == [] and b.list("nothing") == []
    b.delete("marker.json")
    b.delete("T/0/data/a")
    b.delete("T/0/data/a")  # absent: not an error
    assert b.list("T/0/data/") == []
    with pytest.raises(ValueError, match="bad tier key"):
        b.put("../escape", b"x")
    b.probe()
    assert b.conditional_puts is True  # the memory store honours mode="create"
    assert b.list("_probe/") == []


def test_a_store_tiers_through_the_s3_backend(tmp_path: Path) -> None:
    config = small_config(
        tmp_path / "store",
        mapped_file_size_commit_log=72 * 1024,
        max_message_size=4096,
        tier_backend="directory",  # replaced below by the obstore-backed one
        tier_path=str(tmp_path / "unused"),
        tier_upload_interval_ms=3_600_000,
        tier_local_retention_ms=0,
        delete_when=";".join(str(h) for h in range(24)),
    )
    store = MessageStore(config)
    assert store.tier is not None
    store.tier.backend = store.tier.cache.backend = memory_backend()
    store.open()
    try:
        sent = []
        for r in range(120):
            bodies = [f"s3-{r}-{j}".encode() * 20 for j in range(8)]
            store.put(MessageBatch.of("T", 0, bodies))
            sent.extend(bodies)
        assert store.wait_for_dispatch()
        store.commit_log.flush()
        store.tier.run_once()
        store.retention.run()
        assert store.queues.get("T", 0).min_offset > 0  # type: ignore[union-attr]
        got: list[bytes] = []
        offset = store.min_offset("T", 0)
        while offset < store.max_offset("T", 0):
            res = store.get_messages("T", 0, offset, max_count=64)
            got.extend(_body(m) for m in res.messages)
            offset = res.next_begin_offset
        assert got == sent
    finally:
        store.close()


def _body(view: memoryview) -> bytes:
    from orbitmq.common.record import decode

    return decode(view).body


@pytest.fixture(scope="module")
def real_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SwiftS3, bool]]:
    """A real S3 endpoint, or the test skipped saying why (tests/store/tier/swift.py)."""
    with real_s3_or_skip(tmp_path_factory.mktemp("swift")) as server:
        yield server


def s3_config(tmp_path: Path, s3: SwiftS3, **over: object) -> StoreConfig:
    options: dict[str, object] = {
        "mapped_file_size_commit_log": 72 * 1024,
        "max_message_size": 4096,
        **s3_settings(s3, f"test-{os.getpid()}-{tmp_path.name}"),
        "tier_upload_interval_ms": 3_600_000,
        "tier_local_retention_ms": 0,
        "delete_when": ";".join(str(h) for h in range(24)),
    }
    options.update(over)
    return small_config(tmp_path / "store", **options)


def test_a_real_s3_endpoint(tmp_path: Path, real_s3: tuple[SwiftS3, bool]) -> None:
    s3, is_swift = real_s3
    b = S3Backend.from_config(s3_config(tmp_path, s3))
    b.probe()
    assert b.conditional_puts is not None
    if is_swift:
        assert b.conditional_puts is False  # Swift's s3api answers NotImplemented
    b.put("k/1", b"abc")
    try:
        assert b.get("k/1") == b"abc" and b.get_range("k/1", 1, 2) == b"bc"
        assert b.list("k/") == ["k/1"]
    finally:
        b.delete("k/1")
    assert b.list("k/") == []


def test_a_store_tiers_to_a_real_s3_and_restores_from_it(
    tmp_path: Path, real_s3: tuple[SwiftS3, bool]
) -> None:
    """Upload, local deletion, cold reads, a restart, a key query, then disaster recovery from the
    bucket's manifests, all against the real server."""
    s3, _ = real_s3
    store = MessageStore(s3_config(tmp_path, s3))
    store.open()
    sent: list[bytes] = []
    try:
        assert store.tier is not None
        for r in range(60):
            msgs = [Message("T", f"s3-{r}-{j}-".encode() * 20, keys=(f"k{r}-{j}",))
                    for j in range(8)]  # fmt: skip
            store.put(MessageBatch.of("T", 0, msgs))
            sent.extend(m.body for m in msgs)
        assert store.wait_for_dispatch()
        store.commit_log.flush()
        store.tier.run_once()
        store.retention.run()
        assert store.queues.get("T", 0).min_offset > 0  # type: ignore[union-attr]
        assert read_queue(store) == sent
    finally:
        store.close()
    # A plain restart finds its identity marker (orbitmq-tier.json) in the bucket again.
    store = MessageStore(s3_config(tmp_path, s3))
    store.open()
    try:
        assert store.tier is not None
        store.tier.run_once()
        assert store.tier.loaded and read_queue(store) == sent
    finally:
        store.close()
    shutil.rmtree(tmp_path / "store")  # the local disk is lost
    store = MessageStore(s3_config(tmp_path, s3, tier_restore=True))
    store.open()
    try:
        assert read_queue(store) == sent
        found = store.query_by_key("T", "k3-5")
        assert [m.body for m in found] == [sent[3 * 8 + 5]]
    finally:
        store.close()


def read_queue(store: MessageStore) -> list[bytes]:
    got: list[bytes] = []
    offset = store.min_offset("T", 0)
    for _ in range(10_000):
        if offset >= store.max_offset("T", 0):
            break
        res = store.get_messages("T", 0, offset, max_count=64)
        got.extend(_body(m) for m in res.messages)
        offset = res.next_begin_offset
    return got
