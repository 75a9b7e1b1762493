"""Message payloads on the wire: send bodies and pull bodies.

Send (SEND_MESSAGE and SEND_BATCH_MESSAGE) header fields: ``topic``, ``queue_id``, ``flag``,
``sys_flag``, ``born_ts`` (ms), ``reconsume_times``; the body packs the messages::

    repeated: u32 BODY_LENGTH | u16 PROPERTIES_LENGTH | BODY | PROPERTIES

PROPERTIES is RocketMQ's ``name\\x01value\\x02`` encoding, which is also how they are stored, so
the broker appends them untouched. A pull response's body is the stored records back to back,
exactly as they are in the CommitLog (see ``orbitmq.common.record``): the broker sends slices of
its mapped files, and the client decodes them with the same codec the store writes with.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from orbitmq.common.errors import ProtocolError
from orbitmq.common.record import RecordError, StoredMessage, check_record, decode

_ITEM = struct.Struct(">IH")


def encode_send_body(bodies: Sequence[bytes], properties: Sequence[bytes]) -> bytes:
    parts: list[bytes] = []
    pack = _ITEM.pack
    for body, props in zip(bodies, properties, strict=True):
        parts += (pack(len(body), len(props)), body, props)
    return b"".join(parts)


def decode_send_body(data: bytes, max_messages: int = 1 << 20) -> tuple[list[bytes], list[bytes]]:
    """Split a send body; raises ProtocolError if the lengths do not tile the body exactly."""
    bodies: list[bytes] = []
    props: list[bytes] = []
    pos = 0
    end = len(data)
    unpack = _ITEM.unpack_from
    while pos < end:
        if end - pos < _ITEM.size:
            raise ProtocolError("send body ends inside a message header")
        blen, plen = unpack(data, pos)
        pos += _ITEM.size
        if pos + blen + plen > end:
            raise ProtocolError("send body ends inside a message")
        bodies.append(data[pos : pos + blen])
        pos += blen
        props.append(data[pos : pos + plen])
        pos += plen
        if len(bodies) > max_messages:
            raise ProtocolError("too many messages in one send")
    return bodies, props


def decode_records(data: bytes | memoryview) -> list[StoredMessage]:
    """Decode a pull body (stored records back to back); ProtocolError if one fails its CRC."""
    view = memoryview(data)
    out: list[StoredMessage] = []
    pos = 0
    while pos < len(view):
        try:
            size = check_record(view, pos, len(view))
        except RecordError as exc:
            raise ProtocolError(f"record at {pos} of a pull body: {exc}") from exc
        if size <= 0:
            raise ProtocolError("filler in a pull body")
        out.append(decode(view[pos : pos + size]))
        pos += size
    return out
