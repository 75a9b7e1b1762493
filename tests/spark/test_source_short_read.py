"""A planned range the broker answers with fewer records than offsets fails the task.

Without a filter every queue offset holds one record, so a pull answered SUCCESS for offsets
``[a, b)`` with fewer than ``b - a`` records, or PULL_RETRY_IMMEDIATELY ("none to serve"), means
the broker skipped records without reporting a gap. The reader used to move on to
``next_begin_offset``: the range ended early, the micro-batch committed, and those rows were
never read (silent loss). Now it is ``[ORBITMQ_DATA_LOSS]`` (Kafka's failOnDataLoss), or a
warning with ``failOnDataLoss=false``. No Spark session and no broker: the pulls are faked at
:meth:`orbitmq.spark.fetch.Connection._pull`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa

from orbitmq.client._loop_thread import LoopThread
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import encode_properties
from orbitmq.common.record import BatchHeader, encode_batch, pack_host
from orbitmq.spark import fetch, source
from orbitmq.spark.fetch import Connection, DataLossError
from orbitmq.spark.options import parse_source_options
from orbitmq.spark.source import QueueRange, read_range

TOPIC = "T"


def records(offsets: list[int]) -> bytes:
    """Stored records at ``offsets`` (runs of consecutive offsets as batches)."""
    out = b""
    for _, run in itertools.groupby(enumerate(offsets), lambda p: p[1] - p[0]):
        offs = [o for _, o in run]
        head = BatchHeader(
            TOPIC.encode(), 0, offs[0], 0, 0, 0, 1_700_000_000_000, pack_host(("127.0.0.1", 1)),
            1_700_000_000_500, pack_host(("127.0.0.1", 2)), 0, 0,
        )  # fmt: skip
        bodies = [b"m%d" % o for o in offs]
        out += bytes(encode_batch(head, bodies, [encode_properties({})] * len(offs)))
    return out


@dataclass
class Answer:
    code: int
    fields: dict[str, Any]
    body: bytes = b""


@dataclass
class Broker:
    """A queue holding ``held`` (offsets the broker serves) within ``[0, end)``; ``retry``:
    offsets the broker answers PULL_RETRY_IMMEDIATELY for, with the next one to ask."""

    end: int
    held: set[int]
    retry: dict[int, int] = field(default_factory=dict)
    stalls: dict[int, int] = field(default_factory=dict)
    """Offset -> how many more times it is answered "none to serve" without moving on."""

    async def pull(self, mq: Any, offset: int, count: int, expr: Any) -> Answer:
        fields = {"min_offset": 0, "max_offset": self.end}
        if self.stalls.get(offset, 0) > 0:
            self.stalls[offset] -= 1
            return Answer(ResponseCode.PULL_RETRY_IMMEDIATELY,
                          {**fields, "next_begin_offset": offset})  # fmt: skip
        if offset in self.retry:
            return Answer(ResponseCode.PULL_RETRY_IMMEDIATELY,
                          {**fields, "next_begin_offset": self.retry[offset]})  # fmt: skip
        stop = min(offset + count, self.end)
        served = [o for o in range(offset, stop) if o in self.held]
        return Answer(ResponseCode.SUCCESS, {**fields, "next_begin_offset": stop}, records(served))


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    fake = Broker(0, set())
    conn = object.__new__(Connection)  # no NameServer: only pull_range's machinery
    conn.timeout_s = 5.0
    conn.thread = LoopThread("short-read-test")
    monkeypatch.setattr(conn, "_pull", lambda *a: fake.pull(*a))
    monkeypatch.setattr(source, "connection", lambda *a, **k: conn)
    monkeypatch.setattr(fetch, "STALL_PAUSE_S", 0.001)
    try:
        yield fake
    finally:
        conn.thread.stop()


def read(fail_on_data_loss: bool, start: int, end: int, batch: int = 4) -> list[int]:
    opts = parse_source_options(
        {"namesrv": "127.0.0.1:1", "topic": TOPIC, "pullBatchSize": str(batch),
         "failOnDataLoss": str(fail_on_data_loss).lower()}, streaming=False,
    )  # fmt: skip
    out: list[int] = []
    for b in read_range(opts, QueueRange(TOPIC, "broker-a", 0, start, end)):
        assert isinstance(b, pa.RecordBatch)
        out += b.column("queue_offset").to_pylist()
    return out


def test_a_whole_answer_reads_every_offset(broker: Broker) -> None:
    broker.end, broker.held = 20, set(range(20))
    assert read(True, 3, 17) == list(range(3, 17))


def test_records_skipped_inside_an_answer_fail_the_task(broker: Broker) -> None:
    broker.end, broker.held = 20, set(range(20)) - {9, 10}
    with pytest.raises(DataLossError, match=r"ORBITMQ_DATA_LOSS.*2 missing: 9, 10"):
        read(True, 0, 20)
    assert read(False, 0, 20) == [o for o in range(20) if o not in (9, 10)]


def test_a_none_to_serve_answer_without_a_filter_fails_the_task(broker: Broker) -> None:
    # The broker served nothing from 8 and says to go on at 12: offsets 8-11 were skipped.
    broker.end, broker.held, broker.retry = 20, set(range(20)) - set(range(8, 12)), {8: 12}
    with pytest.raises(DataLossError, match=r"offsets \[8, 12\) are no longer available"):
        read(True, 0, 20)
    assert read(False, 0, 20) == [o for o in range(20) if not 8 <= o < 12]


def test_an_answer_that_does_not_move_on_is_asked_again_not_stepped_over(broker: Broker) -> None:
    # The reader used to step over the offset (one record lost, silently).
    broker.end, broker.held, broker.stalls = 20, set(range(20)), {8: 3}
    assert read(True, 0, 20) == list(range(20))
    broker.stalls = {8: fetch.STALL_RETRIES + 1}  # for good: then it is data loss
    with pytest.raises(DataLossError, match=r"offsets \[8, 9\) are no longer available"):
        read(True, 0, 20)
