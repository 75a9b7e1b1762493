"""A pull made while the route names no master for the group waits for one (as a pull the old
master refuses does) instead of failing the task, and with it the query: the Spark HA run
restarted its query after most kills for "no master address known". No broker: the route and
the pull are faked on :class:`orbitmq.spark.fetch.Connection`.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, error_for
from orbitmq.spark import fetch
from orbitmq.spark.fetch import Connection


class Requester:
    def __init__(self, masterless: int) -> None:
        self.masterless = masterless
        self.asked = 0
        self.routes = SimpleNamespace(refresh=self.refresh)

    async def refresh(self, topic: str) -> None:
        return None

    async def addr(self, broker_name: str, topic: str) -> str:
        self.asked += 1
        if self.asked <= self.masterless:
            raise ClientError(f"no master address known for broker {broker_name!r}")
        return "127.0.0.1:10911"


def conn_with(requester: Requester, monkeypatch: pytest.MonkeyPatch) -> Connection:
    conn = object.__new__(Connection)
    conn.requester = requester  # type: ignore[assignment]

    async def pull_from(addr: str, pull: Any) -> str:
        return f"answer from {addr}"

    monkeypatch.setattr(conn, "_pull_from", pull_from)
    monkeypatch.setattr(fetch, "FAILOVER_RETRY_S", 0.01)
    return conn


def test_a_route_without_a_master_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    req = Requester(masterless=3)
    conn = conn_with(req, monkeypatch)
    answer = asyncio.run(conn._pull(MessageQueue("T", "broker-a", 0), 0, 1, None))
    assert answer == "answer from 127.0.0.1:10911" and req.asked == 4


def test_but_not_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = conn_with(Requester(masterless=10**6), monkeypatch)
    monkeypatch.setattr(fetch, "FAILOVER_WAIT_S", 0.05)
    with pytest.raises(ClientError, match="no master address known"):
        asyncio.run(conn._pull(MessageQueue("T", "broker-a", 0), 0, 1, None))


def test_a_retryable_answer_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier's store unreachable (SERVICE_NOT_AVAILABLE, retryable): the pull is asked
    again rather than failing the task; any other answer that is not a lost master still fails at once."""
    conn = conn_with(Requester(masterless=0), monkeypatch)
    answers: list[Any] = [
        error_for(ResponseCode.SERVICE_NOT_AVAILABLE, "tier read failed"),
        error_for(ResponseCode.SERVICE_NOT_AVAILABLE, "tier read failed"),
        "answer",
    ]

    async def pull_from(addr: str, pull: Any) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    monkeypatch.setattr(conn, "_pull_from", pull_from)
    assert asyncio.run(conn._pull(MessageQueue("T", "broker-a", 0), 0, 1, None)) == "answer"
    answers[:] = [error_for(ResponseCode.NO_PERMISSION, "denied"), "never"]
    with pytest.raises(MQError):
        asyncio.run(conn._pull(MessageQueue("T", "broker-a", 0), 0, 1, None))
    assert answers == ["never"]
