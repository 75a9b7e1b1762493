"""The raw SendMessage path (orbitmq.proxy.fast_send): its scan reads what protobuf reads or
declines, and its answer is protobuf's own bytes."""

from __future__ import annotations

import os
import random

import pytest

from orbitmq.proxy.fast_send import ok_response, scan_send
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc


def _message(**sp: object) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="T"), body=b"hello")
    m.system_properties.message_id = "01ABC"
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)  # type: ignore[call-overload]
        elif k in ("born_timestamp", "delivery_timestamp"):
            getattr(m.system_properties, k).seconds = v
        else:
            setattr(m.system_properties, k, v)
    return m


def _bytes(*messages: pb.Message) -> bytes:
    return svc.SendMessageRequest(messages=list(messages)).SerializeToString()


def _expected(data: bytes) -> tuple[object, ...]:
    m = svc.SendMessageRequest.FromString(data).messages[0]
    sp = m.system_properties
    return (
        m.topic.resource_namespace,
        m.topic.name,
        m.body,
        sp.tag if sp.HasField("tag") else None,
        list(sp.keys),
        sp.message_id,
        dict(m.user_properties),
    )


def test_plain_sends_scan_as_protobuf_reads_them() -> None:
    seed = int(os.environ.get("FAST_SEND_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (FAST_SEND_SEED replays)")
    rnd = random.Random(seed)
    texts = ["", "a", "tag", "é中", " ", "x" * 300]
    for _ in range(300):
        m = _message()
        m.topic.name = rnd.choice(["T", "topic-1", "é"])
        if rnd.random() < 0.3:
            m.topic.resource_namespace = rnd.choice(texts)
        m.body = rnd.randbytes(rnd.choice([0, 1, 127, 128, 1024, 20_000]))
        sp = m.system_properties
        sp.message_id = rnd.choice(texts)
        if rnd.random() < 0.7:
            sp.tag = rnd.choice(texts)
        sp.keys.extend(rnd.choice(texts) for _ in range(rnd.randrange(3)))
        for _ in range(rnd.randrange(3)):
            m.user_properties[rnd.choice(texts)] = rnd.choice(texts)
        if rnd.random() < 0.5:
            sp.message_type = pb.MessageType.NORMAL
        if rnd.random() < 0.5:
            sp.body_encoding = pb.Encoding.IDENTITY
        if rnd.random() < 0.5:
            sp.born_timestamp.seconds = rnd.randrange(1 << 40)
            sp.born_host = "host"
            sp.body_digest.checksum = "ABCD"
            sp.trace_context = "00-ab"
        data = _bytes(m)
        assert scan_send(data) == _expected(data), seed


@pytest.mark.parametrize(
    "data",
    [
        _bytes(_message(), _message()),  # two messages
        _bytes(),  # none
        _bytes(_message(message_type=pb.MessageType.FIFO, message_group="g")),
        _bytes(_message(message_type=pb.MessageType.DELAY, delivery_timestamp=9)),
        _bytes(_message(message_type=pb.MessageType.TRANSACTION)),
        _bytes(_message(message_type=pb.MessageType.PRIORITY)),
        _bytes(_message(body_encoding=pb.Encoding.GZIP)),
        _bytes(_message(message_group="g")),  # a group on a NORMAL message: the full path refuses
        _bytes(_message(delivery_timestamp=9)),
        _bytes(_message(queue_id=3)),  # a field the proxy does not read on sends
        _bytes(_message()) + _bytes(_message()),  # concatenated: protobuf merges them
        _bytes(_message())[:-3],  # truncated
        b"\x0a\x03\x0a\x01\xff",  # invalid UTF-8 in the topic's place
        b"\xff\xff\xff",
        b"",
    ],
)
def test_anything_else_goes_to_the_full_path(data: bytes) -> None:
    assert scan_send(data) is None


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 123_456, 1 << 40, (1 << 63) - 1, -1])
def test_ok_response_is_protobufs_serialization(offset: int) -> None:
    ok = pb.Status(code=pb.Code.OK, message="OK")
    for mid in ("01ABC", "x" * 200, "é"):
        entry = svc.SendResultEntry(status=ok, message_id=mid, offset=offset)
        want = svc.SendMessageResponse(status=ok, entries=[entry]).SerializeToString()
        assert ok_response(mid, offset) == want
