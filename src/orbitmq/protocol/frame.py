"""OrbitMQ Remoting frames, sans-IO: bytes in, frames out; frames in, bytes out.

A frame, big-endian::

     0  4  LENGTH      u32  bytes after this field: 12 + HEADER_LEN + body; <= max_frame_size
     4  1  VERSION     u8   framing version, 1
     5  1  FLAGS       u8   bit 0 RESPONSE, bit 1 ONEWAY (no response expected)
     6  2  CODE        u16  request code (a request) or response code (a response)
     8  4  OPAQUE      u32  correlation id chosen by the requester, echoed in the response
    12  4  HEADER_LEN  u32
    16  H  HEADER      msgpack map, str keys -> nil | bool | int | float | str | bytes | list | map
    16+H   BODY        whatever is left; its meaning depends on CODE

Like RocketMQ Remoting, a frame is a code, a correlation id, a small map of named fields
("extFields", with "remark" carrying an error text in responses) and an opaque body. The
header is msgpack rather than JSON: compact, typed and decoded in C.

Compatibility: readers ignore fields they do not know, and writers add fields rather than
change them, so a newer client talks to an older broker as long as it asks for nothing the
broker lacks (which answers REQUEST_CODE_NOT_SUPPORTED). VERSION changes only if this framing
itself changes; a server answers a frame of a higher version with VERSION_NOT_SUPPORTED.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from orbitmq.common.errors import ProtocolError

VERSION = 1
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
PREFIX = struct.Struct(">IBBHII")
PREFIX_SIZE = PREFIX.size  # 16
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024 + 64 * 1024
MAX_HEADER_SIZE = 64 * 1024
BIG_BODY = 256 * 1024
"""A frame with this much body or more is gathered in pieces (see :class:`FrameDecoder`)."""

Buffer = bytes | bytearray | memoryview

_encode_header = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(dict[str, Any]).decode
_EMPTY_HEADER = _encode_header({})


@dataclass(slots=True)
class Frame:
    code: int
    opaque: int = 0
    flags: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    body: Buffer = b""
    version: int = VERSION

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)

    @property
    def remark(self) -> str:
        value = self.fields.get("remark", "")
        return value if isinstance(value, str) else str(value)

    def reply(
        self, code: int, remark: str = "", fields: dict[str, Any] | None = None, body: Buffer = b""
    ) -> Frame:
        """The response to this request (same opaque)."""
        out = dict(fields) if fields else {}
        if remark:
            out["remark"] = remark
        return Frame(code, self.opaque, FLAG_RESPONSE, out, body)


def encode(frame: Frame, body_parts: Sequence[Buffer] | None = None) -> list[Buffer]:
    """The frame as buffers for ``transport.writelines``. ``body_parts`` (instead of
    ``frame.body``) lets a pull response hand out CommitLog slices without joining them."""
    header = _encode_header(frame.fields) if frame.fields else _EMPTY_HEADER
    if len(header) > MAX_HEADER_SIZE:
        raise ProtocolError(f"header of {len(header)} bytes is over {MAX_HEADER_SIZE}")
    parts: Sequence[Buffer] = body_parts if body_parts is not None else (frame.body,)
    body_len = sum(len(p) for p in parts)  # memoryview len is items, and records are bytes
    length = PREFIX_SIZE - 4 + len(header) + body_len
    try:
        prefix = PREFIX.pack(
            length, frame.version, frame.flags, frame.code, frame.opaque & 0xFFFFFFFF, len(header)
        )
    except struct.error as exc:  # a code, version or flags outside its field
        raise ProtocolError(f"frame code={frame.code} cannot be encoded: {exc}") from None
    return [prefix + header, *(p for p in parts if len(p))]


def encode_bytes(frame: Frame) -> bytes:
    return b"".join(encode(frame))


class FrameDecoder:
    """Feed it bytes as they arrive; it returns every complete frame.

    Raises ProtocolError on a length outside [12, max_frame_size], a header that is not a
    msgpack map with string keys, or a header longer than the frame. After an error the
    connection must be closed: the stream has lost its framing.

    A frame of :data:`BIG_BODY` bytes or more of body (a large pull answer, a large send
    batch) is not grown in the buffer: once its header is in, the body's pieces are kept as
    they come and joined once when the last arrives. Growing a bytearray by 64 KiB reads
    re-copies it as it grows and slicing the body out copies it again; a pull client spent
    ~30 % of its loop thread in those copies.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._big: Frame | None = None
        """The frame whose body is being gathered in ``_pieces`` (body still empty)."""
        self._pieces: list[Buffer] = []
        self._missing = 0
        self._head = 0  # the big frame's prefix and header, already decoded

    @property
    def buffered(self) -> int:
        """Bytes fed that are not in a returned frame yet."""
        big = self._head + sum(len(p) for p in self._pieces) if self._big is not None else 0
        return len(self._buf) + big

    def feed(self, data: Buffer) -> list[Frame]:
        frames: list[Frame] = []
        if self._big is not None:
            data = self._gather(data, frames)
            if not data:
                return frames
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:  # slices of a view copy once; slices of buf copy twice
            pos = self._frames(view, end, frames)
        if pos:
            del buf[:pos]
        return frames

    def _gather(self, data: Buffer, frames: list[Frame]) -> Buffer:
        """Add ``data`` to the big frame's body; what is left after its end."""
        big = self._big
        assert big is not None
        take = min(len(data), self._missing)
        self._pieces.append(data if take == len(data) else memoryview(data)[:take])
        self._missing -= take
        if self._missing:
            return b""
        big.body = b"".join(self._pieces)
        frames.append(big)
        self._big = None
        self._pieces = []
        return memoryview(data)[take:] if take < len(data) else b""

    def _frames(self, buf: memoryview, end: int, frames: list[Frame]) -> int:
        pos = 0
        while end - pos >= PREFIX_SIZE:
            length, version, flags, code, opaque, header_len = PREFIX.unpack_from(buf, pos)
            if length < PREFIX_SIZE - 4 or length > self.max_frame_size:
                raise ProtocolError(f"frame length {length} outside [12, {self.max_frame_size}]")
            if header_len > length - (PREFIX_SIZE - 4) or header_len > MAX_HEADER_SIZE:
                raise ProtocolError(f"header length {header_len} does not fit the frame")
            h_at = pos + PREFIX_SIZE
            b_at = h_at + header_len
            stop = pos + 4 + length
            complete = end - pos >= 4 + length
            big = not complete and stop - b_at >= BIG_BODY and end >= b_at
            if not complete and not big:
                break
            try:
                fields = _decode_header(bytes(buf[h_at:b_at])) if header_len else {}
            except (
                msgspec.DecodeError,
                msgspec.ValidationError,
                UnicodeDecodeError,
                RecursionError,  # a header of deeply nested arrays (found by fuzzing)
            ) as exc:
                raise ProtocolError(f"bad frame header: {exc}") from exc
            if big:  # the rest of the buffer is the start of its body: gathered from now on
                self._big = Frame(code, opaque, flags, fields, b"", version)
                self._pieces = [bytes(buf[b_at:end])]
                self._missing = stop - end
                self._head = b_at - pos
                return end
            frames.append(Frame(code, opaque, flags, fields, bytes(buf[b_at:stop]), version))
            pos = stop
        return pos
