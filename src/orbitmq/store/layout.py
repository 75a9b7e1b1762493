"""Names of everything the store keeps on disk, in one place.

<store_path>/
  commitlog/00000000000000000000     CommitLog segments, named by 20-digit start offset
  consumequeue/<topic>/<queue_id>/<20-digit start byte offset>
  index/<yyyyMMddHHmmssSSS>          IndexFiles, named by creation time
  checkpoint                         safe points for recovery (written atomically)
  epoch                              (epoch, start offset) of each master epoch (store/epoch.py)
  abort                              present while the store is open: its presence at start
                                     means the last run did not close cleanly
  lock                               flock'ed by the process that has the store open

A topic name becomes a directory name (:func:`topic_dir`): entry points validate names
(orbitmq.common.validation), and the store checks again that one can never leave its directory.
"""

from __future__ import annotations

from pathlib import Path

from orbitmq.common.files import TMP_SUFFIX as TMP_SUFFIX
from orbitmq.common.files import fsync_dir as fsync_dir
from orbitmq.common.files import write_atomically as write_atomically

COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
EPOCH_FILE = "epoch"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
OFFSET_NAME_DIGITS = 20


def offset_name(offset: int) -> str:
    return f"{offset:0{OFFSET_NAME_DIGITS}d}"


def parse_offset_name(name: str) -> int | None:
    if len(name) == OFFSET_NAME_DIGITS and name.isdigit():
        return int(name)
    return None


def topic_dir(root: Path, topic: str) -> Path:
    """``root/topic``; raises ValueError for a name that is not one plain path component."""
    if topic in ("", ".", "..") or any(c in topic for c in "/\\\0"):
        raise ValueError(f"topic {topic[:60]!r} cannot be a directory name")
    return root / topic
