from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.store.config import FlushDiskType, StoreConfig
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_store_config

SMALL = {
    "mapped_file_size_commit_log": 4 * 1024 * 1024 + 128 * 1024,
    "consume_queue_entries_per_file": 64,
    "max_hash_slot_num": 128,
    "max_index_num": 512,
    "max_message_size": 4 * 1024 * 1024,
    "flush_interval_commit_log_ms": 20,
    "flush_interval_consume_queue_ms": 50,
    "clean_resource_interval_ms": 3_600_000,
}


def small_config(path: Path, **overrides: Any) -> StoreConfig:
    """The store tests' files: smaller still than orbitmq.testing's, so they roll often."""
    return small_store_config(path, **{**SMALL, **overrides})


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., MessageStore]]:
    """Open stores on tmp_path/store; every store opened is closed at the end of the test."""
    opened: list[MessageStore] = []

    def make(**overrides: Any) -> MessageStore:
        store = MessageStore(small_config(tmp_path / "store", **overrides))
        store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        if store.is_open:
            store.close()


@pytest.fixture(params=[FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH], ids=["async", "sync"])
def flush_type(request: pytest.FixtureRequest) -> FlushDiskType:
    return request.param  # type: ignore[no-any-return]
