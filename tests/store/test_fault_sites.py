"""The fault seam reaches every store write site and the small-file writer (issue #14):
ConsumeQueue file creation, the checkpoint, ``write_atomically`` (the broker's topic, offset,
group, pop, timer and transaction files), reads, and the SYNC_FLUSH fsync."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import StoreIOError, StoreUnavailableError
from orbitmq.common.files import WriteOps, set_write_ops, write_atomically
from orbitmq.common.message import MessageBatch
from orbitmq.store.config import FlushDiskType
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_store_config
from tests.store.test_faults import FaultyFs


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class FailingWrites(WriteOps):
    def __init__(self, err: int, op: str) -> None:
        self.err, self.op, self.calls = err, op, 0

    def write_file(self, path: Path, fd: int, data: bytes | bytearray | memoryview) -> None:
        if self.op == "write":
            self.calls += 1
            raise OSError(self.err, os.strerror(self.err))
        super().write_file(path, fd, data)

    def fsync(self, fd: int) -> None:
        if self.op == "fsync":
            self.calls += 1
            raise OSError(self.err, os.strerror(self.err))
        super().fsync(fd)


@pytest.mark.parametrize("op", ["write", "fsync"])
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_write_atomically_fault_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, op: str, err: int
) -> None:
    path = tmp_path / "topics.json"
    write_atomically(path, b"old")
    ops = FailingWrites(err, op)
    with pytest.raises(OSError) as info:
        write_atomically(path, b"new", ops=ops)
    assert info.value.errno == err
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.json"]
    previous = set_write_ops(ops)  # the process-wide seam the broker's writers go through
    try:
        with pytest.raises(OSError):
            write_atomically(path, b"new")
    finally:
        set_write_ops(previous)
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"


def open_store(tmp_path: Path, fs: FaultyFs, **overrides: Any) -> MessageStore:
    options: dict[str, Any] = {"flush_interval_consume_queue_ms": 20}
    options.update(overrides)
    store = MessageStore(small_store_config(tmp_path / "s", **options), fs=fs)
    store.open()
    return store


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_consume_queue_file_creation_fault(tmp_path: Path, err: int) -> None:
    fs = FaultyFs()
    store = open_store(tmp_path, fs)
    try:
        store.put(MessageBatch.of("A", 0, [b"a"]))
        assert store.wait_for_dispatch()
        fs.arm("truncate", err, where="/consumequeue/", times=3)
        store.put(MessageBatch.of("B", 0, [b"b"]))  # taken before the dispatcher fails
        assert wait_until(lambda: store.dispatcher.failure is not None or fs.failures >= 3)
        with pytest.raises(StoreUnavailableError):
            for _ in range(200):
                store.put(MessageBatch.of("A", 0, [b"refused?"]))
                time.sleep(0.005)
        assert wait_until(lambda: store.dispatcher.failure is None)
        assert store.wait_for_dispatch()
        assert len(store.get_messages("B", 0, 0).messages) == 1  # the acknowledged one
    finally:
        store.close()


@pytest.mark.parametrize("op", ["write_file", "fsync"])
def test_checkpoint_write_fault_is_reported_and_retried(tmp_path: Path, op: str) -> None:
    class Fs(FaultyFs):
        def write_file(self, path: Path, fd: int, data: bytes | bytearray | memoryview) -> None:
            if self.broken and op == "write_file":
                raise OSError(errno.ENOSPC, "no space")
            super().write_file(path, fd, data)

        def fsync(self, fd: int) -> None:
            if self.broken and op == "fsync":
                raise OSError(errno.EIO, "eio")
            super().fsync(fd)

    fs = Fs()
    fs.broken = False
    store = open_store(tmp_path, fs)
    try:
        fs.broken = True
        assert wait_until(lambda: "checkpoint" in store.health())
        assert not list((tmp_path / "s").glob("*.tmp"))  # no temporary left holding space
        store.put(MessageBatch.of("A", 0, [b"a"]))  # sends go on
        fs.broken = False
        assert wait_until(lambda: "checkpoint" not in store.health())
    finally:
        store.close()


def test_read_error_fails_that_read_and_is_counted(tmp_path: Path) -> None:
    fs = FaultyFs()
    fails = {"n": 1}

    def check(topic: str, queue_id: int, offset: int) -> None:
        if fails["n"] > 0:
            fails["n"] -= 1
            raise OSError(errno.EIO, "Input/output error")

    fs.read_check = check
    store = open_store(tmp_path, fs)
    try:
        store.put(MessageBatch.of("A", 0, [b"a", b"b"]))
        assert store.wait_for_dispatch()
        with pytest.raises(StoreIOError) as info:
            store.get_messages("A", 0, 0)
        assert info.value.code == ResponseCode.STORE_IO_ERROR
        assert store.read_errors == 1
        assert store.stats()["read_errors"] == 1
        assert len(store.get_messages("A", 0, 0).messages) == 2  # the next read is served
    finally:
        store.close()


def test_sync_flush_eio_fails_the_pending_send_with_a_clear_code(tmp_path: Path) -> None:
    fs = FaultyFs()
    store = open_store(tmp_path, fs, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    try:
        store.put(MessageBatch.of("A", 0, [b"a"]))
        fs.arm("fdatasync", errno.EIO, where="/commitlog/")
        with pytest.raises(StoreIOError) as info:
            store.put(MessageBatch.of("A", 0, [b"b"]))
        assert info.value.code == ResponseCode.STORE_IO_ERROR
        assert "flusher" in store.health() or "commitlog" in store.health()
    finally:
        store.close()
