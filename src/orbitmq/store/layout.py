"""Names of everything the store keeps on disk, in one place.

<store_path>/
  commitlog/00000000000000000000     CommitLog segments, named by 20-digit start offset
  consumequeue/<topic>/<queue_id>/<20-digit start byte offset>
  index/<yyyyMMddHHmmssSSS>          IndexFiles, named by creation time
  checkpoint                         safe points for recovery (written atomically)
  abort                              present while the store is open: its presence at start
                                     means the last run did not close cleanly
  lock                               flock'ed by the process that has the store open
"""

from __future__ import annotations

import os
from pathlib import Path

COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
TMP_SUFFIX = ".tmp"
OFFSET_NAME_DIGITS = 20


def offset_name(offset: int) -> str:
    return f"{offset:0{OFFSET_NAME_DIGITS}d}"


def parse_offset_name(name: str) -> int | None:
    if len(name) == OFFSET_NAME_DIGITS and name.isdigit():
        return int(name)
    return None


def fsync_dir(path: Path) -> None:
    """Make a create/rename/unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new contents."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
