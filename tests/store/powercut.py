"""Simulated power cuts for in-process tests: lose what was never fsynced, as LazyFS would.

While a :class:`PowerCut` is active it wraps ``os.fsync`` and ``os.fdatasync``. After the real
call returns, the wrapper copies the file's current bytes into a *durable image* keyed by inode
(a directory fsync records the directory's listing instead). ``os.unlink``/``os.remove`` and
``os.rename``/``os.replace`` are wrapped too, so an image follows its file through a rename
and is forgotten with it (an inode number reused by a later file never inherits a stale
image). Everything is recorded from the process's own point of view, so the store under test
needs no cooperation beyond calling the ordinary ``os`` functions.

:meth:`PowerCut.cut` ends the run: it stops recording (fsyncs that return afterwards did not
happen as far as the "disk" is concerned), crashes the store in-process and rewrites every file
under the store directory as the disk might hold it after the power came back:

* a file with a durable image gets exactly that content and size; with ``torn=True`` each
  4 KiB page that differs from the image may instead keep its newer bytes (un-fsynced pages
  reach the disk or not, page by page);
* a file that was never fsynced is truncated to zero or zero-filled at its current size (with
  ``torn=True`` some of its pages may survive);
* a file whose name never became durable (see below) may be deleted.

Every choice is per file (per page), from a seeded RNG.

Two models of directory entries. The default one is ext4/XFS-like: a file that was fsynced
keeps its name, so does any name in a directory listing that was fsynced, and since metadata is
journaled in order only the newest names of a directory (names sort by creation in the store's
directories) can be missing. ``strict_dirs`` follows POSIX to the letter: only a directory
fsync makes a new name durable, and any other name (or directory) may be missing.

Not modelled: unlinks that a power cut undoes (a deleted file coming back), sub-page tearing.
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

PAGE = 4096

FileKey = tuple[int, int]  # (st_dev, st_ino)


class Crashable(Protocol):
    def crash_for_test(self) -> None: ...


@dataclass(slots=True)
class CutLog:
    """What one cut did to each file (for failure messages)."""

    actions: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return "\n".join(f"  {path}: {what}" for path, what in sorted(self.actions.items()))


class PowerCut:
    """Record durable file images under ``root`` while active; ``cut()`` applies a power cut."""

    def __init__(
        self,
        root: Path,
        rng: random.Random,
        *,
        torn: bool = False,
        strict_dirs: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.rng = rng
        self.torn = torn
        self.strict_dirs = strict_dirs
        self.images: dict[FileKey, bytes] = {}
        self.listings: dict[FileKey, set[str]] = {}
        self.fsyncs = 0
        self._lock = threading.Lock()
        self._frozen = False
        self._saved: dict[str, Callable[..., Any]] = {}

    # ------------------------------------------------------------------ patching

    def __enter__(self) -> PowerCut:
        real_fsync, real_fdatasync = os.fsync, os.fdatasync
        real_unlink, real_remove = os.unlink, os.remove
        real_rename, real_replace = os.rename, os.replace
        self._saved = {
            "fsync": real_fsync,
            "fdatasync": real_fdatasync,
            "unlink": real_unlink,
            "remove": real_remove,
            "rename": real_rename,
            "replace": real_replace,
        }

        def fsync(fd: Any) -> None:
            real_fsync(fd)
            self._record(fd)

        def fdatasync(fd: Any) -> None:
            real_fdatasync(fd)
            self._record(fd)

        # After the power went, renames and unlinks never reach the disk: skip them (a rename
        # must not publish a file whose fsync came too late to be recorded).
        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            if self._cut_off(path):
                return
            key = self._key_of(path)
            real_unlink(path, *args, **kwargs)
            self._forget(key)

        def remove(path: Any, *args: Any, **kwargs: Any) -> None:
            if self._cut_off(path):
                return
            key = self._key_of(path)
            real_remove(path, *args, **kwargs)
            self._forget(key)

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if self._cut_off(dst):
                return
            key = self._key_of(dst)
            real_rename(src, dst, *args, **kwargs)
            self._forget(key)

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if self._cut_off(dst):
                return
            key = self._key_of(dst)
            real_replace(src, dst, *args, **kwargs)
            self._forget(key)

        os.fsync = fsync
        os.fdatasync = fdatasync
        os.unlink = unlink
        os.remove = remove
        os.rename = rename
        os.replace = replace
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for name, fn in self._saved.items():
            setattr(os, name, fn)
        self._saved = {}

    # ------------------------------------------------------------------ recording

    def _cut_off(self, path: Any) -> bool:
        """True once frozen, for paths under the store directory."""
        if not self._frozen:
            return False
        try:
            return bool(os.path.realpath(os.fspath(path)).startswith(str(self.root)))
        except TypeError:
            return False

    def _key_of(self, path: Any) -> FileKey | None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except (OSError, TypeError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            return None  # another name still links it: its image stays valid
        return (st.st_dev, st.st_ino)

    def _forget(self, key: FileKey | None) -> None:
        if key is None:
            return
        with self._lock:
            self.images.pop(key, None)

    def _record(self, fd: Any) -> None:
        if not isinstance(fd, int):
            fd = fd.fileno()
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
        except OSError:
            return
        if not path.startswith(str(self.root)) or st.st_nlink == 0:
            return
        key = (st.st_dev, st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            try:
                names = set(os.listdir(path))
            except OSError:
                return
            with self._lock:
                if not self._frozen:
                    self.listings[key] = names
                    self.fsyncs += 1
            return
        # Reopen through /proc: the store's descriptor may be write-only.
        try:
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        except OSError:
            return
        try:
            data = _read_all(rfd)
        finally:
            os.close(rfd)
        with self._lock:
            if not self._frozen:
                self.images[key] = data
                self.fsyncs += 1

    @property
    def frozen(self) -> bool:
        return self._frozen

    def freeze(self) -> None:
        """The power goes: later fsyncs change nothing durable."""
        with self._lock:
            self._frozen = True

    def all_durable(self) -> None:
        """Take the disk as it is now as durable (after a cut, or at the start)."""
        images: dict[FileKey, bytes] = {}
        listings: dict[FileKey, set[str]] = {}
        for dirpath, _dirs, files in os.walk(self.root):
            st = os.stat(dirpath)
            listings[(st.st_dev, st.st_ino)] = set(os.listdir(dirpath))
            for name in files:
                p = os.path.join(dirpath, name)
                st = os.stat(p)
                images[(st.st_dev, st.st_ino)] = Path(p).read_bytes()
        with self._lock:
            self.images = images
            self.listings = listings
            self._frozen = False

    # ------------------------------------------------------------------ the cut

    def cut(self, store: Crashable | None) -> CutLog:
        """Freeze, crash ``store`` (if given), rewrite the files; then record afresh."""
        self.freeze()
        if store is not None:
            store.crash_for_test()
        log = self._apply()
        self.all_durable()
        return log

    def _name_durable(self, path: str, key: FileKey) -> bool:
        parent = os.stat(os.path.dirname(path))
        listing = self.listings.get((parent.st_dev, parent.st_ino), set())
        if os.path.basename(path) in listing:
            return True
        return not self.strict_dirs and key in self.images

    def _apply(self) -> CutLog:
        log = CutLog()
        rng = self.rng
        unlink = self._saved.get("unlink", os.unlink)
        # Deepest first, so a directory whose name never became durable can go with its files.
        for dirpath, _dirs, files in sorted(os.walk(self.root), key=lambda w: -len(w[0])):
            names = sorted(n for n in files if n != "lock")
            keys = {n: _file_key(os.path.join(dirpath, n)) for n in names}
            loose = [n for n in names if not self._name_durable(os.path.join(dirpath, n), keys[n])]
            if self.strict_dirs:
                doomed = {n for n in loose if rng.random() < 1 / 3}
            else:
                # Metadata is journaled in order: only the newest names (they sort by creation
                # in the store's directories) can be missing, and only if not made durable.
                suffix: list[str] = []
                for n in reversed(names):
                    if n not in loose:
                        break
                    suffix.append(n)
                doomed = set(suffix[: rng.randint(0, len(suffix))]) if rng.random() < 0.5 else set()
            for name in names:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root)
                if name in doomed:
                    unlink(path)
                    log.actions[rel] = "deleted (name never durable)"
                    continue
                current = Path(path).read_bytes()
                image = self.images.get(keys[name])
                if image is not None:
                    data = self._torn(image, current) if self.torn else image
                    what = "durable image" + (" (torn)" if data != image else "")
                elif rng.random() < 0.5:
                    data = b""
                    what = "truncated to 0 (never fsynced)"
                else:
                    zeros = bytes(len(current))
                    data = self._torn(zeros, current) if self.torn else zeros
                    what = "zero-filled (never fsynced)" + (" (torn)" if data != zeros else "")
                if data == current:
                    what += ", unchanged"
                else:
                    _write_exactly(path, data)
                log.actions[rel] = what
            if self.strict_dirs and dirpath != str(self.root):
                parent = os.stat(os.path.dirname(dirpath))
                listing = self.listings.get((parent.st_dev, parent.st_ino), set())
                if os.path.basename(dirpath) not in listing and rng.random() < 1 / 3:
                    for sub, _d, subfiles in os.walk(dirpath, topdown=False):
                        for n in subfiles:
                            unlink(os.path.join(sub, n))
                        os.rmdir(sub)
                    log.actions[os.path.relpath(dirpath, self.root) + "/"] = (
                        "directory deleted (name never durable)"
                    )
        return log

    def _torn(self, image: bytes, current: bytes) -> bytes:
        """Per 4 KiB page that differs, keep the newer bytes with probability 1/2."""
        size = len(image)
        if len(current) > size and self.rng.random() < 0.5:
            size = len(current)  # the size change reached the disk
        out = bytearray(image[:size].ljust(size, b"\0"))
        for at in range(0, size, PAGE):
            new = current[at : at + PAGE]
            if new and new != out[at : at + len(new)] and self.rng.random() < 0.5:
                out[at : at + len(new)] = new
        return bytes(out)


def _file_key(path: str) -> FileKey:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    at = 0
    while True:
        chunk = os.pread(fd, 1 << 20, at)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        at += len(chunk)


def _write_exactly(path: str, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate(len(data))


@contextlib.contextmanager
def power_cut(
    root: Path, seed: int, *, torn: bool = False, strict_dirs: bool = False
) -> Iterator[PowerCut]:
    """``with power_cut(store_dir, seed) as pc: ...; pc.cut(store)``."""
    with PowerCut(root, random.Random(seed), torn=torn, strict_dirs=strict_dirs) as pc:
        yield pc
