"""A real small file system filling up (issue #14): a tmpfs of a few MB, mounted by the test
(root only, else skipped). Ballast fills it while the store runs; sends are refused with
SERVICE_NOT_AVAILABLE (never acknowledged and lost), no service thread dies, writes resume by
themselves within 15 s of the ballast going, and every acknowledged message is readable after
the event and after a restart.

The store runs in a child process: should a mapping ever touch an unallocated page of the full
file system, that is a SIGBUS, and it must fail this test, not kill the test runner.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from orbitmq.common.errors import ServiceNotAvailableError, StoreError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import decode
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_store_config

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting a tmpfs needs root (run as root to test a real full disk)"
)

SERVICES = ("orbitmq-dispatch", "orbitmq-flush", "orbitmq-checkpoint", "orbitmq-retention")


def config(root: Path) -> Any:
    return small_store_config(
        root,
        mapped_file_size_commit_log=512 * 1024,
        max_message_size=16 * 1024,
        consume_queue_entries_per_file=2048,
        max_hash_slot_num=1024,
        max_index_num=4096,
        # no deletion (100: forced deletion off): what is acknowledged must stay readable;
        # refusals come from ENOSPC at whichever file needs a block
        disk_max_used_space_ratio=100,
        disk_space_clean_forcibly_ratio=100,
        disk_space_warning_level_ratio=100,
        clean_resource_interval_ms=200,
        flush_interval_consume_queue_ms=100,
    )


def fill(path: Path) -> None:
    chunk = b"\0" * 65536
    with open(path, "wb") as f:
        while True:
            try:
                f.write(chunk)
                f.flush()
            except OSError:
                return


def scenario(mnt: str, out: Any) -> None:
    try:
        out.put(("ok", run_scenario(mnt)))
    except BaseException:
        out.put(("failed", traceback.format_exc()))
        raise


def run_scenario(mnt: str) -> tuple[int, dict[str, int], float]:
    root = Path(mnt) / "store"
    store = MessageStore(config(root))
    store.open()
    acked: dict[tuple[str, int], list[bytes]] = {}
    refused: dict[str, int] = {}

    def send(i: int) -> bool:
        topic, q = f"T{i % 40}", i % 4
        body = f"{i}".encode().ljust(3000, b".")
        try:
            store.put(MessageBatch.of(topic, q, [Message(topic, body, keys=[f"k{i}"])]))
        except StoreError as exc:
            assert isinstance(exc, ServiceNotAvailableError | StoreError), exc
            refused[type(exc).__name__] = refused.get(type(exc).__name__, 0) + 1
            return False
        acked.setdefault((topic, q), []).append(body)
        return True

    for i in range(200):
        assert send(i), f"refused before the disk filled: {refused}, {store.health()}"
    fill(Path(mnt) / "ballast")
    for i in range(200, 1200):
        send(i)
        if refused and i % 50 == 0:
            time.sleep(0.05)
    assert refused, "a full file system must refuse sends"
    alive = {t.name for t in threading.enumerate()}
    assert all(s in alive for s in SERVICES), alive
    os.unlink(Path(mnt) / "ballast")
    began = time.monotonic()
    i = 5000
    while not send(i):
        i += 1
        assert time.monotonic() - began < 15, "writes did not resume within 15 s"
        time.sleep(0.1)
    resumed_s = time.monotonic() - began
    assert store.wait_for_dispatch(15)
    check(store, acked)
    store.close()
    store = MessageStore(config(root))
    store.open()
    check(store, acked)
    store.close()
    return sum(map(len, acked.values())), refused, resumed_s


def check(store: MessageStore, acked: dict[tuple[str, int], list[bytes]]) -> None:
    for (topic, q), bodies in acked.items():
        got: list[bytes] = []
        offset = store.min_offset(topic, q)
        assert offset == 0, f"{topic}/{q} starts at {offset}: acknowledged messages deleted"
        while offset < store.max_offset(topic, q):
            res = store.get_messages(topic, q, offset, 64)
            assert not res.skipped, (topic, q, offset, res.status, res.skipped,
                                     store.queues.get(topic, q))  # fmt: skip
            got += [decode(v).body for v in res.messages]
            offset = res.next_begin_offset
        assert got == bodies, f"{topic}/{q}: {len(got)} read, {len(bodies)} acknowledged"


def test_full_tmpfs_refuses_then_resumes_and_loses_nothing(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], check=True)
    try:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=scenario, args=(str(mnt), out))
        child.start()
        child.join(120)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode in (0, 1), f"store process killed: exit {child.exitcode}"
        status, result = out.get(timeout=5)
        assert status == "ok", result
        acked, refused, resumed_s = result
        print(f"acknowledged {acked}, refused {refused}, resumed after {resumed_s:.1f} s")
        assert acked > 200
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mnt)], check=True)
