"""The checkpoint: where recovery may start, written atomically about once a second.

Layout (big-endian, 52 bytes)::

     0  4  magic 'OCKP'
     4  2  version (1)
     6  2  flags: bit 0 = written by a clean shutdown
     8  8  dispatch_safe_offset   every ConsumeQueue and IndexFile entry for records before this
                                  CommitLog offset was fsynced, and so was the CommitLog itself
    16  8  commit_log_flushed     CommitLog fsynced up to here
    24  8  clean_end_offset       clean shutdown only: the CommitLog end (else -1)
    32  8  last_record_offset     clean shutdown only: start of the last record (else -1)
    40  8  written_at_ms
    48  4  CRC32C of bytes [0, 48)

A checkpoint that fails its CRC is ignored (recovery then starts from the oldest segment).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

from orbitmq.common.files import WriteOps, write_atomically

_MAGIC = 0x4F434B50
_BODY = struct.Struct(">IHHqqqqq")
_CRC = struct.Struct(">I")
FLAG_CLEAN = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    dispatch_safe_offset: int = 0
    commit_log_flushed: int = 0
    clean_end_offset: int = -1
    last_record_offset: int = -1
    written_at_ms: int = 0
    clean: bool = False

    def encode(self) -> bytes:
        body = _BODY.pack(
            _MAGIC, 1, FLAG_CLEAN if self.clean else 0, self.dispatch_safe_offset,
            self.commit_log_flushed, self.clean_end_offset, self.last_record_offset,
            self.written_at_ms,
        )  # fmt: skip
        return body + _CRC.pack(crc32c.crc32c(body))

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint | None:
        if len(raw) != _BODY.size + _CRC.size:
            return None
        body = raw[: _BODY.size]
        if _CRC.unpack_from(raw, _BODY.size)[0] != crc32c.crc32c(body):
            return None
        magic, version, flags, safe, flushed, end, last, at = _BODY.unpack(body)
        if magic != _MAGIC or version != 1:
            return None
        return cls(safe, flushed, end, last, at, bool(flags & FLAG_CLEAN))

    def save(self, path: Path, ops: WriteOps | None = None) -> None:
        write_atomically(path, self.encode(), ops=ops)

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            return cls.decode(path.read_bytes())
        except FileNotFoundError:
            return None
