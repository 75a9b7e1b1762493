"""SendMessage from raw bytes: the request scanned for the fields a plain send needs, the answer
written as bytes, no protobuf objects on the way (issue #15).

gRPC hands this path the request's bytes (no deserializer). :func:`scan_send` reads one
``SendMessageRequest`` holding one NORMAL message (topic, body, tag, keys, message id, user
properties; the fields the proxy ignores on any send -- born time and host, digest, trace
context -- are skipped). Anything else returns None and the call takes the full path
(``FromString`` and :mod:`orbitmq.proxy.producer_service`): several messages, FIFO, delay or
transaction messages, a gzip body, a field it does not know, a string that is not UTF-8, a
sub-message given twice (protobuf would merge them). So the fast path never answers what the
full path would answer differently: it runs the same checks (convert.py's ``check_*``), the same
topic-type check and the same producer call, and its answer is byte-for-byte what protobuf
serializes for the full path's response (:func:`ok_response`, tested against upb).

Why: per call, the generated classes' parse, the attribute reads of ``from_pb_message``, the
response objects and four coroutine layers cost more Python than the scan; see docs/proxy.md.
"""

from __future__ import annotations

from orbitmq.common.errors import MQError
from orbitmq.common.message import PROPERTY_UNIQ_KEY, Message
from orbitmq.proxy import status
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import (
    NORMAL,
    check_body,
    check_keys,
    check_message_id,
    check_tag,
    checked_properties,
    checked_topic,
)
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.producer_service import send_status

__all__ = ["RawSend", "ScannedSend", "ok_response", "scan_send"]

_IDENTITY = 1
_ACCEPTS_NORMAL = frozenset({"NORMAL", "MIXED"})
"""Topic types (producer_service.ACCEPT_TYPES) that take a NORMAL message."""
_SKIPPED_SYSTEM_FIELDS = frozenset({4, 7, 8, 9, 10, 18})
"""SystemProperties fields no send reads: body_digest, born_timestamp, born_host,
store_timestamp, store_host, trace_context."""

ScannedSend = tuple[str, str, bytes, str | None, list[str], str, dict[str, str]]
"""(namespace, topic name, body, tag or None, keys, message id, user properties)."""


class _Unusual(Exception):
    """The request is not a plain one-message send: the full path takes it."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift = b & 0x7F, 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unusual


def _fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) of each field in ``buf[start:end]``; a
    length-delimited field's bytes are ``buf[start:end]``, a varint's value is the third item."""
    out = []
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise _Unusual
            out.append((key >> 3, 2, pos, pos + n))
            pos += n
        elif wire == 0:
            value, pos = _varint(buf, pos)
            out.append((key >> 3, 0, value, pos))
        elif wire == 1:
            pos += 8
            out.append((key >> 3, 1, 0, pos))
        elif wire == 5:
            pos += 4
            out.append((key >> 3, 5, 0, pos))
        else:  # groups: no field of this protocol is one
            raise _Unusual
    if pos != end:
        raise _Unusual
    return out


def _text(buf: bytes, start: int, end: int) -> str:
    return buf[start:end].decode()  # UnicodeDecodeError is a ValueError: caught by scan_send


def scan_send(data: bytes) -> ScannedSend | None:
    """The plain one-message send in ``data``, or None when the full path must take it."""
    try:
        return _scan(data)
    except (_Unusual, IndexError, ValueError):
        return None


def _scan(buf: bytes) -> ScannedSend | None:
    top = _fields(buf, 0, len(buf))
    if len(top) != 1 or top[0][0] != 1 or top[0][1] != 2:
        return None
    _, _, mstart, mend = top[0]
    namespace = name = message_id = ""
    body = b""
    tag: str | None = None
    keys: list[str] = []
    props: dict[str, str] = {}
    seen_topic = seen_system = False
    for num, wire, a, b in _fields(buf, mstart, mend):
        if wire != 2:
            return None
        if num == 4:
            body = buf[a:b]
        elif num == 1:
            if seen_topic:
                return None
            seen_topic = True
            for rnum, rwire, ra, rb in _fields(buf, a, b):
                if rwire != 2:
                    return None
                if rnum == 2:
                    name = _text(buf, ra, rb)
                elif rnum == 1:
                    namespace = _text(buf, ra, rb)
                else:
                    return None
        elif num == 3:
            if seen_system:
                return None
            seen_system = True
            for snum, swire, sa, sb in _fields(buf, a, b):
                if snum in _SKIPPED_SYSTEM_FIELDS:
                    continue
                if snum == 1 and swire == 2:
                    tag = _text(buf, sa, sb)
                elif snum == 2 and swire == 2:
                    keys.append(_text(buf, sa, sb))
                elif snum == 3 and swire == 2:
                    message_id = _text(buf, sa, sb)
                elif snum == 5 and swire == 0:
                    if sa > _IDENTITY:  # gzip (or unknown): the full path decides
                        return None
                elif snum == 6 and swire == 0:
                    if sa > NORMAL:  # FIFO, delay, transaction, lite, priority
                        return None
                else:
                    return None
        elif num == 2:
            key = value = ""
            for enum, ewire, ea, eb in _fields(buf, a, b):
                if ewire != 2:
                    return None
                if enum == 1:
                    key = _text(buf, ea, eb)
                elif enum == 2:
                    value = _text(buf, ea, eb)
                else:
                    return None
            props[key] = value  # a key given twice: the last wins, as in protobuf maps
        else:
            return None
    return namespace, name, body, tag, keys, message_id, props


# ---------------------------------------------------------------------------- the answer


def _put_varint(out: bytearray, value: int) -> None:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives as protobuf writes them: ten bytes
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


_OK_STATUS = status.ok().SerializeToString()
_OK_STATUS_FIELD = b"\x0a" + bytes([len(_OK_STATUS)]) + _OK_STATUS


def ok_response(message_id: str, offset: int) -> bytes:
    """``SendMessageResponse(status=OK, entries=[SendResultEntry(status=OK, message_id,
    offset)])`` serialized, as protobuf would write it (fields in number order, zero omitted)."""
    entry = bytearray(_OK_STATUS_FIELD)
    mid = message_id.encode()
    entry.append(0x12)
    _put_varint(entry, len(mid))
    entry += mid
    if offset:
        entry.append(0x20)
        _put_varint(entry, offset)
    out = bytearray(_OK_STATUS_FIELD)
    out.append(0x12)
    _put_varint(out, len(entry))
    out += entry
    return bytes(out)


class RawSend:
    """The raw path's send: ``await raw.send(data)`` is the answer's bytes and its code's name,
    or None when the request is not a plain send (nothing was done then)."""

    def __init__(self, ctx: ProxyContext) -> None:
        self.ctx = ctx
        self.max_body = ctx.config.max_message_size

    async def send(self, data: bytes) -> tuple[bytes, str] | None:
        scanned = scan_send(data)
        if scanned is None:
            return None
        namespace, name, body, tag, keys, message_id, user = scanned
        try:
            topic = checked_topic(namespace, name)
            declared = self.ctx.topic_types.cached(topic)
            if declared is None or declared not in _ACCEPTS_NORMAL:
                return None  # unknown yet (a lookup) or a refusal: the full path's words
            check_message_id(message_id)
            check_body(body, self.max_body)
            props = checked_properties(user) if user else {}
            if tag is not None:
                check_tag(tag)
            if keys:
                check_keys(keys)
            props[PROPERTY_UNIQ_KEY] = message_id
            msg = Message(topic, body, tags=tag, keys=keys, properties=props)
            result = await self.ctx.producer.send_async(msg)
        except MQError as exc:
            return _answer(status.from_error(exc), message_id, 0)
        name = result.status.name
        if name != "SEND_OK":
            return _answer(send_status(name), message_id, result.queue_offset)
        return ok_response(message_id, result.queue_offset), "OK"


def _answer(st: pb.Status, message_id: str, offset: int) -> tuple[bytes, str]:
    """A one-entry answer whose status is not OK, built the full path's way."""
    resp = svc.SendMessageResponse()
    entry = resp.entries.add()
    entry.status.CopyFrom(st)
    entry.message_id = message_id
    entry.offset = offset
    resp.status.CopyFrom(st)
    code = int(st.code)
    name = pb.Code.Name(code) if code in pb.Code.values() else str(code)
    return resp.SerializeToString(), name
