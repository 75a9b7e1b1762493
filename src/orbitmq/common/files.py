"""Small files written whole: configs, offsets, checkpoints.

One way to replace such a file, used by the store, the broker and the client: write a
temporary file next to it, fsync it, rename it over the old one, fsync the directory. A crash
at any point leaves either the old contents or the new ones, never a mix.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    """Make a create/rename/unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new contents.

    ``fsync=False`` keeps the atomic rename but skips the fsyncs: the file then survives a
    killed process (the page cache keeps it), not a power cut.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)
