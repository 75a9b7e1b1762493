"""Fixed-size files written with pwrite and read through a read-only mmap.

Why both: ``pwrite`` is one syscall per batch, reports ENOSPC/EIO as an ordinary OSError and
releases the GIL while the kernel copies; a shared read-only mapping of the same file hands
readers zero-copy memoryviews of the page cache. Every file is sized to its full length when
created, so the mapping never reaches past EOF. Whether its blocks are taken up front is the
owner's choice (``reserve``): a CommitLog segment reserves them (``posix_fallocate``), so a full
disk shows up when the segment is created rather than in the middle of an append; a ConsumeQueue
file does not (it is sparse: disk use grows with its entries, not with the number of queues).
A sparse file is safe because nothing writes through the mapping: a pwrite into a hole on a full
disk returns ENOSPC like any other write, where a store through a mapping would raise SIGBUS.

``FileOps`` is the fault seam: every disk call that can fail for reasons outside the program
(write, flush, allocate, size) goes through it, so tests inject ENOSPC and EIO at each site.

Thread-safety: one writer at a time per file (the CommitLog lock or the dispatcher thread);
readers may read concurrently and only look below positions the writer has published.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from orbitmq.common.errors import DiskFullError, StoreClosedError, StoreIOError
from orbitmq.common.files import WriteOps
from orbitmq.store.layout import fsync_dir, offset_name, parse_offset_name

log = logging.getLogger(__name__)


class FileOps(WriteOps):
    """The disk calls that can fail for reasons outside the program. Tests inject faults here:
    these, ``write_file``/``fsync`` of the small files (checkpoint) and ``read_check``."""

    read_check: Callable[[str, int, int], None] | None = None
    """Called as (topic, queue_id, queue_offset) before a read is served, when set: the read
    seam. Records are read through mappings, where a real EIO would be a SIGBUS; a test
    raises OSError here to see that one read fail (StoreIOError, counted), not the thread."""

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def allocate(self, fd: int, size: int) -> None:
        """Size the file to ``size`` bytes with every block reserved (ENOSPC if they are not free)."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(fd, size)

    def reserve(self, fd: int, offset: int, length: int) -> None:
        """Take the blocks of [offset, offset + length) (file systems without fallocate: no-op)."""
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise

    def truncate(self, fd: int, size: int) -> None:
        """Set the file's length without taking blocks (a sparse file)."""
        os.ftruncate(fd, size)


def io_error(what: str, exc: OSError) -> StoreIOError:
    """Translate an OSError into the store's exception, keeping errno in the message."""
    if exc.errno == errno.ENOSPC:
        return DiskFullError(f"{what}: no space left on device")  # type: ignore[return-value]
    return StoreIOError(f"{what}: {exc.strerror or exc} (errno {exc.errno})")


class Segment:
    """One preallocated file of ``size`` bytes whose first byte is at ``start`` in its log."""

    __slots__ = ("_mm", "_view", "closed", "fd", "fs", "path", "reserve", "size", "start")

    def __init__(
        self, path: Path, start: int, size: int, fs: FileOps, *, create: bool, reserve: bool = True
    ) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.fs = fs
        self.reserve = reserve
        self.closed = False
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create and reserve:
                fs.allocate(self.fd, size)
            elif create:
                fs.truncate(self.fd, size)
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
        if not self.closed:  # a file retention just removed needs no fsync
            self.fs.fdatasync(self.fd)

    def zero_from(self, position: int) -> None:
        """Zero the file from ``position`` on (truncate then re-extend: the kernel zero-fills)."""
        os.ftruncate(self.fd, position)
        os.ftruncate(self.fd, self.size)
        if not self.reserve:
            return
        try:
            self.fs.allocate(self.fd, self.size)
        except OSError:
            log.warning("could not re-reserve %s after zeroing its tail", self.path)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._view.release()
        # A reader may still hold a memoryview of the mapping: it stays valid until released.
        with contextlib.suppress(BufferError):
            self._mm.close()
        os.close(self.fd)

    def destroy(self) -> None:
        """Delete the file (retention). A reader that found this segment just before keeps a
        working ``view``: the mapping is not released here but goes with the last reference
        to the segment, as the file's blocks go with the mapping."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)
        self.path.unlink(missing_ok=True)


class OpenFiles:
    """A bound on the sparse segments kept open (an fd and a mapping each), least recently
    used closed first. 10,000 topics x 8 queues would otherwise need 80,000 of each, past
    the usual ``ulimit -n`` and ``vm.max_map_count`` (65,530). A closed one reopens on use."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lru: OrderedDict[SparseSegment, None] = OrderedDict()
        self._lock = threading.Lock()

    def touch(self, seg: SparseSegment) -> None:
        victims: list[SparseSegment] = []
        with self._lock:
            self._lru[seg] = None
            self._lru.move_to_end(seg)
            while len(self._lru) > self.limit:
                victim = next(iter(self._lru))
                if victim is seg:
                    break
                del self._lru[victim]
                victims.append(victim)
        for victim in victims:
            if not victim.unmap():  # busy right now: keep it, try another time
                with self._lock:
                    self._lru[victim] = None

    def forget(self, seg: SparseSegment) -> None:
        with self._lock:
            self._lru.pop(seg, None)


class SparseSegment(Segment):
    """A segment without reserved blocks whose fd and mapping may be closed while idle
    (``OpenFiles``) and reopen on the next use; the mapping is made only when something reads
    (the dispatcher only writes). Each ``view`` is its own memoryview, so closing never
    invalidates a view a reader holds (the mapping lives until it is released).
    """

    __slots__ = ("_lock", "_map", "_open_files")

    def __init__(
        self, path: Path, start: int, size: int, fs: FileOps, open_files: OpenFiles, *,
        create: bool,
    ) -> None:  # fmt: skip
        self.path = path
        self.start = start
        self.size = size
        self.fs = fs
        self.reserve = False
        self.closed = False
        self._lock = threading.Lock()
        self._open_files = open_files
        self._map: mmap.mmap | None = None
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                fs.truncate(self.fd, size)
            elif os.fstat(self.fd).st_size != size:
                log.warning("%s is not %d bytes: resized", path, size)
                os.ftruncate(self.fd, size)
        except BaseException:
            os.close(self.fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        open_files.touch(self)

    def _ensure_fd(self) -> None:
        """Reopen after an unmap (the lock is held)."""
        if self.fd < 0:
            if self.closed:
                raise StoreClosedError(f"{self.path.name} is closed")
            self.fd = os.open(self.path, os.O_RDWR)

    @property
    def view(self) -> memoryview:
        with self._lock:
            self._ensure_fd()
            if self._map is None:
                self._map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
            view = memoryview(self._map)
        self._open_files.touch(self)
        return view

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        with self._lock:
            self._ensure_fd()
            self.fs.pwrite(self.fd, data, position)
        self._open_files.touch(self)

    def flush(self) -> None:
        with self._lock:
            if self.closed:
                return
            if self.fd >= 0:
                self.fs.fdatasync(self.fd)
                return
            # fsync is per file, not per fd: a new fd flushes what was written before
            fd = os.open(self.path, os.O_RDWR)
            try:
                self.fs.fdatasync(fd)
            finally:
                os.close(fd)

    def zero_from(self, position: int) -> None:
        with self._lock:
            self._ensure_fd()
            super().zero_from(position)
        self._open_files.touch(self)

    def _release(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a reader's view keeps it mapped
                self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unmap(self) -> bool:
        """Close the fd and the mapping (not the segment); False if it is in use right now."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._release()
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._release()
        self._open_files.forget(self)

    def destroy(self) -> None:
        self.close()  # each view is its own: the ones readers hold stay mapped
        self.path.unlink(missing_ok=True)


class SegmentQueue:
    """An ordered run of equal-size segments, named by their 20-digit start offset.

    ``segments`` is copy-on-write: changes build a new list under a lock and swap it in, so a
    reader that took ``self.segments`` once holds a consistent snapshot without locking.
    """

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        fs: FileOps,
        *,
        reserve: bool = True,
        dir_syncs: set[Path] | None = None,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.fs = fs
        self.reserve = reserve
        # Without a reservation the files are SparseSegments, kept open within this bound.
        self.open_files = open_files or OpenFiles(1 << 30)
        # With ``dir_syncs`` a new file's name is made durable later, by whoever drains the
        # set before it vouches for the file (derived data: the checkpoint); else at once.
        self.dir_syncs = dir_syncs
        self.segments: list[Segment] = []
        self._mutate = threading.Lock()

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
        loaded = []
        for s in keep:
            actual = os.path.getsize(self.directory / offset_name(s))
            if actual != self.segment_size:
                problems.append(
                    f"{offset_name(s)} is {actual} bytes, expected {self.segment_size}: resized"
                )
            loaded.append(self._segment(s, create=False))
        self.segments = loaded
        return problems

    @property
    def min_offset(self) -> int:
        segs = self.segments
        return segs[0].start if segs else 0

    def find(self, offset: int) -> Segment | None:
        segs = self.segments
        if not segs:
            return None
        i = (offset - segs[0].start) // self.segment_size
        if 0 <= i < len(segs):
            return segs[i]
        return None

    def last(self) -> Segment | None:
        segs = self.segments
        return segs[-1] if segs else None

    def create(self, start: int) -> Segment:
        try:
            seg = self._segment(start, create=True)
        except OSError as exc:
            raise io_error(f"creating segment {offset_name(start)}", exc) from exc
        try:
            if self.dir_syncs is not None:
                self.dir_syncs.add(self.directory)  # set.add is atomic under the GIL
            else:
                fsync_dir(self.directory)  # the new name must survive a power cut, like the data
        except OSError as exc:
            seg.destroy()
            raise io_error(f"creating segment {offset_name(start)}", exc) from exc
        with self._mutate:
            self.segments = [*self.segments, seg]
        return seg

    def _segment(self, start: int, *, create: bool) -> Segment:
        path = self.directory / offset_name(start)
        if self.reserve:
            return Segment(path, start, self.segment_size, self.fs, create=create)
        return SparseSegment(path, start, self.segment_size, self.fs, self.open_files,
                             create=create)  # fmt: skip

    def drop_after(self, offset: int) -> list[Path]:
        """Delete whole segments that start after ``offset`` (recovery truncation)."""
        with self._mutate:
            doomed = [seg for seg in self.segments if seg.start > offset]
            self.segments = [seg for seg in self.segments if seg.start <= offset]
        for seg in reversed(doomed):
            seg.destroy()
        return [seg.path for seg in reversed(doomed)]

    def drop_first(self) -> Path:
        with self._mutate:
            seg = self.segments[0]
            self.segments = self.segments[1:]
        seg.destroy()
        return seg.path

    def close(self) -> None:
        with self._mutate:
            segs, self.segments = self.segments, []
        for seg in segs:
            seg.close()
