"""The epoch file: which master epoch wrote which part of this broker's CommitLog.

Each entry ``(epoch, start_offset)`` says that the bytes from ``start_offset`` up to the next
entry's start (or the log's end) were written while ``epoch`` was the master epoch. A master
appends ``(its epoch, its max offset)`` when it takes office; a slave appends the epoch of the
first TRANSFER of a new epoch. Comparing two brokers' lists finds the last offset where their
logs agree (Kafka's leader-epoch checkpoint, KIP-101 and KIP-279; RocketMQ's
``epochFileCheckpoint``): a former master that comes back cuts its log there, not at a high
watermark that may lag the truth (the KIP-101 failures).

Layout (``<store>/epoch``, big-endian)::

     0  4  magic 'OEPC'
     4  2  version (1)
     6  2  reserved (0)
     8  4  count
    12  4  CRC32C of bytes [0, 12)
    16     count x 16 bytes: epoch u32, start_offset i64, CRC32C of the entry's 12 bytes

Epochs strictly increase and start offsets never decrease. The file is rewritten whole on every
change -- temp file, fdatasync (through :class:`FileOps`, the store's fault seam), rename,
directory fsync -- so a crash leaves the old list or the new one, never a mix. A file that fails
any check raises :class:`EpochFileError` at load: the broker must not guess its history.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import crc32c

from orbitmq.common.errors import StoreError
from orbitmq.store.layout import EPOCH_FILE as EPOCH_FILE
from orbitmq.store.layout import TMP_SUFFIX, fsync_dir
from orbitmq.store.segment import FileOps

_MAGIC = 0x4F455043
_HEAD = struct.Struct(">IHHI")
_CRC = struct.Struct(">I")
_ENTRY = struct.Struct(">Iq")
_ENTRY_SIZE = _ENTRY.size + _CRC.size  # 16
_HEAD_SIZE = _HEAD.size + _CRC.size  # 16

EpochEntry = tuple[int, int]
"""(epoch, start offset)."""


class EpochFileError(StoreError):
    """The epoch file is damaged, or a change would break its order."""


class NoCommonEpochError(StoreError):
    """Two logs share no epoch: the local one cannot be cut into a prefix of the other.

    The broker must not join the group as it is: wipe its store and copy the master's
    (``orbitmq broker resync``), or start it with an empty store."""


def encode(entries: Sequence[EpochEntry]) -> bytes:
    head = _HEAD.pack(_MAGIC, 1, 0, len(entries))
    parts = [head, _CRC.pack(crc32c.crc32c(head))]
    for epoch, start in entries:
        raw = _ENTRY.pack(epoch, start)
        parts += [raw, _CRC.pack(crc32c.crc32c(raw))]
    return b"".join(parts)


def decode(raw: bytes) -> list[EpochEntry]:
    """The entries, or EpochFileError saying what is wrong."""
    if len(raw) < _HEAD_SIZE:
        raise EpochFileError(f"epoch file of {len(raw)} bytes is too short")
    magic, version, _reserved, count = _HEAD.unpack_from(raw, 0)
    if _CRC.unpack_from(raw, _HEAD.size)[0] != crc32c.crc32c(raw[: _HEAD.size]):
        raise EpochFileError("epoch file header fails its CRC")
    if magic != _MAGIC or version != 1:
        raise EpochFileError(f"not an epoch file (magic 0x{magic:08x}, version {version})")
    if len(raw) != _HEAD_SIZE + count * _ENTRY_SIZE:
        raise EpochFileError(f"epoch file of {len(raw)} bytes cannot hold {count} entries")
    entries: list[EpochEntry] = []
    for i in range(count):
        at = _HEAD_SIZE + i * _ENTRY_SIZE
        body = raw[at : at + _ENTRY.size]
        if _CRC.unpack_from(raw, at + _ENTRY.size)[0] != crc32c.crc32c(body):
            raise EpochFileError(f"epoch entry {i} fails its CRC")
        entries.append(_ENTRY.unpack(body))
    _check_order(entries)
    return entries


def _check_order(entries: Sequence[EpochEntry]) -> None:
    for (e0, s0), (e1, s1) in itertools.pairwise(entries):
        if e1 <= e0 or s1 < s0:
            raise EpochFileError(f"epoch entries out of order: ({e0}, {s0}) then ({e1}, {s1})")
    for epoch, start in entries:
        if epoch < 0 or start < 0:
            raise EpochFileError(f"negative epoch entry ({epoch}, {start})")


def end_offset_for(entries: Sequence[EpochEntry], epoch: int, log_end: int) -> tuple[int, int]:
    """KIP-279's answer to "where does epoch ``epoch`` end?": ``(e, end)`` with ``e`` the
    largest epoch <= ``epoch`` this log has and ``end`` the start of the epoch after it (the
    log's end if ``e`` is the last); ``(-1, -1)`` if every epoch here is above ``epoch``."""
    for i in range(len(entries) - 1, -1, -1):
        e, _start = entries[i]
        if e <= epoch:
            end = entries[i + 1][1] if i + 1 < len(entries) else log_end
            return e, end
    return -1, -1


def divergence_offset(
    local: Sequence[EpochEntry],
    local_end: int,
    peer: Sequence[EpochEntry],
    peer_end: int,
) -> int:
    """Where to cut the local log so it is a prefix of the peer's (RocketMQ's handshake rule).

    Walk the local epochs newest first; the first one the peer holds with the same start offset
    is the last common epoch, and both logs agree up to the smaller of their ends of it. An empty
    local log needs no cut. No common epoch: :class:`NoCommonEpochError`.
    """
    if local_end == 0:
        return 0
    if not local:
        raise NoCommonEpochError(
            f"the local log holds {local_end} bytes but no epochs: its history is unknown"
        )
    peer_starts = dict(peer)
    for i in range(len(local) - 1, -1, -1):
        epoch, start = local[i]
        if peer_starts.get(epoch) != start:
            continue
        mine = local[i + 1][1] if i + 1 < len(local) else local_end
        _e, theirs = end_offset_for(peer, epoch, peer_end)
        return min(mine, theirs, local_end)
    raise NoCommonEpochError(
        f"no common epoch: local epochs {list(local)}, peer epochs {list(peer)}"
    )


def divergence_offset_by_query(
    local: Sequence[EpochEntry],
    local_end: int,
    ask: Callable[[int], tuple[int, int]],
) -> int:
    """The same cut, found by asking the leader "end offset of epoch E?" (KIP-279), for a peer
    that answers with :func:`end_offset_for` instead of sending its whole list.

    Ask for the newest local epoch; the leader answers the largest epoch it has at or below it.
    If that is ours too, cut at the smaller end; otherwise the leader never had the epochs in
    between, so ask again from below its answer.
    """
    if local_end == 0:
        return 0
    bound = local[-1][0] if local else -1
    while True:
        mine = end_offset_for(local, bound, local_end)
        if mine[0] < 0:
            raise NoCommonEpochError(f"the leader shares none of the local epochs {list(local)}")
        theirs = ask(mine[0])
        if theirs[0] < 0:
            raise NoCommonEpochError(f"the leader has no epoch at or below {mine[0]}")
        if theirs[0] == mine[0]:
            return min(mine[1], theirs[1], local_end)
        if theirs[0] > mine[0]:
            raise EpochFileError(f"leader answered epoch {theirs[0]} for {mine[0]}")
        bound = theirs[0]


class EpochFile:
    """The epoch list of one store, kept in memory and rewritten whole on every change.

    Thread-safety: changes come from one thread (the role change or the HA link's reader)."""

    def __init__(self, path: Path, fs: FileOps | None = None) -> None:
        self.path = path
        self.fs = fs or FileOps()
        self._entries: list[EpochEntry] = []

    def load(self) -> list[EpochEntry]:
        """Read the file (none: an empty list). EpochFileError if it is damaged."""
        self.path.with_name(self.path.name + TMP_SUFFIX).unlink(missing_ok=True)
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._entries = []
            return []
        try:
            self._entries = decode(raw)
        except EpochFileError as exc:
            raise EpochFileError(f"{self.path}: {exc}") from None
        return list(self._entries)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def last_epoch(self) -> int:
        """The newest epoch, -1 if none."""
        return self._entries[-1][0] if self._entries else -1

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        return end_offset_for(self._entries, epoch, log_end)

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` begins at ``start_offset``. Refuses an epoch not above the last
        (an old master's order must never be taken) or a start before the last one's."""
        if self._entries:
            last_epoch, last_start = self._entries[-1]
            if epoch <= last_epoch:
                raise EpochFileError(f"epoch {epoch} is not above the last one, {last_epoch}")
            if start_offset < last_start:
                raise EpochFileError(
                    f"epoch {epoch} starts at {start_offset}, before epoch {last_epoch} "
                    f"({last_start})"
                )
        if epoch < 0 or start_offset < 0:
            raise EpochFileError(f"negative epoch entry ({epoch}, {start_offset})")
        self._store([*self._entries, (epoch, start_offset)])

    def truncate_from(self, offset: int) -> int:
        """The log now ends at ``offset``: drop epochs starting at or past it (they hold no byte
        any more; Kafka's ``truncateFromEnd``). Returns how many were dropped."""
        return self._keep(lambda start: start < offset)

    def truncate_after(self, offset: int) -> int:
        """Drop epochs starting past ``offset``: an epoch starting exactly at the log's end is
        a master's that has written nothing yet, and stays. Returns how many were dropped."""
        return self._keep(lambda start: start <= offset)

    def _keep(self, keep: Callable[[int], bool]) -> int:
        kept = [(e, s) for e, s in self._entries if keep(s)]
        dropped = len(self._entries) - len(kept)
        if dropped:
            self._store(kept)
        return dropped

    def _store(self, entries: list[EpochEntry]) -> None:
        """Write the new list crash-safely, then adopt it (a failed write changes nothing)."""
        data = encode(entries)
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.fs.pwrite(fd, data, 0)
            self.fs.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._entries = entries
