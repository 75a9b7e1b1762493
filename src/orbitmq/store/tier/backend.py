"""Tier backends: where the tier's immutable objects live.

A backend stores whole objects by key (``/``-separated, no ``..``): ``put`` (atomic: a reader
sees the old object or the new one, never half), ``get``, ``get_range``, ``list`` (keys under a
prefix), ``delete``. Every call is blocking and runs on the store's tier thread or a broker
reader thread, never on an event loop. A backend raises what it raises; the tier turns any
failure of a read into :class:`~orbitmq.common.errors.TierUnavailableError` (retryable) and any
failure of an upload into a backoff.

:class:`DirectoryBackend` is the embedded default (another disk, or a mounted file system). It
is OrbitMQ's own rather than obstore's ``LocalStore`` because once local segments are deleted the
tier holds the only copy, and ``LocalStore`` documents no fsync: a put writes a temporary file
in the target's folder, fsyncs it, renames it over the key and fsyncs the folder.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
from pathlib import Path

from orbitmq.common.errors import ConfigError


class TierBackend(abc.ABC):
    """An object store seen as a flat key space."""

    name = "backend"

    @abc.abstractmethod
    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` atomically (replacing any object there)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object (FileNotFoundError / KeyError style failures if absent)."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from ``start``."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (absent is not an error)."""

    def describe(self) -> str:
        return self.name

    def probe(self) -> None:  # noqa: B027 - optional: most backends have nothing to find out
        """Find out, once the store is reachable, what it supports (the S3 backend: conditional
        puts). Called by the tier thread before it loads the catalog."""

    def remove_partial(self, prefix: str) -> int:
        """Remove what puts interrupted by another process's death left under ``prefix``
        (objects no listing shows). Returns how many went. An S3 put is atomic: nothing."""
        return 0


class PrefixedBackend(TierBackend):
    """Another backend's keys under ``prefix/``: one store's objects beside other stores'."""

    def __init__(self, inner: TierBackend, prefix: str) -> None:
        self.inner = inner
        self.prefix = check_key(prefix.strip("/")) + "/"
        self.name = inner.name

    def describe(self) -> str:
        return f"{self.inner.describe()} /{self.prefix}"

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self.inner.put(self.prefix + check_key(key), data)

    def get(self, key: str) -> bytes:
        return self.inner.get(self.prefix + check_key(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(self.prefix + check_key(key), start, length)

    def list(self, prefix: str) -> list[str]:
        cut = len(self.prefix)
        return [k[cut:] for k in self.inner.list(self.prefix + prefix)]

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + check_key(key))

    def probe(self) -> None:
        self.inner.probe()

    def remove_partial(self, prefix: str) -> int:
        return self.inner.remove_partial(self.prefix + prefix)


def check_key(key: str) -> str:
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad tier key {key!r}")
    return key


class DirectoryBackend(TierBackend):
    """Objects as files under ``root`` (key ``a/b/c`` is ``root/a/b/c``)."""

    name = "directory"

    def __init__(self, root: Path) -> None:
        if not str(root):
            raise ConfigError("store.tier_path: the directory backend needs a path")
        self.root = Path(root)
        # Temporary files carry the writing process's token: those of a dead one are swept.
        self._token = secrets.token_hex(4)

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        folder = path.parent
        made = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.{self._token}-{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(folder)
        if made:  # the new folders' names must be durable too
            for parent in folder.parents:
                _fsync_dir(parent)
                if parent == self.root or self.root not in parent.parents:
                    break

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        fd = os.open(self._path(key), os.O_RDONLY)
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def list(self, prefix: str) -> list[str]:
        out: list[str] = []
        if not self.root.is_dir():
            return out
        base = str(self.root)
        for folder, dirs, files in os.walk(base):
            rel = os.path.relpath(folder, base)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if not (rel.startswith(prefix) or prefix.startswith(rel)):
                dirs.clear()
                continue
            out.extend(
                rel + name
                for name in files
                if not name.startswith(".") and (rel + name).startswith(prefix)
            )
        return sorted(out)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def remove_partial(self, prefix: str) -> int:
        """Temporary files under the folder ``prefix`` names that another process (a killed
        broker) started and never renamed into place."""
        folder = self.root / check_key(prefix.rstrip("/"))
        gone = 0
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(folder):
                if name.startswith(".") and name.endswith(".tmp") and self._token not in name:
                    with contextlib.suppress(FileNotFoundError):
                        (folder / name).unlink()
                        gone += 1
        return gone


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
