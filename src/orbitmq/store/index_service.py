"""IndexService: every IndexFile of a store; the dispatcher feeds it, queries read it.

A producer may tag a message with keys (the ``KEYS`` property) and every message carries a
unique id. ``query(topic, key)`` answers "which CommitLog offsets hold messages with this key?"
without scanning the log. The dispatcher feeds the index as records are appended; the files
follow the byte layout of RocketMQ's IndexFile (the key hash differs: CRC32C, not Java's
``String.hashCode``, so the files are not interchangeable with RocketMQ's).

Entries go to the newest file until it is full (or found suspect), then to a new one; a
query walks the files newest first. File format: :mod:`orbitmq.store.index_format`.

Threading: writes (``put_hashes``, ``build``, ``truncate_from``) come from one thread (the
dispatcher); they and every change to the list of files take the service's lock, so
retention (``delete_below``) and ``flush`` may come from other threads. Queries take no lock
(:mod:`orbitmq.store.index_file` says why a query racing a write is safe).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import StoreClosedError, StoreError, StoreIOError
from orbitmq.common.files import fsync_dir
from orbitmq.store.index_file import IndexFile
from orbitmq.store.index_format import (
    HASH_MASK,
    NAME_RE,
    check_geometry,
    crc32c_seeded,
    format_name,
    name_after,
)
from orbitmq.store.segment import FileOps, io_error

__all__ = ["IndexService"]

log = logging.getLogger(__name__)
_SMALL_BATCH = 16  # below this many entries, insert one by one


class IndexService:
    """All index files of a store directory; the dispatcher feeds it, queries read it.

    Call ``load()`` once before anything else. Writes (``build``, ``build_many``,
    ``truncate_from``, ``delete_below``, ``close``) take an internal lock; ``query`` and
    ``flush`` do not block on it.
    """

    def __init__(
        self,
        directory: Path,
        hash_slot_num: int,
        max_index_num: int,
        *,
        clock: Callable[[], int] = now_ms,
        fs: FileOps | None = None,
    ) -> None:
        check_geometry(hash_slot_num, max_index_num)
        self.directory = Path(directory)
        self._fs = fs or FileOps()
        self._slots = hash_slot_num
        self._max = max_index_num
        self._clock = clock
        self._lock = threading.Lock()
        self._files: tuple[IndexFile, ...] = ()  # oldest first; replaced, never mutated
        self._current: IndexFile | None = None  # the newest file, if it accepts entries
        self._prefixes: dict[str, int] = {}  # topic -> crc32c of f"{topic}#"
        self._loaded = False
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index service {self.directory} is closed")
        if not self._loaded:
            raise StoreError(f"index service {self.directory}: load() has not been called")

    def _prefix(self, topic: str) -> int:
        crc = self._prefixes.get(topic)
        if crc is None:
            if len(self._prefixes) >= 65_536:
                self._prefixes.clear()
            crc = crc32c_seeded(f"{topic}#".encode("utf-8", "surrogatepass"), 0)
            self._prefixes[topic] = crc
        return crc

    def _set_files(self, files: Sequence[IndexFile]) -> None:
        self._files = tuple(files)
        newest = self._files[-1] if self._files else None
        self._current = (
            newest if newest is not None and not newest.is_full and not newest.suspect else None
        )

    def _roll(self, begin_timestamp_ms: int) -> IndexFile:
        old = self._current
        if old is not None:
            old._write_header()
        name = format_name(self._clock())
        if self._files and name <= self._files[-1].path.name:
            name = name_after(self._files[-1].path.name)
        self.directory.mkdir(parents=True, exist_ok=True)
        new = IndexFile(
            self.directory / name,
            self._slots,
            self._max,
            create=True,
            begin_timestamp_ms=begin_timestamp_ms,
            fs=self._fs,
        )
        try:
            fsync_dir(self.directory)  # the new name must survive a power cut, like the data
        except OSError as exc:
            self._delete(new)
            raise io_error(f"creating index file {new.path}", exc) from exc
        self._set_files((*self._files, new))
        log.debug("index: new file %s", new.path)
        return new

    @staticmethod
    def _delete(index_file: IndexFile) -> None:
        index_file.close()
        index_file.path.unlink(missing_ok=True)

    # -- API -------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the existing files, sorted by name. Damaged files load as well (see IndexFile)."""
        with self._lock:
            if self._closed:
                raise StoreClosedError(f"index service {self.directory} is closed")
            if self._loaded:
                raise StoreError(f"index service {self.directory} is already loaded")
            self.directory.mkdir(parents=True, exist_ok=True)
            paths = sorted(
                p for p in self.directory.iterdir() if NAME_RE.fullmatch(p.name) and p.is_file()
            )
            files: list[IndexFile] = []
            try:
                for path in paths:
                    opened = IndexFile(path, self._slots, self._max, create=False, fs=self._fs)
                    files.append(opened)
            except BaseException:
                for f in files:
                    f.close()
                raise
            self._set_files(files)
            self._loaded = True

    def build(
        self,
        topic: str,
        keys: Sequence[str],
        uniq_key: str | None,
        phy_offset: int,
        store_timestamp_ms: int,
    ) -> None:
        """Index ``topic#key`` for each non-empty key and ``topic#uniq_key`` (duplicates once)."""
        self.build_many(((topic, keys, uniq_key, phy_offset, store_timestamp_ms),))

    def build_many(self, items: Iterable[tuple[str, Sequence[str], str | None, int, int]]) -> None:
        """``build`` for a batch, in order: (topic, keys, uniq_key, phy_offset, timestamp_ms).

        Rolls to a new file whenever the current one is full. A plain ``str`` as ``keys`` is a
        TypeError (it would index each character); split KEYS before calling. If an item fails
        (say, a new file cannot be created), the entries before it stay indexed; indexing them
        again later is harmless, queries deduplicate. The hashes are computed here and go in
        through the same batch path as ``put_hashes``.
        """
        with self._lock:
            self._check_ready()
            crc = crc32c_seeded
            prefixes = self._prefixes
            hashes: list[int] = []
            phys: list[int] = []
            times: list[int] = []
            try:
                for topic, keys, uniq_key, phy_offset, timestamp in items:
                    if isinstance(keys, str):
                        raise TypeError("keys must be a sequence of keys, not a str")
                    prefix = prefixes.get(topic)
                    if prefix is None:
                        prefix = self._prefix(topic)
                    if not uniq_key:
                        todo: Iterable[str] = keys if len(keys) <= 1 else dict.fromkeys(keys)
                    elif not keys:
                        todo = (uniq_key,)
                    else:
                        todo = dict.fromkeys((*keys, uniq_key))
                    for key in todo:
                        if not key:
                            continue
                        hashes.append(crc(key.encode("utf-8", "surrogatepass"), prefix) & HASH_MASK)
                        phys.append(phy_offset)
                        times.append(timestamp)
            finally:  # what was hashed before a failure is still indexed
                if hashes:
                    self._put_arrays(
                        np.array(hashes, dtype=np.int64),
                        np.array(phys, dtype=np.int64),
                        np.array(times, dtype=np.int64),
                    )

    def put_hashes(self, items: Sequence[tuple[int, int, int]] | np.ndarray[Any, Any]) -> None:
        """Insert precomputed (key_hash, phy_offset, timestamp_ms) entries in order.

        ``key_hash`` must be ``crc32c(f"{topic}#{key}") & 0x7fffffff`` (what ``query`` looks
        for; the dispatcher computes it from the raw key bytes, seeded with the CRC of
        ``f"{topic}#"``, which is the same number). ``items`` may also be an integer array of
        shape (n, 3), which saves the conversion of the tuples (about half the time of a
        batch). Rolls to a new file whenever the current one is full; entries that went in
        before a failure stay indexed.
        """
        with self._lock:
            self._check_ready()
            n = len(items)
            if n == 0:
                return
            if n < _SMALL_BATCH:
                # numpy's fixed cost (some 25 array operations) outweighs a few entries: the
                # dispatcher's rounds at a few thousand msgs/s index a handful of keys each
                if isinstance(items, np.ndarray) and (items.ndim != 2 or items.shape[1] != 3):
                    raise ValueError(f"put_hashes: an array must be (n, 3), not {items.shape}")
                rows: Sequence[Sequence[int]] = (
                    items.tolist() if isinstance(items, np.ndarray) else items
                )
                if any(not 0 <= row[0] <= HASH_MASK for row in rows):
                    raise ValueError("put_hashes: key hashes must be in 0..2**31-1")
                self._put_rows(rows)
                return
            if isinstance(items, np.ndarray):
                if items.ndim != 2 or items.shape[1] != 3:
                    raise ValueError(f"put_hashes: an array must be (n, 3), not {items.shape}")
                table = items.astype(np.int64, copy=False)
            else:
                chain = itertools.chain.from_iterable(items)
                table = np.fromiter(chain, dtype=np.int64, count=3 * n).reshape(n, 3)
            self._put_arrays(table[:, 0], table[:, 1], table[:, 2])

    def _put_rows(self, rows: Sequence[Sequence[int]]) -> None:
        current = self._current
        try:
            for key_hash, phy_offset, timestamp in rows:
                if current is None or not current._put_hash(key_hash, phy_offset, timestamp):
                    current = self._roll(timestamp)
                    current._put_hash(key_hash, phy_offset, timestamp)
        finally:
            if current is not None:
                current._write_header()

    def _put_arrays(
        self,
        hashes: np.ndarray[Any, Any],
        phys: np.ndarray[Any, Any],
        times: np.ndarray[Any, Any],
    ) -> None:
        """Fill the current file, then new ones, with the entries (the lock is held)."""
        n = len(hashes)
        done = 0
        current = self._current
        while done < n:
            if current is None or current.is_full:
                current = self._roll(int(times[done]))
                if current.is_full:  # cannot happen: max_index_num >= 1
                    raise StoreError(f"index: new file {current.path} takes no entries")
            done += current.put_hashes(hashes[done:], phys[done:], times[done:])

    def query(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[int]:
        """CommitLog offsets of messages indexed under ``topic#key``, newest files first.

        Deduplicated, at most ``max_num``; an entry matches the time range when the second it
        was stored in overlaps ``[begin_ms, end_ms]``. Hash collisions are possible: callers
        read each record and check its topic and keys.
        """
        self._check_ready()
        out: list[int] = []
        if max_num <= 0 or not key or begin_ms > end_ms:
            return out
        key_hash = (
            crc32c_seeded(key.encode("utf-8", "surrogatepass"), self._prefix(topic)) & HASH_MASK
        )
        seen: set[int] = set()
        for f in reversed(self._files):
            # every entry's time is at least the file's begin timestamp
            if f.index_count <= 1 or end_ms < f.begin_timestamp_ms:
                continue
            f._select_hash(key_hash, begin_ms, end_ms, max_num - len(out), out, seen)
            if len(out) >= max_num:
                break
        return out

    def truncate_from(self, phy_offset: int) -> int:
        """Recovery: drop every entry at or beyond ``phy_offset``; returns how many were dropped.

        Files left without entries (those that began at or beyond the offset) are deleted.
        """
        with self._lock:
            self._check_ready()
            dropped = 0
            keep: list[IndexFile] = []
            empty: list[IndexFile] = []
            for f in self._files:
                dropped += f.truncate_from(phy_offset)
                (keep if f.index_count > 1 else empty).append(f)
            self._set_files(keep)
            for f in empty:
                log.info("index: deleting %s, which holds nothing below %d", f.path, phy_offset)
                self._delete(f)
            return dropped

    def delete_below(self, min_phy_offset: int) -> list[Path]:
        """Retention: delete the files whose entries all lie below ``min_phy_offset``.

        The newest file is always kept. Returns the deleted paths.
        """
        with self._lock:
            self._check_ready()
            if len(self._files) <= 1:
                return []
            gone = [f for f in self._files[:-1] if f.end_phy_offset < min_phy_offset]
            if not gone:
                return []
            self._set_files([f for f in self._files if f not in gone])
            for f in gone:
                log.info("index: deleting %s, all below %d", f.path, min_phy_offset)
                self._delete(f)
            return [f.path for f in gone]

    def flush(self) -> None:
        """fsync every file changed since the last flush (does not block ``build``)."""
        for f in self._files:
            f.flush()

    def close(self) -> None:
        """Flush and close every file. Idempotent; raises the first flush error, if any."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            files, self._files, self._current = self._files, (), None
        error: BaseException | None = None
        for f in files:
            try:
                f.flush()
            except StoreIOError as exc:
                error = error or exc
            finally:
                f.close()
        if error is not None:
            raise error

    @property
    def max_phy_offset(self) -> int:
        """``end_phy_offset`` of the newest file holding entries, or 0."""
        for f in reversed(self._files):
            if f.index_count > 1:
                return f.end_phy_offset
        return 0

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files, oldest first."""
        return tuple(f.path for f in self._files)
