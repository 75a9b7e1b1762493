"""Small files written whole: configs, offsets, checkpoints.

One way to replace such a file, used by the store, the broker and the client: write a
temporary file next to it, fsync it, rename it over the old one, fsync the directory. A crash
at any point leaves either the old contents or the new ones, never a mix. A write that fails
(ENOSPC, EIO) raises the OSError and removes the temporary file (it would hold space).

The disk calls that can fail go through ``WriteOps``, the same fault seam as the store's
``FileOps`` (which extends it): pass ``ops=`` or swap the process-wide default with
``set_write_ops`` (tests inject ENOSPC and EIO into every config, offset and checkpoint file).
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


class WriteOps:
    """The calls of ``write_atomically`` that can fail for reasons outside the program."""

    def write_file(self, path: Path, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` to ``fd`` (the temporary file for ``path``)."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


_ops = WriteOps()


def set_write_ops(ops: WriteOps) -> WriteOps:
    """Make ``ops`` the default of ``write_atomically``; returns the previous one."""
    global _ops
    old, _ops = _ops, ops
    return old


def fsync_dir(path: Path) -> None:
    """Make a create/rename/unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(
    path: Path, data: bytes, *, fsync: bool = True, ops: WriteOps | None = None
) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new contents.

    ``fsync=False`` keeps the atomic rename but skips the fsyncs: the file then survives a
    killed process (the page cache keeps it), not a power cut.
    """
    o = ops or _ops
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        o.write_file(path, fd, data)
        if fsync:
            o.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)
