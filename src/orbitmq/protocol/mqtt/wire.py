"""MQTT data representations (5.0 §1.5, 3.1.1 §1.5): integers, strings, binary data.

- Two- and four-byte integers are big-endian.
- A Variable Byte Integer is 1..4 bytes, 7 bits each, least significant first, the high
  bit saying another byte follows; at most 268,435,455. A fifth byte, or a continuation
  past the end of the data, is a Malformed Packet.
- A UTF-8 string is a two-byte length and at most 65,535 bytes of well-formed UTF-8 with no
  U+0000 (5.0 §1.5.4 [MQTT-1.5.4-1], [MQTT-1.5.4-2]); Python's strict decoder already refuses
  surrogates and overlong forms.
- Binary data is a two-byte length and that many bytes.

:class:`Reader` reads them from one packet's bytes and raises :class:`MqttProtocolError`
(Malformed Packet) on anything that runs past its end, so decoders never see an IndexError
or a struct.error.
"""

from __future__ import annotations

import struct

from orbitmq.protocol.mqtt.codes import malformed

MAX_VARINT = 268_435_455
MAX_STRING_BYTES = 65_535

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"variable byte integer {value} outside [0, {MAX_VARINT}]")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None if ``data`` ends before the integer does."""
    value = 0
    for i in range(4):
        if pos + i >= len(data):
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise malformed("variable byte integer longer than 4 bytes")


def check_string(value: str) -> bytes:
    """The UTF-8 bytes of ``value``; ValueError if MQTT does not allow it."""
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ValueError(f"string is not well-formed UTF-8: {exc}") from None
    if len(raw) > MAX_STRING_BYTES:
        raise ValueError(f"string of {len(raw)} bytes is over {MAX_STRING_BYTES}")
    if "\x00" in value:
        raise ValueError("string contains U+0000")
    return raw


def encode_string(value: str) -> bytes:
    raw = check_string(value)
    return _U16.pack(len(raw)) + raw


def encode_binary(value: bytes) -> bytes:
    if len(value) > MAX_STRING_BYTES:
        raise ValueError(f"binary data of {len(value)} bytes is over {MAX_STRING_BYTES}")
    return _U16.pack(len(value)) + bytes(value)


def u16(value: int) -> bytes:
    if not 0 <= value <= 0xFFFF:
        raise ValueError(f"two-byte integer {value} out of range")
    return _U16.pack(value)


def u32(value: int) -> bytes:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"four-byte integer {value} out of range")
    return _U32.pack(value)


class Reader:
    """Reads one packet's variable header and payload; every read is bounds-checked."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise malformed(f"needs {n} bytes, {self.end - self.pos} left in the packet")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        if self.pos >= self.end:
            raise malformed("packet ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        value: int = _U16.unpack(self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def varint(self) -> int:
        got = decode_varint(self.data[: self.end], self.pos)
        if got is None:
            raise malformed("variable byte integer runs past the packet")
        value, self.pos = got
        return value

    def string(self) -> str:
        raw = self.take(self.u16())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise malformed(f"string is not well-formed UTF-8: {exc}") from None
        if "\x00" in text:
            raise malformed("string contains U+0000")
        return text

    def binary(self) -> bytes:
        return self.take(self.u16())

    def rest(self) -> bytes:
        return self.take(self.end - self.pos)

    def done(self) -> None:
        if self.pos != self.end:
            raise malformed(f"{self.end - self.pos} unexpected bytes at the end of the packet")
