"""The server side of one Kafka connection, sans-IO: bytes in, requests out, responses to bytes.

Kafka frames are `int32 size | request header | body`. The header version follows from the API's
`flexibleVersions` (the wire does not say, KAFKA-14935): v2 (with a tagged-field block) when the
request version is flexible, else v1. ClientId keeps the classic int16 string in both. Responses
use header v1 when flexible, v0 otherwise, except ApiVersions, whose response header is always v0
so any client can read the ranges before it knows them.

`ServerConnection(supported)` takes the API ranges the server serves. A request for an API it
does not serve or a version outside the range gives a `Rejected` event: ApiVersions gets
UNSUPPORTED_VERSION (35) in the v0 body layout with the supported ranges, as Kafka answers since
KIP-511 (kafka-python decodes any error reply with the v0 schema); any other API has no answer
Kafka could give, so the connection must be closed. A frame larger than `max_frame` is refused
from its length prefix, before anything is buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orbitmq.protocol.kafka.codec import REQUESTS, RESPONSES, Body, decode, encode
from orbitmq.protocol.kafka.primitives import KafkaCodecError, Reader
from orbitmq.protocol.kafka.schema_types import in_range

API_VERSIONS = 18
UNSUPPORTED_VERSION = 35
DEFAULT_MAX_FRAME = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Body
    size: int = 0


@dataclass(slots=True)
class Rejected:
    """A request this server cannot decode or does not serve. `reply` is the bytes to send
    (ApiVersions only); when it is None the connection should be closed."""

    api_key: int
    api_version: int
    correlation_id: int
    reason: str
    reply: bytes | None = None


@dataclass(slots=True)
class RawToken:
    """A SASL token in a bare frame (after SaslHandshake v0)."""

    data: bytes


Event = Request | Rejected | RawToken
SASL_HANDSHAKE = 17


def raw_frame(token: bytes) -> bytes:
    """A bare frame for a SASL token (the server's answer after SaslHandshake v0)."""
    return _SIZE.pack(len(token)) + token


def request_header_flexible(api_key: int, version: int) -> bool:
    msg = REQUESTS.get(api_key)
    if msg is None:
        return False
    if api_key == API_VERSIONS and version > msg.valid[1]:
        return True  # a newer ApiVersions is flexible too (v3+); read its header as v2
    return in_range(version, msg.flexible)


def response_header_flexible(api_key: int, version: int) -> bool:
    if api_key == API_VERSIONS:
        return False
    return in_range(version, RESPONSES[api_key].flexible)


def encode_response(api_key: int, version: int, correlation_id: int, body: Body) -> bytes:
    payload = encode(RESPONSES[api_key].name, version, body)
    header = _SIZE.pack(correlation_id)
    if response_header_flexible(api_key, version):
        header += b"\x00"  # no tagged fields
    return _SIZE.pack(len(header) + len(payload)) + header + payload


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, body: Body
) -> bytes:
    """Client side of the same framing (tests and tools)."""
    cid = (
        b"\xff\xff"
        if client_id is None
        else _SIZE.pack(len(client_id.encode()))[2:] + client_id.encode()
    )
    header = struct.pack(">hhi", api_key, version, correlation_id) + cid
    if request_header_flexible(api_key, version):
        header += b"\x00"
    payload = encode(REQUESTS[api_key].name, version, body)
    return _SIZE.pack(len(header) + len(payload)) + header + payload


def decode_response(api_key: int, version: int, frame: bytes | memoryview) -> tuple[int, Body]:
    """A response frame without its size prefix -> (correlation id, body)."""
    r = Reader(frame)
    correlation_id = r.int32()
    if response_header_flexible(api_key, version):
        for _ in range(r.uvarint()):
            r.uvarint()
            r.take(r.uvarint())
    return correlation_id, decode(RESPONSES[api_key].name, version, r.take(r.remaining()))


def api_versions_error(correlation_id: int, supported: Mapping[int, tuple[int, int]]) -> bytes:
    body: dict[str, Any] = {
        "error_code": UNSUPPORTED_VERSION,
        "api_keys": [
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(supported.items())
        ],
    }
    return encode_response(API_VERSIONS, 0, correlation_id, body)


@dataclass
class ServerConnection:
    supported: Mapping[int, tuple[int, int]]
    max_frame: int = DEFAULT_MAX_FRAME
    raw_frames: int = 0
    """How many of the next frames are bare SASL tokens (see the module doc)."""
    _buf: bytearray = field(default_factory=bytearray)

    def receive(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed received bytes; returns every complete request (in order)."""
        self._buf += data
        events: list[Event] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            smallest = 0 if self.raw_frames else 8
            if size < smallest or size > self.max_frame:
                raise KafkaCodecError(f"frame size {size} outside {smallest}..{self.max_frame}")
            if len(buf) - pos - 4 < size:
                break
            frame = memoryview(buf)[pos + 4 : pos + 4 + size]
            try:
                if self.raw_frames:
                    self.raw_frames -= 1
                    events.append(RawToken(bytes(frame)))
                else:
                    ev = self._parse(frame)
                    events.append(ev)
                    if isinstance(ev, Request) and ev.api_key == SASL_HANDSHAKE:
                        self.raw_frames = 1 if ev.api_version == 0 else 0
            finally:
                frame.release()
            pos += 4 + size
        if pos:
            del buf[:pos]
        return events

    def _parse(self, frame: memoryview) -> Event:
        r = Reader(frame)
        api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
        rng = self.supported.get(api_key)
        if rng is None or not rng[0] <= version <= rng[1]:
            reason = (
                f"API {api_key} is not served" if rng is None
                else f"API {api_key} version {version} outside {rng[0]}-{rng[1]}"
            )  # fmt: skip
            reply = None
            if api_key == API_VERSIONS:
                reply = api_versions_error(correlation_id, self.supported)
            return Rejected(api_key, version, correlation_id, reason, reply)
        n = r.int16()
        client_id = None if n < 0 else r.text(n)
        if request_header_flexible(api_key, version):
            for _ in range(r.uvarint()):
                r.uvarint()
                r.take(r.uvarint())
        body = decode(REQUESTS[api_key].name, version, r.take(r.remaining()), strict=False)
        return Request(api_key, version, correlation_id, client_id, body, len(frame) + 4)
