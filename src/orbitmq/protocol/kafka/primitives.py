"""Kafka's primitive wire types: a reader over one received frame and a writer for one response.

Big-endian fixed-width integers; unsigned varints (lengths in flexible versions, tag numbers)
and zig-zag varints/varlongs (inside records). Strings are UTF-8. Every read is bounds-checked
and raises `KafkaCodecError`, so a malformed frame becomes an error answer, never an IndexError
deep in a handler.
"""

from __future__ import annotations

import struct


class KafkaCodecError(ValueError):
    """A frame that does not follow the schema (truncated, bad length, bad varint, bad UTF-8)."""


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


class Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int = -1) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end < 0 else end

    def remaining(self) -> int:
        return self.end - self.pos

    def _fixed(self, s: struct.Struct) -> int:
        pos = self.pos
        if pos + s.size > self.end:
            raise KafkaCodecError(
                f"truncated: need {s.size} bytes at {pos}, frame ends at {self.end}"
            )
        self.pos = pos + s.size
        value: int = s.unpack_from(self.buf, pos)[0]
        return value

    def int8(self) -> int:
        return self._fixed(_I8)

    def int16(self) -> int:
        return self._fixed(_I16)

    def uint16(self) -> int:
        return self._fixed(_U16)

    def int32(self) -> int:
        return self._fixed(_I32)

    def uint32(self) -> int:
        return self._fixed(_U32)

    def int64(self) -> int:
        return self._fixed(_I64)

    def float64(self) -> float:
        pos = self.pos
        if pos + 8 > self.end:
            raise KafkaCodecError(f"truncated float64 at {pos}")
        self.pos = pos + 8
        value: float = _F64.unpack_from(self.buf, pos)[0]
        return value

    def uvarint(self) -> int:
        result = shift = 0
        buf, pos, end = self.buf, self.pos, self.end
        while True:
            if pos >= end:
                raise KafkaCodecError("truncated varint")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise KafkaCodecError("varint longer than 10 bytes")
        self.pos = pos
        return result

    def varint(self) -> int:
        """Zig-zag signed varint (records' lengths, deltas)."""
        u = self.uvarint()
        return (u >> 1) ^ -(u & 1)

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise KafkaCodecError(f"length {n} at {self.pos} runs past the frame end {self.end}")
        start = self.pos
        self.pos = start + n
        return self.buf[start : start + n]

    def text(self, n: int) -> str:
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as e:
            raise KafkaCodecError(f"string is not UTF-8: {e}") from None


class Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> None:
        self.buf += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self.buf += _U16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def float64(self, v: float) -> None:
        self.buf += _F64.pack(v)

    def uvarint(self, v: int) -> None:
        if v < 0:
            raise KafkaCodecError(f"unsigned varint of a negative value {v}")
        buf = self.buf
        while v >= 0x80:
            buf.append((v & 0x7F) | 0x80)
            v >>= 7
        buf.append(v)

    def varint(self, v: int) -> None:
        self.uvarint((v << 1) ^ (v >> 63))

    def raw(self, b: bytes | bytearray | memoryview) -> None:
        self.buf += b
