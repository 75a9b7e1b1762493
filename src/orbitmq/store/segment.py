"""Fixed-size files written with pwrite and read through a read-only mmap.

Why both: ``pwrite`` is one syscall per batch, reports ENOSPC/EIO as an ordinary OSError and
releases the GIL while the kernel copies; a shared read-only mapping of the same file hands
readers zero-copy memoryviews of the page cache. Files are preallocated to their full size
(``posix_fallocate``), so the mapping never reaches past EOF and a full disk shows up when a file
is created, not as a SIGBUS in the middle of a write.

Thread-safety: one writer at a time per file (the CommitLog lock or the dispatcher thread);
readers may read concurrently and only look below positions the writer has published.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path

from orbitmq.common.errors import DiskFullError, StoreIOError
from orbitmq.store.layout import offset_name, parse_offset_name

log = logging.getLogger(__name__)


class FileOps:
    """The disk calls that can fail for reasons outside the program. Tests inject faults here."""

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def allocate(self, fd: int, size: int) -> None:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(fd, size)


def io_error(what: str, exc: OSError) -> StoreIOError:
    """Translate an OSError into the store's exception, keeping errno in the message."""
    if exc.errno == errno.ENOSPC:
        return DiskFullError(f"{what}: no space left on device")  # type: ignore[return-value]
    return StoreIOError(f"{what}: {exc.strerror or exc} (errno {exc.errno})")


class Segment:
    """One preallocated file of ``size`` bytes whose first byte is at ``start`` in its log."""

    __slots__ = ("_mm", "_view", "fd", "fs", "path", "size", "start")

    def __init__(self, path: Path, start: int, size: int, fs: FileOps, *, create: bool) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.fs = fs
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                fs.allocate(self.fd, size)
            else:
                actual = os.fstat(self.fd).st_size
                if actual != size:
                    log.warning(
                        "%s is %d bytes, expected %d: resized (data past %d is gone)",
                        path, actual, size, min(actual, size),
                    )  # fmt: skip
                    os.ftruncate(self.fd, size)
            self._mm = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        self._view = memoryview(self._mm)

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def view(self) -> memoryview:
        """The whole file, read-only, zero-copy."""
        return self._view

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        self.fs.pwrite(self.fd, data, position)

    def flush(self) -> None:
        self.fs.fdatasync(self.fd)

    def zero_from(self, position: int) -> None:
        """Zero the file from ``position`` on (truncate then re-extend: the kernel zero-fills)."""
        os.ftruncate(self.fd, position)
        os.ftruncate(self.fd, self.size)
        try:
            self.fs.allocate(self.fd, self.size)
        except OSError:
            log.warning("could not re-reserve %s after zeroing its tail", self.path)

    def close(self) -> None:
        self._view.release()
        # A reader may still hold a memoryview of the mapping: it stays valid until released.
        with contextlib.suppress(BufferError):
            self._mm.close()
        os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentQueue:
    """An ordered run of equal-size segments, named by their 20-digit start offset."""

    def __init__(self, directory: Path, segment_size: int, fs: FileOps) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.fs = fs
        self.segments: list[Segment] = []

    def load(self) -> list[str]:
        """Open existing segments. Returns problems found (gaps, stray files) for the report."""
        self.directory.mkdir(parents=True, exist_ok=True)
        problems: list[str] = []
        starts = []
        for entry in os.listdir(self.directory):
            start = parse_offset_name(entry)
            if start is None:
                if entry.endswith(".tmp"):
                    (self.directory / entry).unlink(missing_ok=True)
                continue
            if start % self.segment_size:
                problems.append(f"{entry}: start not a multiple of the segment size, ignored")
                continue
            starts.append(start)
        starts.sort()
        # Keep the contiguous run that ends at the newest segment: older pieces before a gap
        # cannot be reached by offset arithmetic.
        keep = starts
        for i in range(len(starts) - 1, 0, -1):
            if starts[i] - starts[i - 1] != self.segment_size:
                problems.append(
                    f"gap between {offset_name(starts[i - 1])} and {offset_name(starts[i])}: "
                    f"{i} older segment(s) set aside"
                )
                for s in starts[:i]:
                    p = self.directory / offset_name(s)
                    p.rename(p.with_name(p.name + ".orphan"))
                keep = starts[i:]
                break
        for s in keep:
            actual = os.path.getsize(self.directory / offset_name(s))
            if actual != self.segment_size:
                problems.append(
                    f"{offset_name(s)} is {actual} bytes, expected {self.segment_size}: resized"
                )
            self.segments.append(
                Segment(
                    self.directory / offset_name(s), s, self.segment_size, self.fs, create=False
                )
            )
        return problems

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    def find(self, offset: int) -> Segment | None:
        if not self.segments:
            return None
        i = (offset - self.segments[0].start) // self.segment_size
        if 0 <= i < len(self.segments):
            return self.segments[i]
        return None

    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def create(self, start: int) -> Segment:
        try:
            seg = Segment(
                self.directory / offset_name(start), start, self.segment_size, self.fs, create=True
            )
        except OSError as exc:
            raise io_error(f"creating segment {offset_name(start)}", exc) from exc
        self.segments.append(seg)
        return seg

    def drop_after(self, offset: int) -> list[Path]:
        """Delete whole segments that start after ``offset`` (recovery truncation)."""
        gone = []
        while self.segments and self.segments[-1].start > offset:
            seg = self.segments.pop()
            gone.append(seg.path)
            seg.destroy()
        return gone

    def drop_first(self) -> Path:
        seg = self.segments.pop(0)
        seg.destroy()
        return seg.path

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments.clear()
