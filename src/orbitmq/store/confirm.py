"""The confirm offset kept on disk (docs/ha.md, "The confirm offset"): ``<store>/confirm``.

A replica's confirm offset (Kafka's high watermark) is what every in-sync replica holds. Kept
only in memory, a restarted slave re-dispatched its whole log, so consumers could read bytes
its master never confirmed and that a later truncation takes back. The store now writes the
confirm offset with every checkpoint (about every second) and at close, reads it back before
recovery, and dispatches and serves only up to it until replication sets a new one. The value
on disk is never above the live one when it was written, and the live one only grows between
truncations (which lower it first), so after a crash a replica exposes at most what was
confirmed: it may hide a little more than it could until its master speaks, never less.

No file: no confirm offset (a broker without replication, or a master in async mode):
everything is served, as before. 8 bytes little-endian + CRC32C, written atomically.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from orbitmq.common.files import WriteOps, write_atomically

_FORMAT = struct.Struct("<qI")


class ConfirmFile:
    def __init__(self, path: Path, ops: WriteOps | None = None) -> None:
        self.path = path
        self.ops = ops
        self._saved: int | None = None

    def load(self) -> int | None:
        """The saved confirm offset; None when there is none (or it is unreadable: then the
        store serves everything, as it did before this file existed)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _FORMAT.size:
            return None
        value, crc = (int(x) for x in _FORMAT.unpack(raw))
        if crc != crc32c.crc32c(raw[:8]) or value < 0:
            return None
        self._saved = value
        return value

    def save(self, confirmed: int | None) -> None:
        """Persist ``confirmed`` (None: remove the file) when it changed since the last save."""
        if confirmed == self._saved:
            return
        if confirmed is None:
            self.path.unlink(missing_ok=True)
        else:
            head = struct.pack("<q", confirmed)
            write_atomically(self.path, head + struct.pack("<I", crc32c.crc32c(head)), ops=self.ops)
        self._saved = confirmed
