"""The HA link between a master and its slaves, sans-IO: frames in, bytes out; bytes in, frames.

The link runs on the broker port + 1 and carries the master's CommitLog to its slaves, the way
RocketMQ's AutoSwitchHA does. A slave connects and sends HANDSHAKE (its broker id, group name,
epoch list and max offset); the master answers with a HANDSHAKE of its own (its epoch list and
max offset), from which the slave works out where its log diverges
(:func:`orbitmq.store.epoch.divergence_offset`), truncates, and acks its new end. The master
then streams TRANSFER frames of raw CommitLog bytes; the slave appends them and ACKs. Either
side may send HEARTBEAT; ERROR says why a side is about to close the link.

Every frame, big-endian::

     0  4  LENGTH        u32  bytes after this field: 6 + the frame's own fields + payload
     4  1  VERSION       u8   1
     5  1  TYPE          u8   1 HANDSHAKE, 2 TRANSFER, 3 ACK, 4 HEARTBEAT, 5 ERROR,
                              6 SEGMENT_KEY
     6  4  MASTER_EPOCH  u32  the master epoch the sender knows (a slave: the one the
                              controller gave it); a peer drops a link below its own
    10     fields of TYPE:

    HANDSHAKE  broker_id u64, max_offset i64, name_len u8, name (UTF-8), count u16,
               count x (epoch u32, start_offset i64), strictly increasing epochs
    TRANSFER   offset i64 (of the payload's first byte), epoch u32 (of the payload),
               epoch_start i64, confirm_offset i64, payload (whole records of one epoch)
    ACK        max_offset i64 (written), flushed_offset i64
    HEARTBEAT  max_offset i64, confirm_offset i64
    ERROR      code u16, message (UTF-8, at most 1 KiB)
    SEGMENT_KEY  segment_start i64, wrapped (the segment's DEK file as the master keeps it:
               wrapped under the master key, at most 256 bytes); an encrypted master sends it
               before the first TRANSFER of a segment (docs/security.md)

Why a fixed binary layout rather than the Remoting frame's msgpack header: a TRANSFER is sent
tens of thousands of times a second and carries four integers; the payload is the CommitLog's
own bytes, handed to the socket without a copy (:func:`encode_parts`). A TRANSFER never crosses
an epoch boundary (KIP-101: the slave must know which epoch every byte belongs to), so
``epoch_start <= offset``. Sizes are bounded: a frame is at most ``max_payload`` plus its
fields, an epoch list at most :data:`MAX_EPOCHS` entries; anything else is a ProtocolError,
after which the link must be closed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from orbitmq.common.errors import ProtocolError

VERSION = 1
HANDSHAKE, TRANSFER, ACK, HEARTBEAT, ERROR, SEGMENT_KEY = 1, 2, 3, 4, 5, 6
MAX_WRAPPED = 256
PREFIX = struct.Struct(">IBBI")  # length, version, type, master epoch
PREFIX_SIZE = PREFIX.size  # 10
DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024
"""A TRANSFER holds whole records, so this must exceed the largest record the store accepts."""
MAX_EPOCHS = 4096
MAX_NAME = 255
MAX_ERROR_TEXT = 1024
MAX_U32 = 2**32 - 1
MAX_I64 = 2**63 - 1

_HANDSHAKE = struct.Struct(">QqB")
_EPOCH_ENTRY = struct.Struct(">Iq")
_COUNT = struct.Struct(">H")
_TRANSFER = struct.Struct(">qIqq")
_ACK = struct.Struct(">qq")
_HEARTBEAT = struct.Struct(">qq")
_ERROR = struct.Struct(">H")
_KEY = struct.Struct(">q")

Buffer = bytes | bytearray | memoryview
EpochList = tuple[tuple[int, int], ...]
"""(epoch, start offset) pairs, oldest first."""

# Error codes carried by ERROR.
ERR_FENCED = 1  # the peer's epoch is below ours
ERR_NO_COMMON_EPOCH = 2  # the logs share no epoch: the slave must be resynced
ERR_OFFSET_MISMATCH = 3  # a TRANSFER did not start at the slave's end
ERR_BAD_DATA = 4  # a TRANSFER failed validation
ERR_NOT_MASTER = 5


@dataclass(frozen=True, slots=True)
class Handshake:
    master_epoch: int
    broker_id: int
    broker_name: str
    epochs: EpochList
    max_offset: int


@dataclass(frozen=True, slots=True)
class Transfer:
    master_epoch: int
    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    payload: Buffer = b""

    @property
    def end(self) -> int:
        return self.offset + len(self.payload)


@dataclass(frozen=True, slots=True)
class Ack:
    master_epoch: int
    max_offset: int
    flushed_offset: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    master_epoch: int
    max_offset: int = 0
    confirm_offset: int = 0


@dataclass(frozen=True, slots=True)
class HaError:
    master_epoch: int
    code: int
    message: str = field(default="")


@dataclass(frozen=True, slots=True)
class SegmentKey:
    master_epoch: int
    segment_start: int
    wrapped: bytes


HaFrame = Handshake | Transfer | Ack | Heartbeat | HaError | SegmentKey


def _check_epochs(epochs: Sequence[tuple[int, int]]) -> None:
    if len(epochs) > MAX_EPOCHS:
        raise ProtocolError(f"{len(epochs)} epochs, more than {MAX_EPOCHS}")
    last_epoch, last_start = -1, 0
    for epoch, start in epochs:
        if not 0 <= epoch <= MAX_U32 or not 0 <= start <= MAX_I64:
            raise ProtocolError(f"epoch entry ({epoch}, {start}) out of range")
        if epoch <= last_epoch or start < last_start:
            raise ProtocolError("epochs must increase and their start offsets not decrease")
        last_epoch, last_start = epoch, start


def _check_offsets(*values: int) -> None:
    for v in values:
        if not 0 <= v <= MAX_I64:
            raise ProtocolError(f"offset {v} out of range")


def _check_transfer(f: Transfer) -> None:
    _check_offsets(f.offset, f.epoch_start, f.confirm_offset)
    if not 0 <= f.epoch <= MAX_U32:
        raise ProtocolError(f"epoch {f.epoch} out of range")
    if f.epoch_start > f.offset:
        raise ProtocolError(f"transfer at {f.offset} starts before its epoch ({f.epoch_start})")
    if f.epoch > f.master_epoch:
        raise ProtocolError(f"data epoch {f.epoch} above the master epoch {f.master_epoch}")


def _check_key(f: SegmentKey) -> None:
    _check_offsets(f.segment_start)
    if not 0 < len(f.wrapped) <= MAX_WRAPPED:
        raise ProtocolError(f"wrapped key of {len(f.wrapped)} bytes outside [1, {MAX_WRAPPED}]")


def _fields(frame: HaFrame) -> tuple[int, bytes]:
    """(type, encoded fields) of a frame, validated as the decoder would validate it."""
    if isinstance(frame, Transfer):
        _check_transfer(frame)
        return TRANSFER, _TRANSFER.pack(
            frame.offset, frame.epoch, frame.epoch_start, frame.confirm_offset
        )
    if isinstance(frame, Ack):
        _check_offsets(frame.max_offset, frame.flushed_offset)
        return ACK, _ACK.pack(frame.max_offset, frame.flushed_offset)
    if isinstance(frame, Heartbeat):
        _check_offsets(frame.max_offset, frame.confirm_offset)
        return HEARTBEAT, _HEARTBEAT.pack(frame.max_offset, frame.confirm_offset)
    if isinstance(frame, SegmentKey):
        _check_key(frame)
        return SEGMENT_KEY, _KEY.pack(frame.segment_start) + frame.wrapped
    if isinstance(frame, Handshake):
        name = frame.broker_name.encode()
        if len(name) > MAX_NAME:
            raise ProtocolError(f"broker name of {len(name)} bytes is over {MAX_NAME}")
        if not 0 <= frame.broker_id < 2**64:
            raise ProtocolError(f"broker id {frame.broker_id} out of range")
        _check_offsets(frame.max_offset)
        _check_epochs(frame.epochs)
        parts = [_HANDSHAKE.pack(frame.broker_id, frame.max_offset, len(name)), name]
        parts.append(_COUNT.pack(len(frame.epochs)))
        parts += [_EPOCH_ENTRY.pack(e, s) for e, s in frame.epochs]
        return HANDSHAKE, b"".join(parts)
    text = frame.message.encode()[:MAX_ERROR_TEXT].decode("utf-8", "ignore").encode()
    if not 0 <= frame.code <= 0xFFFF:
        raise ProtocolError(f"error code {frame.code} out of range")
    return ERROR, _ERROR.pack(frame.code) + text


def encode_parts(frame: HaFrame, max_payload: int = DEFAULT_MAX_PAYLOAD) -> list[Buffer]:
    """The frame as buffers for ``transport.writelines``; a TRANSFER's payload is not copied."""
    kind, fields = _fields(frame)
    payload = frame.payload if isinstance(frame, Transfer) else b""
    if len(payload) > max_payload:
        raise ProtocolError(f"payload of {len(payload)} bytes is over {max_payload}")
    if not 0 <= frame.master_epoch <= MAX_U32:
        raise ProtocolError(f"master epoch {frame.master_epoch} out of range")
    length = PREFIX_SIZE - 4 + len(fields) + len(payload)
    head = PREFIX.pack(length, VERSION, kind, frame.master_epoch) + fields
    return [head, payload] if len(payload) else [head]


def encode(frame: HaFrame, max_payload: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    return b"".join(encode_parts(frame, max_payload))


_FIXED = {
    HANDSHAKE: _HANDSHAKE.size + _COUNT.size,
    TRANSFER: _TRANSFER.size,
    ACK: _ACK.size,
    HEARTBEAT: _HEARTBEAT.size,
    ERROR: _ERROR.size,
    SEGMENT_KEY: _KEY.size + 1,
}


def _decode_handshake(epoch: int, body: memoryview) -> Handshake:
    broker_id, max_offset, name_len = _HANDSHAKE.unpack_from(body, 0)
    at = _HANDSHAKE.size
    if at + name_len + _COUNT.size > len(body):
        raise ProtocolError("handshake name runs past the frame")
    try:
        name = str(body[at : at + name_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"broker name is not UTF-8: {exc}") from None
    at += name_len
    (count,) = _COUNT.unpack_from(body, at)
    at += _COUNT.size
    if count > MAX_EPOCHS:
        raise ProtocolError(f"{count} epochs, more than {MAX_EPOCHS}")
    if at + count * _EPOCH_ENTRY.size != len(body):
        raise ProtocolError("handshake epoch list does not fill the frame")
    epochs = tuple(_EPOCH_ENTRY.iter_unpack(body[at:]))
    _check_offsets(max_offset)
    _check_epochs(epochs)
    return Handshake(epoch, broker_id, name, epochs, max_offset)


def _decode(kind: int, epoch: int, body: memoryview) -> HaFrame:
    if len(body) < _FIXED[kind]:
        raise ProtocolError(f"frame type {kind} too short ({len(body)} bytes)")
    if kind == TRANSFER:
        offset, data_epoch, epoch_start, confirm = _TRANSFER.unpack_from(body, 0)
        frame = Transfer(epoch, offset, data_epoch, epoch_start, confirm, bytes(body[28:]))
        _check_transfer(frame)
        return frame
    if kind == HANDSHAKE:
        return _decode_handshake(epoch, body)
    if kind == SEGMENT_KEY:
        key = SegmentKey(epoch, _KEY.unpack_from(body, 0)[0], bytes(body[_KEY.size :]))
        _check_key(key)
        return key
    if kind == ERROR:
        (code,) = _ERROR.unpack_from(body, 0)
        if len(body) - _ERROR.size > MAX_ERROR_TEXT:
            raise ProtocolError("error text too long")
        try:
            return HaError(epoch, code, str(body[_ERROR.size :], "utf-8"))
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"error text is not UTF-8: {exc}") from None
    if len(body) != _FIXED[kind]:
        raise ProtocolError(f"frame type {kind} has {len(body)} bytes, not {_FIXED[kind]}")
    a, b = _ACK.unpack_from(body, 0)
    _check_offsets(a, b)
    return Ack(epoch, a, b) if kind == ACK else Heartbeat(epoch, a, b)


class HaDecoder:
    """Feed it bytes as they arrive; it returns every complete frame.

    Raises ProtocolError (and nothing else) on a bad length, version, type or field; the
    link must then be closed, as its framing is lost.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        # The largest frame: a handshake with a full epoch list, or a TRANSFER's fields + payload.
        handshake_max = _FIXED[HANDSHAKE] + MAX_NAME + MAX_EPOCHS * _EPOCH_ENTRY.size
        self.max_length = PREFIX_SIZE - 4 + max(handshake_max, _TRANSFER.size + max_payload)
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: Buffer) -> list[HaFrame]:
        buf = self._buf
        buf += data
        frames: list[HaFrame] = []
        pos = 0
        with memoryview(buf) as view:
            pos = self._frames(view, frames)
        if pos:
            del buf[:pos]
        return frames

    def _frames(self, view: memoryview, frames: list[HaFrame]) -> int:
        pos, end = 0, len(view)
        while end - pos >= PREFIX_SIZE:
            length, version, kind, epoch = PREFIX.unpack_from(view, pos)
            if version != VERSION:
                raise ProtocolError(f"HA frame version {version}, expected {VERSION}")
            if kind not in _FIXED:
                raise ProtocolError(f"unknown HA frame type {kind}")
            if length < PREFIX_SIZE - 4 or length > self.max_length:
                raise ProtocolError(f"HA frame length {length} outside [6, {self.max_length}]")
            if kind == TRANSFER and length - (PREFIX_SIZE - 4) - _TRANSFER.size > self.max_payload:
                raise ProtocolError(f"TRANSFER payload over {self.max_payload} bytes")
            stop = pos + 4 + length
            if stop > end:
                break
            with view[pos + PREFIX_SIZE : stop] as body:
                frames.append(_decode(kind, epoch, body))
            pos = stop
        return pos
