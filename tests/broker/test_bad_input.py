"""Malformed input at the broker: errors or closed connections, never a dead broker or lost data."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the module, on its own loop thread (hypothesis runs many examples)."""
    import threading

    from orbitmq.net.loop import new_event_loop

    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = BrokerController(broker_config(tmp_path_factory.mktemp("bad") / "store"))
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    client = RemotingClient()
    send = Frame(
        RequestCode.SEND_MESSAGE,
        fields={"topic": "Safe", "queue_id": 0},
        body=encode_send_body([b"precious"], [b""]),
    )
    resp = asyncio.run_coroutine_threadsafe(client.invoke(broker.address, send), loop).result(10)
    assert resp.code == ResponseCode.SUCCESS
    yield broker, loop, client
    asyncio.run_coroutine_threadsafe(client.close(), loop).result(10)
    asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


async def _raw_exchange(addr: str, data: bytes, wait: float = 0.15) -> tuple[list[Frame], bool]:
    """Send raw bytes; return the frames that came back and whether the server closed."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    frames: list[Frame] = []
    closed = False
    try:
        writer.write(data)
        await writer.drain()
        decoder = FrameDecoder()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while loop.time() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            frames += decoder.feed(chunk)
            if frames:  # an answer came: no need to wait for more
                break
    finally:
        writer.close()
        with __import__("contextlib").suppress(Exception):
            await writer.wait_closed()
    return frames, closed


def _still_healthy(
    broker: BrokerController, loop: asyncio.AbstractEventLoop, client: RemotingClient
) -> None:
    pull = Frame(
        RequestCode.PULL_MESSAGE,
        fields={"topic": "Safe", "queue_id": 0, "queue_offset": 0, "max_msg_nums": 8},
    )
    resp = asyncio.run_coroutine_threadsafe(client.invoke(broker.address, pull), loop).result(10)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert decode_records(resp.body)[0].body == b"precious"


def _exchange(shared: Any, data: bytes) -> tuple[list[Frame], bool]:
    broker, loop, _client = shared
    return asyncio.run_coroutine_threadsafe(_raw_exchange(broker.address, data), loop).result(10)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(min_size=1, max_size=300))
def test_random_bytes(shared_broker: Any, data: bytes) -> None:
    frames, closed = _exchange(shared_broker, data)
    # Garbage either frames as something (answered) or closes the connection.
    assert closed or frames or len(data) < 16 or struct.unpack(">I", data[:4])[0] + 4 > len(data)
    _still_healthy(*shared_broker)


def test_oversized_length_prefix_closes(shared_broker: Any) -> None:
    frames, closed = _exchange(shared_broker, struct.pack(">IBBHII", 2**31, 1, 0, 10, 1, 0))
    assert closed and not frames
    _still_healthy(*shared_broker)


def test_truncated_frame_waits_then_is_dropped_with_the_connection(shared_broker: Any) -> None:
    whole = encode_bytes(
        Frame(RequestCode.GET_MAX_OFFSET, 5, fields={"topic": "Safe", "queue_id": 0})
    )
    frames, _closed = _exchange(shared_broker, whole[:-3])
    assert frames == []
    _still_healthy(*shared_broker)


def test_unknown_code_and_newer_version(shared_broker: Any) -> None:
    frames, closed = _exchange(shared_broker, encode_bytes(Frame(4321, 9)))
    assert not closed and frames[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert frames[0].opaque == 9
    frames, closed = _exchange(
        shared_broker, encode_bytes(Frame(RequestCode.GET_MAX_OFFSET, 3, version=9))
    )
    assert frames[0].code == ResponseCode.VERSION_NOT_SUPPORTED
    _still_healthy(*shared_broker)


def test_header_that_is_not_a_map_closes(shared_broker: Any) -> None:
    header = msgspec.msgpack.encode([1, 2, 3])
    raw = struct.pack(">IBBHII", 12 + len(header), 1, 0, 30, 1, len(header)) + header
    frames, closed = _exchange(shared_broker, raw)
    assert closed and not frames
    _still_healthy(*shared_broker)


BAD_FIELDS: list[tuple[int, dict[str, Any], bytes]] = [
    (RequestCode.SEND_MESSAGE, {}, encode_send_body([b"x"], [b""])),
    (RequestCode.SEND_MESSAGE, {"topic": 5}, encode_send_body([b"x"], [b""])),
    (RequestCode.SEND_MESSAGE, {"topic": "bad topic!"}, encode_send_body([b"x"], [b""])),
    (
        RequestCode.SEND_MESSAGE,
        {"topic": "Safe", "queue_id": "zero"},
        encode_send_body([b"x"], [b""]),
    ),
    (RequestCode.SEND_MESSAGE, {"topic": "Safe", "queue_id": 999}, encode_send_body([b"x"], [b""])),
    (RequestCode.SEND_MESSAGE, {"topic": "Safe"}, b"\x00\x00\x00\x09\x00"),
    (RequestCode.SEND_MESSAGE, {"topic": "Safe"}, encode_send_body([b""], [b""])),
    (RequestCode.SEND_MESSAGE, {"topic": "Safe"}, b""),
    (RequestCode.SEND_MESSAGE, {"topic": "Safe"}, encode_send_body([b"a", b"b"], [b"", b""])),
    (
        RequestCode.SEND_BATCH_MESSAGE,
        {"topic": "Safe", "flag": 2**40},
        encode_send_body([b"x"], [b""]),
    ),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": -1, "queue_offset": 0}, b""),
    (RequestCode.PULL_MESSAGE, {"topic": "Safe", "queue_id": 0, "queue_offset": "x"}, b""),
    (
        RequestCode.PULL_MESSAGE,
        {"topic": "Safe", "queue_id": 0, "queue_offset": 0, "tags": "a"},
        b"",
    ),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {}, b"\xc1garbage"),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {}, msgspec.msgpack.encode({"topic_name": "x y"})),
    (
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {},
        msgspec.msgpack.encode({"topic_name": "Q", "write_queue_nums": 0}),
    ),
    (RequestCode.QUERY_MESSAGE, {"topic": "Safe"}, b""),
    (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": -5}, b""),
    (
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        {"topic": "Safe", "queue_id": 0, "timestamp": None},
        b"",
    ),
]


@pytest.mark.parametrize(("code", "fields", "body"), BAD_FIELDS)
def test_invalid_fields_get_an_error_code(
    shared_broker: Any, code: int, fields: dict[str, Any], body: bytes
) -> None:
    frames, closed = _exchange(
        shared_broker, encode_bytes(Frame(code, 77, fields=fields, body=body))
    )
    assert not closed
    assert len(frames) == 1 and frames[0].opaque == 77
    assert frames[0].code not in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR), frames[0].remark
    assert frames[0].remark
    _still_healthy(*shared_broker)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    code=st.sampled_from([int(c) for c in RequestCode]),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "topic",
                "queue_id",
                "queue_offset",
                "max_msg_nums",
                "key",
                "msg_id",
                "offset",
                "tags",
                "timestamp",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-(2**63), 2**64 - 1),
            st.text(max_size=20),
            st.binary(max_size=8),
            st.lists(st.integers(-100, 100), max_size=3),
        ),
    ),
    body=st.binary(max_size=64),
)
def test_fuzzed_requests_never_kill_the_broker(
    shared_broker: Any, code: int, fields: dict[str, Any], body: bytes
) -> None:
    frames, closed = _exchange(
        shared_broker, encode_bytes(Frame(code, 1, fields=fields, body=body))
    )
    assert not closed
    assert len(frames) == 1
    if frames[0].code == ResponseCode.SYSTEM_ERROR:
        pytest.fail(f"unexpected SYSTEM_ERROR for code {code} {fields}: {frames[0].remark}")
    _still_healthy(*shared_broker)
