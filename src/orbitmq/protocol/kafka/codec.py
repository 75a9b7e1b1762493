"""Encode and decode any Kafka message of `messages_gen.MESSAGES` at any version it defines.

A (message, version) pair is compiled once into a list of steps (field name, read or write
function) and cached; decoding a body is then one loop over those steps. Bodies are plain dicts
with snake_case keys: a field the version does not carry is filled with its default on decode
and ignored on encode; a missing key is written as its default. Flexible versions (KIP-482) use
compact lengths and a tagged-field block after every struct: tagged fields this version knows are
decoded, unknown tags are skipped, and a tagged field is written only when it differs from its
default. A field-level `flexible` override (ClientId in the request header) keeps the classic
encoding inside a flexible header.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from orbitmq.protocol.kafka.messages_gen import MESSAGES
from orbitmq.protocol.kafka.primitives import KafkaCodecError, Reader, Writer
from orbitmq.protocol.kafka.schema_types import Field, Message, in_range

Body = dict[str, Any]
ReadFn = Callable[[Reader], Any]
WriteFn = Callable[[Writer, Any], None]

REQUESTS: dict[int, Message] = {m.api_key: m for m in MESSAGES.values() if m.type == "request"}
RESPONSES: dict[int, Message] = {m.api_key: m for m in MESSAGES.values() if m.type == "response"}


def default_value(f: Field, version: int) -> Any:
    if f.has_default:
        return f.default
    if f.kind == "array":
        return []
    if f.kind == "struct":
        return {s.name: default_value(s, version) for s in f.fields}
    return _ZERO.get(f.kind)


_ZERO: dict[str, Any] = {
    "int8": 0, "int16": 0, "uint16": 0, "int32": 0, "uint32": 0, "int64": 0, "float64": 0.0,
    "bool": False, "string": "", "bytes": b"", "uuid": bytes(16), "records": None,
}  # fmt: skip


# -- readers -------------------------------------------------------------------------------


def _reader(f: Field, kind: str, version: int, flexible: bool) -> ReadFn:
    nullable = in_range(version, f.nullable)
    if kind in ("int8", "int16", "uint16", "int32", "uint32", "int64", "float64"):
        return getattr(Reader, kind)  # type: ignore[no-any-return]  # unbound methods of Reader
    if kind == "bool":
        return lambda r: r.int8() != 0
    if kind == "uuid":
        return lambda r: bytes(r.take(16))
    if kind == "string":
        return _len_prefixed(f, nullable, flexible, short=True, text=True)
    if kind in ("bytes", "records"):
        return _len_prefixed(f, nullable, flexible, short=False, text=False)
    if kind == "struct":
        return _struct_reader(f.fields, version, flexible)
    raise KafkaCodecError(f"unknown type {kind} in {f.name}")


def _len_prefixed(f: Field, nullable: bool, flexible: bool, *, short: bool, text: bool) -> ReadFn:
    def read(r: Reader) -> Any:
        n = r.uvarint() - 1 if flexible else (r.int16() if short else r.int32())
        if n < 0:
            if n == -1 and nullable:
                return None
            raise KafkaCodecError(f"{f.name}: length {n} (null not allowed here)")
        return r.text(n) if text else bytes(r.take(n))

    return read


def _array_reader(f: Field, version: int, flexible: bool) -> ReadFn:
    item = _reader(f, f.elem, version, flexible)
    nullable = in_range(version, f.nullable)

    def read(r: Reader) -> Any:
        n = r.uvarint() - 1 if flexible else r.int32()
        if n < 0:
            if n == -1 and nullable:
                return None
            raise KafkaCodecError(f"{f.name}: array length {n}")
        if n > r.remaining():  # every element takes at least one byte
            raise KafkaCodecError(f"{f.name}: array of {n} in {r.remaining()} bytes")
        return [item(r) for _ in range(n)]

    return read


def _field_reader(f: Field, version: int, flexible: bool) -> ReadFn:
    if f.flexible is not None:
        flexible = flexible and in_range(version, f.flexible)
    if f.kind == "array":
        return _array_reader(f, version, flexible)
    return _reader(f, f.kind, version, flexible)


def _struct_reader(fields: tuple[Field, ...], version: int, flexible: bool) -> ReadFn:
    steps: list[tuple[str, ReadFn]] = []
    tagged: dict[int, tuple[str, ReadFn]] = {}
    absent: list[Field] = []
    for f in fields:
        if not in_range(version, f.versions):
            absent.append(f)
        elif flexible and in_range(version, f.tagged):
            tagged[f.tag] = (f.name, _field_reader(f, version, True))
            absent.append(f)
        else:
            steps.append((f.name, _field_reader(f, version, flexible)))

    def read(r: Reader) -> Body:
        out: Body = {f.name: default_value(f, version) for f in absent}
        for name, fn in steps:
            out[name] = fn(r)
        if flexible:
            for _ in range(r.uvarint()):
                tag, size = r.uvarint(), r.uvarint()
                known = tagged.get(tag)
                if known is None:
                    r.take(size)
                    continue
                sub = Reader(r.take(size))
                out[known[0]] = known[1](sub)
        return out

    return read


# -- writers -------------------------------------------------------------------------------


def _writer(f: Field, kind: str, version: int, flexible: bool) -> WriteFn:
    nullable = in_range(version, f.nullable)
    if kind in ("int8", "int16", "uint16", "int32", "uint32", "int64", "float64"):
        return getattr(Writer, kind)  # type: ignore[no-any-return]  # unbound methods of Writer
    if kind == "bool":
        return lambda w, v: w.int8(1 if v else 0)
    if kind == "uuid":
        return lambda w, v: w.raw(v if len(v) == 16 else _bad(f, "uuid must be 16 bytes"))
    if kind in ("string", "bytes", "records"):
        short = kind == "string"

        def write(w: Writer, v: Any) -> None:
            if v is None:
                if not nullable:
                    raise KafkaCodecError(f"{f.name}: null not allowed at version {version}")
                if flexible:
                    w.uvarint(0)
                else:
                    (w.int16 if short else w.int32)(-1)
                return
            data = v.encode() if isinstance(v, str) else v
            if flexible:
                w.uvarint(len(data) + 1)
            else:
                (w.int16 if short else w.int32)(len(data))
            w.raw(data)

        return write
    if kind == "struct":
        return _struct_writer(f.fields, version, flexible)
    raise KafkaCodecError(f"unknown type {kind} in {f.name}")


def _bad(f: Field, why: str) -> bytes:
    raise KafkaCodecError(f"{f.name}: {why}")


def _field_writer(f: Field, version: int, flexible: bool) -> WriteFn:
    if f.flexible is not None:
        flexible = flexible and in_range(version, f.flexible)
    if f.kind != "array":
        return _writer(f, f.kind, version, flexible)
    item = _writer(f, f.elem, version, flexible)
    nullable = in_range(version, f.nullable)

    def write(w: Writer, v: Any) -> None:
        if v is None:
            if not nullable:
                raise KafkaCodecError(f"{f.name}: null array not allowed at version {version}")
            w.uvarint(0) if flexible else w.int32(-1)
            return
        w.uvarint(len(v) + 1) if flexible else w.int32(len(v))
        for x in v:
            item(w, x)

    return write


def _struct_writer(fields: tuple[Field, ...], version: int, flexible: bool) -> WriteFn:
    steps: list[tuple[Field, WriteFn]] = []
    tagged: list[tuple[Field, WriteFn]] = []
    for f in fields:
        if not in_range(version, f.versions):
            continue
        if flexible and in_range(version, f.tagged):
            tagged.append((f, _field_writer(f, version, True)))
        else:
            steps.append((f, _field_writer(f, version, flexible)))
    tagged.sort(key=lambda t: t[0].tag)

    def write(w: Writer, body: Any) -> None:
        get = body.get
        for f, fn in steps:
            v = get(f.name, _MISSING)
            fn(w, default_value(f, version) if v is _MISSING else v)
        if not flexible:
            return
        present = []
        for f, fn in tagged:
            v = get(f.name, _MISSING)
            if v is _MISSING or v == default_value(f, version):
                continue
            sub = Writer()
            fn(sub, v)
            present.append((f.tag, sub.buf))
        w.uvarint(len(present))
        for tag, data in present:
            w.uvarint(tag)
            w.uvarint(len(data))
            w.raw(data)

    return write


_MISSING = object()


# -- whole messages ------------------------------------------------------------------------


def _message(name: str, version: int) -> Message:
    msg = MESSAGES[name]
    if not in_range(version, msg.valid):
        raise KafkaCodecError(
            f"{name} has no version {version} (valid {msg.valid[0]}-{msg.valid[1]})"
        )
    return msg


@cache
def decoder(name: str, version: int) -> ReadFn:
    msg = _message(name, version)
    return _struct_reader(msg.fields, version, in_range(version, msg.flexible))


@cache
def encoder(name: str, version: int) -> WriteFn:
    msg = _message(name, version)
    return _struct_writer(msg.fields, version, in_range(version, msg.flexible))


def decode(
    name: str, version: int, data: bytes | bytearray | memoryview, *, strict: bool = True
) -> Body:
    """Decode one whole body. Trailing bytes are an error when `strict`; a server reads requests
    with strict=False, as Kafka does (it never checks that a request body was consumed, and
    librdkafka 2.16 relies on it: its all-topics Metadata v9+ request leaves a reserved 4-byte
    array count in place, `00 00 00 00`, which Kafka reads as a null compact array followed by
    three ignored bytes)."""
    r = Reader(data)
    body: Body = decoder(name, version)(r)
    if strict and r.remaining():
        raise KafkaCodecError(f"{name} v{version}: {r.remaining()} bytes left after the body")
    return body


def encode(name: str, version: int, body: Body) -> bytes:
    w = Writer()
    encoder(name, version)(w, body)
    return bytes(w.buf)
