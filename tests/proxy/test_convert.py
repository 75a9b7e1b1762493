"""The status table and message conversion, without a server."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MQError,
    ReceiptHandleExpiredError,
    RemoteError,
    RequestTimeoutError,
)
from orbitmq.common.record import StoredMessage
from orbitmq.proxy import status
from orbitmq.proxy.convert import crc32_hex, from_pb_message, to_pb_message
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.status import ProxyError

Code = pb.Code
VALID_CODES = set(pb.Code.values())


def test_every_response_code_maps_to_a_protocol_code() -> None:
    for rc in ResponseCode:
        got = status.from_response_code(rc)
        assert got.code in VALID_CODES and got.code != Code.CODE_UNSPECIFIED
        assert got.message
    assert status.from_response_code(424242).code == Code.INTERNAL_ERROR


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (RemoteError(ResponseCode.SYSTEM_BUSY, "busy"), Code.TOO_MANY_REQUESTS),
        (RemoteError(ResponseCode.TOPIC_NOT_EXIST), Code.TOPIC_NOT_FOUND),
        (RequestTimeoutError(), Code.PROXY_TIMEOUT),
        (InvalidTopicError("x"), Code.ILLEGAL_TOPIC),
        (EmptyBodyError("x"), Code.MESSAGE_BODY_EMPTY),
        (ReceiptHandleExpiredError("x"), Code.INVALID_RECEIPT_HANDLE),
        (ProxyError(Code.ILLEGAL_MESSAGE_TAG, "t"), Code.ILLEGAL_MESSAGE_TAG),
        (MQError("generic"), Code.INTERNAL_SERVER_ERROR),
        (ValueError("not ours"), Code.INTERNAL_ERROR),
    ],
)
def test_exceptions_map_through_the_one_table(exc: BaseException, code: int) -> None:
    got = status.from_error(exc)
    assert got.code == code and got.message


def _stored(body: bytes, **props: str) -> StoredMessage:
    return StoredMessage(
        total_size=0, queue_id=3, flag=0, queue_offset=7, physical_offset=99, sys_flag=0,
        born_timestamp_ms=1_700_000_000_123, born_host=("10.0.0.1", 5), store_timestamp_ms=1_700_000_000_456,
        store_host=("10.0.0.2", 10911), reconsume_times=2, prepared_transaction_offset=0,
        body=body, topic="T", properties=dict(props),
    )  # fmt: skip


def test_to_pb_message_carries_what_clients_need() -> None:
    m = _stored(
        b"body",
        UNIQ_CLIENT_MESSAGE_ID_KEYIDX="01ABC",
        TAGS="TagA",
        KEYS="k1 k2",
        __SHARDINGKEY="g",
        color="blue",
    )
    out = to_pb_message(m, pb.Resource(name="T", resource_namespace=""), receipt_handle="rh")
    sp = out.system_properties
    assert sp.message_id == "01ABC" and sp.tag == "TagA" and list(sp.keys) == ["k1", "k2"]
    assert sp.body_encoding == pb.Encoding.IDENTITY
    assert sp.body_digest.type == pb.DigestType.CRC32
    assert sp.body_digest.checksum == f"{zlib.crc32(b'body'):08X}" == crc32_hex(b"body")
    assert sp.delivery_attempt == 3  # reconsume_times + 1
    assert sp.message_group == "g" and sp.message_type == pb.MessageType.FIFO
    assert sp.receipt_handle == "rh" and sp.queue_id == 3 and sp.queue_offset == 7
    assert sp.born_timestamp.ToMilliseconds() == 1_700_000_000_123
    assert dict(out.user_properties) == {"color": "blue"}  # system properties stay hidden


def test_gzip_bodies_are_inflated() -> None:
    sp = pb.SystemProperties(
        message_id="01", message_type=pb.NORMAL, body_encoding=pb.Encoding.GZIP
    )
    m = pb.Message(topic=pb.Resource(name="T"), body=zlib.compress(b"plain"), system_properties=sp)
    assert from_pb_message(m, max_body=100, max_delay_s=10).message.body == b"plain"
    m.body = b"not gzip"
    with pytest.raises(ProxyError) as info:
        from_pb_message(m, max_body=100, max_delay_s=10)
    assert info.value.status_code == Code.MESSAGE_CORRUPTED


@given(
    data=st.binary(max_size=300),
)
def test_from_pb_message_on_random_messages(data: bytes) -> None:
    """Any parseable message either converts or raises ProxyError/MQError with a code."""
    try:
        m = pb.Message.FromString(data)
    except Exception:  # noqa: BLE001 - not a message at all: nothing to convert
        return
    try:
        spec = from_pb_message(m, max_body=1024, max_delay_s=3600)
    except MQError as exc:
        assert status.code_of(exc) in VALID_CODES
    else:
        assert spec.message.body and spec.message_id
