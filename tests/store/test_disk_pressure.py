"""Disk pressure as RocketMQ names it (issue #14): expired segments go at 75 %, the oldest go
even if not expired at 85 %, writes are refused at 90 %; forced deletion works while the
dispatcher is failing; writes resume by themselves once space returns; consumers below the new
minimum continue from it; a segment that cannot be created puts the store back into refusing,
and it recovers."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.common.errors import DiskFullError, ServiceNotAvailableError
from orbitmq.common.message import MessageBatch
from orbitmq.common.record import decode
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.testing import small_store_config
from tests.store.test_faults import FaultyFs

SEGMENT = 256 * 1024
BODY = b"x" * 4000


class Disk:
    """The disk use the store sees, in percent (set by the test)."""

    def __init__(self) -> None:
        self.ratio = 10.0

    def __call__(self) -> float:
        return self.ratio


def open_store(
    path: Path, disk: Disk, fs: FaultyFs | None = None, **overrides: Any
) -> MessageStore:
    options: dict[str, Any] = {
        "mapped_file_size_commit_log": SEGMENT,
        "max_message_size": 64 * 1024,
        "file_reserved_time_hours": 72.0,
        "delete_when": "",
        "clean_resource_interval_ms": 50,
    }
    options.update(overrides)
    store = MessageStore(small_store_config(path, **options), fs=fs, disk_usage=disk)
    store.open()
    return store


def fill(store: MessageStore, segments: float, topic: str = "T") -> int:
    n = int(segments * SEGMENT / (len(BODY) + 120))
    for _ in range(n):
        store.put(MessageBatch.of(topic, 0, [BODY]))
    assert store.wait_for_dispatch()
    return n


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_expired_segments_go_at_75_percent(tmp_path: Path) -> None:
    disk = Disk()
    store = open_store(tmp_path / "s", disk, file_reserved_time_hours=0.0)
    try:
        fill(store, 3.5)
        segments = len(store.commit_log.segments.segments)
        assert segments >= 4
        time.sleep(0.3)
        assert len(store.commit_log.segments.segments) == segments  # 10 %, not the hour
        disk.ratio = 76.0
        assert wait_until(lambda: len(store.commit_log.segments.segments) == 1)
    finally:
        store.close()


def test_oldest_forced_out_at_85_percent_and_consumers_continue_from_the_minimum(
    tmp_path: Path,
) -> None:
    disk = Disk()
    store = open_store(tmp_path / "s", disk)  # nothing expired: 72 h reserve
    try:
        n = fill(store, 3.5)
        disk.ratio = 80.0
        time.sleep(0.3)
        assert store.min_offset("T", 0) == 0  # 80 %: only expired files may go
        disk.ratio = 86.0
        assert wait_until(lambda: store.min_offset("T", 0) > 0)
        disk.ratio = 50.0
        low = store.min_offset("T", 0)
        res = store.get_messages("T", 0, 0)
        assert res.status is GetStatus.OFFSET_TOO_SMALL
        assert res.next_begin_offset == low  # a consumer below the minimum continues there
        res = store.get_messages("T", 0, res.next_begin_offset, 1000)
        assert res.status is GetStatus.FOUND
        assert decode(res.messages[0]).queue_offset == low
        assert store.max_offset("T", 0) == n
    finally:
        store.close()


def test_writes_refused_at_90_percent_resume_by_themselves(tmp_path: Path) -> None:
    disk = Disk()
    store = open_store(tmp_path / "s", disk, clean_resource_interval_ms=10_000)
    try:
        fill(store, 0.2)
        disk.ratio = 91.0
        store._cleaner.wake()
        assert wait_until(lambda: store.retention.disk_full, 5)
        with pytest.raises(DiskFullError) as info:
            store.put(MessageBatch.of("T", 0, [b"refused"]))
        assert isinstance(info.value, ServiceNotAvailableError)  # SERVICE_NOT_AVAILABLE
        assert "disk" in store.health()
        disk.ratio = 60.0
        began = time.monotonic()
        store.put(MessageBatch.of("T", 0, [b"accepted"]))  # no retention run needed
        assert time.monotonic() - began < 15
        assert "disk" not in store.health()
    finally:
        store.close()


def test_forced_deletion_works_while_the_dispatcher_fails(tmp_path: Path) -> None:
    """A dispatcher that cannot write (a ConsumeQueue on a full disk) used to hold every
    segment it had not dispatched, so forced deletion freed nothing and the broker wedged."""
    disk = Disk()
    fs = FaultyFs()
    store = open_store(tmp_path / "s", disk, fs=fs)
    try:
        fill(store, 1.0)
        fs.arm("pwrite", errno.ENOSPC, where="/consumequeue/", times=10**9)
        for _ in range(int(2.5 * SEGMENT / (len(BODY) + 120))):
            try:
                store.put(MessageBatch.of("U", 0, [BODY]))
            except ServiceNotAvailableError:
                break  # refused once dispatch fails: nothing acknowledged into a black hole
        assert wait_until(lambda: store.dispatcher.failure is not None)
        assert "dispatcher" in store.health()
        stuck_at = store.dispatcher.reput_offset
        # The oldest segment is not fully dispatched (and refused sends kept the tail short).
        assert stuck_at < SEGMENT <= store.commit_log.max_offset
        disk.ratio = 87.0
        assert wait_until(lambda: store.commit_log.min_offset > stuck_at)
        fs.clear()
        disk.ratio = 40.0
        assert wait_until(lambda: store.dispatcher.failure is None)
        store.put(MessageBatch.of("U", 0, [b"after"]))
        assert store.wait_for_dispatch()
        low = store.min_offset("U", 0)
        res = store.get_messages("U", 0, low, 1000)
        assert res.status is GetStatus.FOUND
        assert decode(res.messages[-1]).body == b"after"
        assert store.health() == {}
    finally:
        store.close()


def test_segment_that_cannot_be_created_refuses_again_and_recovers(tmp_path: Path) -> None:
    """Below every ratio, but no room for a new segment: the store refuses (never accepting
    and failing every send), forces the oldest out, and accepts again once a segment fits."""
    disk = Disk()
    fs = FaultyFs()
    store = open_store(tmp_path / "s", disk, fs=fs)
    try:
        fill(store, 0.9)
        fs.arm("allocate", errno.ENOSPC, where="/commitlog/", times=10**9)
        fits = False  # what statvfs says: a segment does not fit in the free space
        store.retention._segment_fits = lambda: fits  # type: ignore[method-assign]
        with pytest.raises(DiskFullError):
            fill(store, 0.5)
        for _ in range(3):  # refused at once, not accepted and failed
            with pytest.raises(DiskFullError, match="writes refused until it fits"):
                store.put(MessageBatch.of("T", 0, [b"refused"]))
        assert "disk" in store.health()
        assert "dispatcher" not in store.health()
        fs.clear()
        fits = True  # space returned
        store.put(MessageBatch.of("T", 0, [b"accepted"]))
        assert store.wait_for_dispatch()
        assert "disk" not in store.health()
    finally:
        store.close()
