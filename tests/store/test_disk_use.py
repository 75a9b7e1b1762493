"""Disk use grows with the data, not with the number of queues (issue #14).

ConsumeQueue files are sparse (written with pwrite, so a hole on a full disk is an ENOSPC, not a
SIGBUS) and the IndexFile takes its blocks in steps ahead of its newest entry; only the
CommitLog segment being written keeps its whole reservation. Measured with ``st_blocks``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from orbitmq.common.errors import DiskFullError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.store import index_file
from orbitmq.store.config import StoreConfig
from orbitmq.store.index_file import RESERVE_STEP, IndexFile
from orbitmq.store.index_format import HEADER_SIZE, SLOT_SIZE, index_file_size
from orbitmq.store.message_store import MessageStore
from orbitmq.store.segment import FileOps


def blocks_under(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def test_many_queues_with_one_message_take_disk_in_proportion(tmp_path: Path) -> None:
    config = StoreConfig(
        store_path=tmp_path / "s",
        mapped_file_size_commit_log=8 * 1024 * 1024,
        clean_resource_interval_ms=3_600_000,
    )  # production ConsumeQueue (300,000 entries = 5.7 MiB) and IndexFile geometry
    queues = 100
    with MessageStore(config) as store:
        for i in range(queues):
            store.put(MessageBatch.of(f"T{i}", i % 8, [Message(f"T{i}", b"x" * 100, keys=["k"])]))
        assert store.wait_for_dispatch()
        store.checkpoint()
        cq_files = list((config.store_path / "consumequeue").rglob("0" * 20))
        assert len(cq_files) == queues
        assert all(f.stat().st_size == 300_000 * 20 for f in cq_files)  # sized in full...
        cq_blocks = blocks_under(config.store_path / "consumequeue")
        assert cq_blocks <= queues * 64 * 1024, cq_blocks  # ...but a block or so each
        index_blocks = blocks_under(config.store_path / "index")
        full = index_file_size(config.max_hash_slot_num, config.max_index_num)
        reserved = HEADER_SIZE + SLOT_SIZE * config.max_hash_slot_num + RESERVE_STEP
        assert index_blocks <= reserved + 64 * 1024 < full // 10, index_blocks
        # the data is all there
        for i in range(queues):
            got = store.get_messages(f"T{i}", i % 8, 0)
            assert len(got.messages) == 1
        assert len(store.query_by_key("T7", "k")) == 1
    with MessageStore(config) as store:  # and after a restart
        assert all(len(store.get_messages(f"T{i}", i % 8, 0).messages) == 1 for i in range(queues))


class NoSpaceAfter(FileOps):
    """Reservations fail once ``armed`` is set (a disk that filled up)."""

    armed = False

    def reserve(self, fd: int, offset: int, length: int) -> None:
        if self.armed:
            raise OSError(errno.ENOSPC, "no space")
        super().reserve(fd, offset, length)


def test_index_file_grows_in_steps_and_a_failed_step_is_an_error_not_a_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = 64 * 1024
    monkeypatch.setattr(index_file, "RESERVE_STEP", step)
    fs = NoSpaceAfter()
    slots, entries = 16, 4 * step // 20  # entries span several reservation steps
    f = IndexFile(tmp_path / "f", slots, entries, create=True, begin_timestamp_ms=1, fs=fs)
    try:
        first_step = HEADER_SIZE + SLOT_SIZE * slots + step
        assert os.stat(f.path).st_blocks * 512 <= first_step + 4096
        per_step = step // 20
        for i in range(per_step - 1):
            assert f.put_hash(i % 7, i, 1000)
        fs.armed = True  # the next entry needs the next step: no space for it
        count = f.index_count
        with pytest.raises(DiskFullError):
            for i in range(per_step - 1, per_step + 10):
                f.put_hash(i % 7, i, 1000)
        assert f.index_count <= count + 1  # nothing written past the reserved blocks
        fs.armed = False
        assert f.put("T#z", 10**9, 1000)
        assert f.select("T#z", 0, 2**62, 5) == [10**9]
    finally:
        f.close()


def test_consume_queue_files_beyond_the_open_bound_close_and_reopen(tmp_path: Path) -> None:
    """10,000 topics x 8 queues would need 80,000 fds and mappings: only
    ``max_open_consume_queue_files`` stay open, the rest reopen on use."""
    config = StoreConfig(
        store_path=tmp_path / "s",
        mapped_file_size_commit_log=8 * 1024 * 1024,
        consume_queue_entries_per_file=4,  # several files per queue
        max_open_consume_queue_files=16,
        clean_resource_interval_ms=3_600_000,
    )

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    with MessageStore(config) as store:
        for round_ in range(3):
            for i in range(60):
                store.put(MessageBatch.of(f"T{i}", 0, [f"{i}.{round_}".encode()] * 3))
        assert store.wait_for_dispatch()
        store.checkpoint()
        assert open_fds() - before < 16 + 20  # the bound, the CommitLog, the index, the lock
        for _ in range(2):  # every queue readable, whichever of its files was closed
            for i in range(60):
                got = store.get_messages(f"T{i}", 0, 0, 100)
                assert len(got.messages) == 9
    with MessageStore(config) as store:
        for i in range(60):
            assert len(store.get_messages(f"T{i}", 0, 0, 100).messages) == 9
