"""Client-side CRC checks of pulled records: off by default (RocketMQ's clients do not check;
the broker checks when it stores and when it reads from disk), on with ``check_crc=True``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import (
    AdminClient,
    AsyncLitePullConsumer,
    AsyncProducer,
    ConsumeFromWhere,
    LitePullConfig,
    Message,
    PushConfig,
    SimpleConfig,
    _codec,
)
from orbitmq.common.errors import ProtocolError
from orbitmq.common.record import BatchHeader, encode_batch, pack_host
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster


def _records(*bodies: bytes) -> bytes:
    head = BatchHeader(
        b"T", 0, 0, 0, 0, 0, 1, pack_host(("127.0.0.1", 1)), 2, pack_host(("127.0.0.1", 2)),
        0, 0,
    )  # fmt: skip
    return bytes(encode_batch(head, list(bodies), [b""] * len(bodies)))


def test_decode_checks_the_crc_only_when_asked() -> None:
    data = bytearray(_records(b"hello", b"world"))
    at = data.index(b"world")
    data[at] ^= 0xFF  # the second record's body no longer matches its CRC
    bodies = [m.body for m in _codec.decode_pulled(bytes(data), verify_crc=False)]
    assert bodies == [b"hello", bytes([ord("w") ^ 0xFF]) + b"orld"]
    with pytest.raises(ProtocolError, match="pull body"):
        _codec.decode_pulled(bytes(data), verify_crc=True)
    # Framing is checked either way.
    with pytest.raises(ProtocolError):
        _codec.decode_pulled(bytes(data[:-3]), verify_crc=False)


def test_off_by_default() -> None:
    assert not PushConfig().check_crc and not LitePullConfig().check_crc
    assert not SimpleConfig().check_crc


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


@pytest.mark.parametrize("check", [False, True])
async def test_the_consumer_setting_reaches_the_decoder(
    real: RealCluster, monkeypatch: pytest.MonkeyPatch, check: bool
) -> None:
    seen: list[bool] = []
    decode = _codec.decode_pulled

    def spy(body: Any, *, verify_crc: bool) -> Any:
        seen.append(verify_crc)
        return decode(body, verify_crc=verify_crc)

    monkeypatch.setattr(_codec, "decode_pulled", spy)
    async with AdminClient(real.addr) as admin:
        await admin.create_topic("Crc", read_queue_nums=1, write_queue_nums=1)
    async with AsyncProducer(real.addr) as p:
        await p.send(Message("Crc", b"x"))
    c = AsyncLitePullConsumer(
        real.addr, f"G-Crc-{check}", consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        check_crc=check,
    )  # fmt: skip
    c.subscribe("Crc")
    await c.start()
    try:
        got: list[bytes] = []
        end = asyncio.get_running_loop().time() + 10
        while not got and asyncio.get_running_loop().time() < end:
            got += [m.body for m in await c.poll(0.5)]
        assert got == [b"x"]
    finally:
        await c.close()
    assert seen and set(seen) == {check}
