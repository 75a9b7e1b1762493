"""Fuzz targets: one function per decoder that takes untrusted bytes, and the exceptions each
decoder documents. Anything else a target raises is a crash (a bug to fix).

Each target also has a few valid inputs (``seeds``) that the mutation fuzzer and atheris start
from, so the mutations reach past the first length check. Used by :mod:`tests.fuzz.run` (atheris,
``make fuzz``) and by :mod:`tests.fuzz.test_fuzz` (a bounded run in the normal suite).
"""

from __future__ import annotations

import contextlib
import struct
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import NamedTemporaryFile

import msgspec
from google.protobuf.message import DecodeError

from orbitmq.cli.settings import load_settings
from orbitmq.common.errors import ConfigError, FilterExpressionError, MQError, ProtocolError
from orbitmq.common.filter import compile_filter
from orbitmq.common.message import Message, MessageBatch, decode_properties, encode_properties
from orbitmq.common.record import BatchHeader, RecordError, decode_batch, encode_batch
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from orbitmq.protocol.ha import Ack, HaDecoder, HaError, Handshake, Heartbeat, Transfer
from orbitmq.protocol.ha import encode as ha_encode
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.messages import decode_send_body, encode_send_body
from orbitmq.protocol.mqtt.codec import MQTT_5, MQTT_311, MqttDecoder, MqttProtocolError, encode
from orbitmq.protocol.mqtt.connection import ServerConnection, State
from orbitmq.protocol.mqtt.packets import Connect, Publish
from orbitmq.protocol.requests import REQUESTS, FieldError
from orbitmq.proxy.convert import from_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from tests.fuzz.kafka_frames import SEEDS as KAFKA_SEEDS
from tests.fuzz.kafka_frames import decode_like_the_gateway


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], object]
    allowed: tuple[type[BaseException], ...]
    """The decoder's documented errors: raising one of these on bad input is correct."""
    seeds: tuple[bytes, ...]


# ------------------------------------------------------------------ frames and headers


def _frame(data: bytes) -> object:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    # Split the input in two feeds: the decoder must not care where reads end.
    cut = data[0] % (len(data) + 1) if data else 0
    return decoder.feed(data[:cut]) + decoder.feed(data[cut:])


_CODES = sorted(REQUESTS)


def _header(data: bytes) -> object:
    """Header bytes decoded as the frame decoder does, then checked by the typed class of a
    request code chosen by the input's first two bytes."""
    if len(data) < 2:
        return None
    code = _CODES[int.from_bytes(data[:2], "big") % len(_CODES)]
    header = data[2:]
    wire = struct.pack(">IBBHII", 12 + len(header), 1, 0, code, 1, len(header)) + header
    frames = FrameDecoder(max_frame_size=1 << 20).feed(wire)
    return REQUESTS[code].decode(frames[0])


def _record(data: bytes) -> object:
    return [m.properties for m in decode_batch(data)]


def _send_body(data: bytes) -> object:
    body = decode_send_body(data)
    return [decode_properties(p) for p in body.properties]


def _sql(data: bytes) -> object:
    text = data.decode("utf-8", "replace")
    flt = compile_filter("SQL92", text)
    return flt.matches({"a": "1", "b": "x", "TAGS": "t"})


def _grpc_message(data: bytes) -> object:
    msg = pb.Message()
    msg.ParseFromString(data)
    return from_pb_message(msg, max_body=1 << 20, max_delay_s=86400.0, now_ms=0)


def _toml(data: bytes) -> object:
    text = data.decode("utf-8", "replace")
    tomllib.loads(text)  # cheap pre-check; the loader below parses it again from a file
    with NamedTemporaryFile("w", suffix=".toml", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        return load_settings(Path(f.name), env={})


def _ha(data: bytes) -> object:
    decoder = HaDecoder(max_payload=1 << 16)
    cut = data[0] % (len(data) + 1) if data else 0
    return decoder.feed(data[:cut]) + decoder.feed(data[cut:])


def _seed_ha() -> tuple[bytes, ...]:
    return (
        ha_encode(Handshake(3, 1, "broker-a", [(1, 0), (3, 4096)], 8192))
        + ha_encode(Ack(3, 8192, 4096)),
        ha_encode(Transfer(3, 4096, 3, 4096, 4000, b"records"))
        + ha_encode(Heartbeat(3, 9000, 8000))
        + ha_encode(HaError(3, 2, "diverged")),
    )


def _mqtt(data: bytes) -> object:
    """The codec, then the per-connection state machine over the same bytes (issue #18's
    mutated packets): a Closed event, never an exception, whatever arrives; a CONNECT that
    gets through is accepted so the packets held behind it are handled too."""
    try:
        decoded = MqttDecoder(max_packet_size=1 << 16).feed(data)
    except MqttProtocolError:
        decoded = []
    conn = ServerConnection(max_packet_size=1 << 16, topic_alias_maximum=4)
    events = conn.receive_data(data, 0)
    if conn.state is State.CONNECTING:
        events += conn.accept()
    return decoded, events


# ------------------------------------------------------------------ seeds


def _seed_frames() -> tuple[bytes, ...]:
    return (
        encode_bytes(Frame(10, 1, 0, {"topic": "T", "queue_id": 1}, b"body")),
        encode_bytes(Frame(11, 2, 1, {"remark": "x", "n": [1, 2, {"a": b"b"}]})),
    )


def _seed_headers() -> tuple[bytes, ...]:
    enc = msgspec.msgpack.encode
    i = _CODES.index
    return (
        i(10).to_bytes(2, "big") + enc({"topic": "T", "queue_id": 0, "producer_group": "G"}),
        i(11).to_bytes(2, "big") + enc({"topic": "T", "queue_id": 0, "queue_offset": 5}),
        # Deep nesting once escaped the frame decoder as RecursionError.
        i(10).to_bytes(2, "big") + b"\x81\xa1a" + b"\x91" * 20000 + b"\xc0",
    )


def _seed_records() -> tuple[bytes, ...]:
    head = BatchHeader(b"Topic", 1, 0, 0, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0)
    props = [encode_properties({"TAGS": "a", "KEYS": "k1 k2"}), b""]
    return (bytes(encode_batch(head, [b"hello", b""], props)),)


def _seed_send_bodies() -> tuple[bytes, ...]:
    batch = MessageBatch.of("T", 0, [Message("T", b"x" * 10, tags="a"), Message("T", b"")])
    return (
        encode_send_body(batch.bodies, batch.properties),
        encode_send_body([b"a"] * 6, [b"k\x01v\x02"] * 6),
    )


def _seed_grpc() -> tuple[bytes, ...]:
    m = pb.Message()
    m.topic.name = "T"
    m.body = b"hello"
    m.system_properties.message_id = "0123456789ABCDEF"
    m.system_properties.tag = "t"
    m.system_properties.keys.append("k")
    m.system_properties.message_type = pb.NORMAL
    m.user_properties["a"] = "b"
    return (m.SerializeToString(),)


_SEEDS_SQL = (b"a > 1 AND b = 'x'", b"TAGS IN ('t', 'u') OR a BETWEEN 1 AND 3", b"b IS NOT NULL")
_SEEDS_TOML = (
    b'[broker]\nport = 10911\nbroker_name = "b"\n[store]\nflush_disk_type = "SYNC_FLUSH"\n',
    b'[namesrv]\nport = 0\ntls_mode = "off"\n[proxy]\naccess_keys = {a = "b"}\n',
)


def _seed_mqtt() -> tuple[bytes, ...]:
    out = []
    for version in (MQTT_311, MQTT_5):
        connect = encode(Connect("client", protocol_level=version, username="u"), version)
        publish = encode(Publish("a/b", b"payload", qos=1, packet_id=7), version)
        out.append(connect + publish)
    return tuple(out)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("frame", _frame, (ProtocolError,), _seed_frames()),
        Target(
            "header",
            _header,
            (FieldError, ProtocolError),
            _seed_headers(),
        ),
        Target("record", _record, (RecordError,), _seed_records()),
        Target("send_body", _send_body, (ProtocolError,), _seed_send_bodies()),
        Target("sql92", _sql, (FilterExpressionError,), _SEEDS_SQL),
        Target("grpc_message", _grpc_message, (DecodeError, MQError), _seed_grpc()),
        Target("toml_config", _toml, (ConfigError, tomllib.TOMLDecodeError), _SEEDS_TOML),
        Target("mqtt", _mqtt, (MqttProtocolError,), _seed_mqtt()),
        Target("ha", _ha, (ProtocolError,), _seed_ha()),
        # the Kafka listener's framing, request decoding and record batches (issue #17)
        Target("kafka", decode_like_the_gateway, (KafkaCodecError,), KAFKA_SEEDS),
    )
}


def check(target: Target, data: bytes) -> None:
    """Run one input; a documented error is fine, anything else propagates (a crash)."""
    with contextlib.suppress(*target.allowed):
        target.run(data)


__all__ = ["TARGETS", "Target", "check"]
