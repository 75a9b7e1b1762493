"""``orbitmq broker resync``: rebuild a replica from its master (docs/ha.md, "Resynchronising a
replica").

A slave whose log shares no epoch with its master's (a store written before replication, a
broker that was master of another history, a restored backup) cannot tell which of its bytes
the group keeps: it is refused and logs the error on every retry. Resync makes it a replica
again, offline, on a stopped broker (the store's ``lock`` must be free):

- **empty** (the default): the log and everything derived from it (CommitLog, ConsumeQueues,
  IndexFiles, checkpoint, epoch file, kept confirm offset) are *moved aside* into
  ``<store>.resync-<UTC time>`` (nothing is deleted: the operator removes it once the replica is
  back), with the metadata log's applied position; the broker's ``config/`` stays (its
  controller id, its auth cache), its replicated files are re-applied from the copy. At its next
  start the broker joins its master as an empty slave and copies the master's log from the
  master's first segment.
- **to a known-good offset** (``--to``): the log is cut there crash-safely
  (``MessageStore.truncate_to``: the cut is durable before anything else, epochs after it go,
  the kept confirm offset is lowered), and the metadata log is applied again from the start.
  For a log whose bytes below that offset the operator knows to be the group's.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from orbitmq.common.errors import StoreError
from orbitmq.common.files import fsync_dir
from orbitmq.store import layout
from orbitmq.store.config import StoreConfig
from orbitmq.store.message_store import MessageStore

DATA = (layout.COMMITLOG_DIR, layout.CONSUMEQUEUE_DIR, layout.INDEX_DIR, layout.CHECKPOINT_FILE,
        layout.EPOCH_FILE, layout.ABORT_FILE, "confirm")  # fmt: skip
"""What the log is and what is derived from it: moved aside by an empty resync."""
APPLIED = Path("config") / "metadata_log.json"
"""The metadata log's applied position (broker/metadata): meaningless once the log changed."""


@dataclass
class ResyncReport:
    store: Path
    backup: Path | None = None
    moved: list[str] = field(default_factory=list)
    cut_at: int | None = None
    end_before: int = 0


def _stopped(root: Path) -> int:
    """The store's lock, held for the resync (StoreError when a broker holds it)."""
    fd = os.open(root / layout.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"{root} is open in a running broker: stop it first") from None
    return fd


def resync(config: StoreConfig, *, to: int | None = None) -> ResyncReport:
    root = Path(config.store_path)
    if not root.is_dir():
        raise StoreError(f"{root} is not a store directory")
    report = ResyncReport(root)
    if to is not None:
        store = MessageStore(config)
        store.open()
        try:
            report.end_before = store.commit_log.max_offset
            if to < store.commit_log.max_offset:
                store.truncate_to(to)
            report.cut_at = store.commit_log.max_offset
        finally:
            store.close()
        fd = _stopped(root)
        try:
            (root / APPLIED).unlink(missing_ok=True)
        finally:
            os.close(fd)
        return report
    fd = _stopped(root)
    try:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = root.with_name(f"{root.name}.resync-{stamp}")
        n = 0
        while backup.exists():  # two resyncs in one second
            n += 1
            backup = root.with_name(f"{root.name}.resync-{stamp}-{n}")
        backup.mkdir()
        report.backup = backup
        for name in (*DATA, str(APPLIED)):
            src = root / name
            if src.exists():
                (backup / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(src, backup / name)
                report.moved.append(name)
        fsync_dir(root)
        fsync_dir(backup)
    finally:
        os.close(fd)
    return report
