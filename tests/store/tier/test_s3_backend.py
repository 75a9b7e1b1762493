"""The S3 backend (obstore). Its calls are exercised against obstore's in-memory store, which
speaks the same ``obstore`` API; a real S3 endpoint is used only when one is given
(``ORBITMQ_TEST_S3_ENDPOINT`` etc.): none can be installed here (no moto, no Swift)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

obstore = pytest.importorskip("obstore", reason="the tier-s3 extra (obstore) is not installed")

from obstore.store import MemoryStore  # noqa: E402

from orbitmq.common.message import MessageBatch  # noqa: E402
from orbitmq.store.config import StoreConfig  # noqa: E402
from orbitmq.store.message_store import MessageStore  # noqa: E402
from orbitmq.store.tier.s3 import S3Backend  # noqa: E402
from tests.store.conftest import small_config  # noqa: E402


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


@pytest.mark.skipif(
    not os.environ.get("ORBITMQ_TEST_S3_ENDPOINT"),
    reason="no S3-compatible server here (moto and Swift are not installed); set "
    "ORBITMQ_TEST_S3_ENDPOINT, _BUCKET, _ACCESS_KEY, _SECRET_KEY to run against one",
)
def test_a_real_s3_endpoint(tmp_path: Path) -> None:
    env = os.environ
    config = StoreConfig(
        store_path=tmp_path / "s",
        tier_backend="s3",
        tier_s3_endpoint=env["ORBITMQ_TEST_S3_ENDPOINT"],
        tier_s3_bucket=env.get("ORBITMQ_TEST_S3_BUCKET", "orbitmq"),
        tier_s3_access_key=env.get("ORBITMQ_TEST_S3_ACCESS_KEY", ""),
        tier_s3_secret_key=env.get("ORBITMQ_TEST_S3_SECRET_KEY", ""),
        tier_s3_prefix=f"test-{os.getpid()}",
        tier_s3_allow_http=env["ORBITMQ_TEST_S3_ENDPOINT"].startswith("http:"),
    )
    b = S3Backend.from_config(config)
    b.probe()
    assert b.conditional_puts is not None
    b.put("k/1", b"abc")
    try:
        assert b.get("k/1") == b"abc" and b.get_range("k/1", 1, 2) == b"bc"
        assert b.list("k/") == ["k/1"]
    finally:
        b.delete("k/1")
