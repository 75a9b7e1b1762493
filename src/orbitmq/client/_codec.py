"""Body compression on the client: zstd out, zstd (and RocketMQ's zlib) in.

A producer compresses a body larger than its threshold and sets ``SYSFLAG_COMPRESSED |
SYSFLAG_COMPRESSION_ZSTD`` on the send; the broker stores the compressed bytes and the flag, and
readers decompress. A record flagged COMPRESSED without the zstd bit is taken to be zlib, which is
what RocketMQ clients write by default.
"""

from __future__ import annotations

import dataclasses
import threading
import zlib

import zstandard

from orbitmq.common.errors import ProtocolError
from orbitmq.common.message import SYSFLAG_COMPRESSED, SYSFLAG_COMPRESSION_ZSTD
from orbitmq.common.record import Buffer, RecordError, StoredMessage, decode_batch

ZSTD_FLAGS = SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZSTD
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""A body that claims to inflate to more than this is refused (a broker caps bodies at 4 MiB)."""

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # A ZstdCompressor is not safe to share between threads; the blocking producer compresses
    # in the caller's thread, so each thread gets its own.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    comp = cache.get(level)
    if comp is None:
        comp = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return comp


def decode_pulled(body: Buffer, *, verify_crc: bool) -> list[StoredMessage]:
    """The records of a pull or pop answer, each record's CRC32C checked only when
    ``verify_crc``: the broker checks CRCs when it stores and when it reads from disk, and TCP
    checksums the way here, so RocketMQ's clients skip the check by default (the consumers'
    ``check_crc`` setting turns it on). Framing is always checked; ProtocolError if it fails."""
    try:
        return decode_batch(body, verify_crc=verify_crc)
    except RecordError as exc:
        raise ProtocolError(f"pull body: {exc}") from exc


def compress(body: bytes, level: int = 3) -> bytes:
    return _compressor(level).compress(body)


def decompress(body: bytes, sys_flag: int) -> bytes:
    """The plain body of a record with ``sys_flag``; ProtocolError when it does not inflate."""
    if not sys_flag & SYSFLAG_COMPRESSED:
        return body
    try:
        if sys_flag & SYSFLAG_COMPRESSION_ZSTD:
            size = zstandard.frame_content_size(body)
            if size > MAX_DECOMPRESSED_BYTES:
                raise ProtocolError(f"zstd body claims {size} bytes, over the limit")
            dobj = zstandard.ZstdDecompressor().decompressobj()
            out = dobj.decompress(body)
        else:
            zobj = zlib.decompressobj()
            out = zobj.decompress(body, MAX_DECOMPRESSED_BYTES)
            if zobj.unconsumed_tail:
                raise ProtocolError("zlib body inflates past the limit")
    except (zstandard.ZstdError, zlib.error) as exc:
        raise ProtocolError(f"compressed body does not decompress: {exc}") from exc
    if len(out) > MAX_DECOMPRESSED_BYTES:
        raise ProtocolError("compressed body inflates past the limit")
    return out


def plain(msg: StoredMessage) -> StoredMessage:
    """``msg`` with its body decompressed and the compression bits cleared (itself if plain)."""
    if not msg.sys_flag & SYSFLAG_COMPRESSED:
        return msg
    return dataclasses.replace(
        msg, body=decompress(msg.body, msg.sys_flag), sys_flag=msg.sys_flag & ~ZSTD_FLAGS
    )


def plain_all(msgs: list[StoredMessage]) -> list[StoredMessage]:
    """:func:`plain` of each message; ``msgs`` itself when none is compressed (the usual case:
    one look at each flag, no new list)."""
    for m in msgs:
        if m.sys_flag & SYSFLAG_COMPRESSED:
            return [plain(m) for m in msgs]
    return msgs
