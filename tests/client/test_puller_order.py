"""The pull loop's order after a pull that found messages: caught up (the queue's end reached),
the listener runs before the next pull is written; behind, the next pull goes out first."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from orbitmq.client.consumer.config import ConsumerConfig
from orbitmq.client.consumer.puller import PullMessageService
from orbitmq.client.consumer.subscription import Subscription
from orbitmq.client.offset_store import BrokerRequester, OffsetStore
from orbitmq.client.process_queue import ProcessQueue
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.record import BatchHeader, StoredMessage, encode_batch, pack_host
from orbitmq.protocol.frame import Frame

WAIT_S = 5.0


def _records(*bodies: bytes) -> bytes:
    head = BatchHeader(
        b"T", 0, 0, 0, 0, 0, 1, pack_host(("127.0.0.1", 1)), 2, pack_host(("127.0.0.1", 2)),
        0, 0,
    )  # fmt: skip
    return bytes(encode_batch(head, list(bodies), [b""] * len(bodies)))


class _Requester:
    """Answers the first pull with one message, holds the second until the test ends."""

    def __init__(self, events: list[str], max_offset: int) -> None:
        self.events = events
        self.max_offset = max_offset
        self.second = asyncio.Event()
        self.release = asyncio.Event()

    async def call_queue(self, mq: MessageQueue, header: Any, **_kw: Any) -> Frame:
        self.events.append("pull")
        if len([e for e in self.events if e == "pull"]) > 1:
            self.second.set()
            await self.release.wait()
            return Frame(ResponseCode.PULL_NOT_FOUND, fields={"next_begin_offset": 1})
        fields = {"next_begin_offset": 1, "max_offset": self.max_offset, "min_offset": 0}
        return Frame(ResponseCode.SUCCESS, fields=fields, body=_records(b"m"))


@pytest.mark.parametrize(("max_offset", "expected"), [(1, "listener"), (5, "pull")])
async def test_listener_before_the_next_pull_only_when_caught_up(
    max_offset: int, expected: str
) -> None:
    events: list[str] = []
    requester = _Requester(events, max_offset)
    tasks: list[asyncio.Task[None]] = []

    async def listener() -> None:
        events.append("listener")

    def on_pulled(_pq: ProcessQueue, _msgs: list[StoredMessage]) -> None:
        tasks.append(asyncio.get_running_loop().create_task(listener()))  # a worker task

    mq = MessageQueue("T", "b", 0)
    service = PullMessageService(
        ConsumerConfig(),
        "test",
        "G",
        cast(BrokerRequester, requester),
        cast(OffsetStore, None),
        subscription=lambda _t: Subscription.parse("T"),
        on_pulled=on_pulled,
        running=lambda: True,
    )
    pq = ProcessQueue(mq, 0)
    service.start(pq)
    try:
        await asyncio.wait_for(requester.second.wait(), WAIT_S)
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
        assert events[:3] == ["pull", expected, "listener" if expected == "pull" else "pull"]
    finally:
        requester.release.set()
        await service.close()
