"""Message payloads on the wire: send bodies and pull bodies.

Send (SEND_MESSAGE and SEND_BATCH_MESSAGE) header fields: ``topic``, ``queue_id``, ``flag``,
``sys_flag``, ``born_ts`` (ms), ``reconsume_times``; the body packs the messages with their
lengths up front, so a receiver splits a batch of any size with a few array operations::

    u32 COUNT
    COUNT x u32 BODY_LENGTH
    COUNT x u16 PROPERTIES_LENGTH
    BODY_0 .. BODY_{COUNT-1}                  back to back
    PROPERTIES_0 .. PROPERTIES_{COUNT-1}      back to back

PROPERTIES is RocketMQ's ``name\x01value\x02`` encoding, which is also how they are stored, so
the broker appends them untouched. A pull response's body is the stored records back to back,
exactly as they are in the CommitLog (see ``orbitmq.common.record``): the broker sends slices of
its mapped files, and the client decodes them with the same codec the store writes with.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from orbitmq.common.errors import ProtocolError
from orbitmq.common.record import RecordError, StoredMessage, decode_batch

_COUNT = struct.Struct(">I")
MAX_SEND_MESSAGES = 1 << 20

Buffer = bytes | bytearray | memoryview


def encode_send_body(bodies: Sequence[Buffer], properties: Sequence[bytes]) -> bytes:
    n = len(bodies)
    if len(properties) != n:
        raise ValueError("bodies and properties differ in length")
    lengths = struct.pack(f">I{n}I{n}H", n, *map(len, bodies), *map(len, properties))
    return b"".join((lengths, *bodies, *properties))


class SendBody:
    """A decoded send body. ``bodies`` are zero-copy views of the frame; ``properties`` are
    small bytes objects; ``properties_block`` holds all of them back to back, at
    ``properties_starts``, for searches over every message at once. ``body_total`` and
    ``body_length_list`` are plain ints; the numpy arrays are made on first use only for a
    small send (a few microseconds each that the usual send, counted and stored, never needs)."""

    __slots__ = (
        "_body_lengths",
        "_prop_lens",
        "_prop_starts",
        "_properties_lengths",
        "_properties_starts",
        "bodies",
        "body_length_list",
        "body_total",
        "properties",
        "properties_block",
    )

    def __init__(
        self,
        bodies: list[memoryview],
        properties: list[bytes],
        body_lengths: np.ndarray | Sequence[int],
        properties_lengths: np.ndarray | Sequence[int],
        properties_block: bytes,
        properties_starts: np.ndarray | Sequence[int],
    ) -> None:
        self.bodies = bodies
        self.properties = properties
        self.properties_block = properties_block
        self._body_lengths: np.ndarray | None = None
        self._properties_lengths: np.ndarray | None = None
        self._properties_starts: np.ndarray | None = None
        if isinstance(body_lengths, np.ndarray):
            self.body_length_list: list[int] = body_lengths.tolist()
            self._body_lengths = body_lengths
        else:
            self.body_length_list = list(body_lengths)
        if isinstance(properties_lengths, np.ndarray):
            self._properties_lengths = properties_lengths
        if isinstance(properties_starts, np.ndarray):
            self._properties_starts = properties_starts
        self.body_total = sum(self.body_length_list)
        self._prop_lens = properties_lengths
        self._prop_starts = properties_starts

    @property
    def body_lengths(self) -> np.ndarray:
        if self._body_lengths is None:
            self._body_lengths = np.array(self.body_length_list, dtype=np.int64)
        return self._body_lengths

    @property
    def properties_lengths(self) -> np.ndarray:
        if self._properties_lengths is None:
            self._properties_lengths = np.array(self._prop_lens, dtype=np.int64)
        return self._properties_lengths

    @property
    def properties_starts(self) -> np.ndarray:
        if self._properties_starts is None:
            self._properties_starts = np.array(self._prop_starts, dtype=np.int64)
        return self._properties_starts


_FEW = 16
"""Up to this many messages, struct and a loop split a send body faster than numpy's fixed cost
(a few sends a millisecond of 5-10 messages each is the latency benchmark's shape)."""


def decode_send_body(data: bytes, max_messages: int = MAX_SEND_MESSAGES) -> SendBody:
    """Split a send body; ProtocolError if its lengths do not tile it exactly."""
    if len(data) < _COUNT.size:
        raise ProtocolError("send body has no message count")
    n = _COUNT.unpack_from(data)[0]
    if n > max_messages:
        raise ProtocolError(f"{n} messages in one send, the limit is {max_messages}")
    table_end = _COUNT.size + 6 * n
    if table_end > len(data):
        raise ProtocolError("send body ends inside its length table")
    if n <= _FEW:
        return _decode_few(data, n, table_end)
    body_lens = np.frombuffer(data, dtype=">u4", count=n, offset=4).astype(np.int64)
    prop_lens = np.frombuffer(data, dtype=">u2", count=n, offset=4 + 4 * n).astype(np.int64)
    body_ends = np.cumsum(body_lens) + table_end
    props_base = int(body_ends[-1]) if n else table_end
    prop_ends = np.cumsum(prop_lens)
    if props_base + (int(prop_ends[-1]) if n else 0) != len(data):
        raise ProtocolError("send body lengths do not add up to its size")
    view = memoryview(data)
    bodies = [
        view[a:b] for a, b in zip((body_ends - body_lens).tolist(), body_ends.tolist(), strict=True)
    ]
    block = data[props_base:]
    prop_starts = prop_ends - prop_lens
    properties = [block[a:b] for a, b in zip(prop_starts.tolist(), prop_ends.tolist(), strict=True)]
    return SendBody(bodies, properties, body_lens, prop_lens, block, prop_starts)


def _decode_few(data: bytes, n: int, table_end: int) -> SendBody:
    """The same split for a handful of messages with struct instead of numpy (whose fixed cost
    is most of a one-message send otherwise)."""
    lengths = struct.unpack_from(f">{n}I{n}H", data, 4)
    body_lens, prop_lens = lengths[:n], lengths[n:]
    view = memoryview(data)
    bodies: list[memoryview] = []
    at = table_end
    for blen in body_lens:
        bodies.append(view[at : at + blen])
        at += blen
    if at + sum(prop_lens) != len(data):
        raise ProtocolError("send body lengths do not add up to its size")
    block = data[at:]
    properties: list[bytes] = []
    starts: list[int] = []
    p = 0
    for plen in prop_lens:
        starts.append(p)
        properties.append(block[p : p + plen])
        p += plen
    return SendBody(bodies, properties, body_lens, prop_lens, block, starts)


def decode_records(data: bytes | bytearray | memoryview) -> list[StoredMessage]:
    """Decode a pull body (stored records back to back); ProtocolError if one is not a valid
    record (bad framing, a CRC mismatch, an end-of-segment filler)."""
    try:
        return decode_batch(data)
    except RecordError as exc:
        raise ProtocolError(f"pull body: {exc}") from exc
