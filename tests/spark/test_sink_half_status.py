"""A half batch not stored as SEND_OK fails the sink's task before any marker names it.

FLUSH_SLAVE_TIMEOUT means the half is on the master alone. Named in a marker, it could be lost
with that master (a SIGKILL, then a failover), and every replay of the micro-batch would then
fail to COMMIT it. The task fails instead (its halves, that one included, are rolled back by
``fail()``) and Spark's re-run sends fresh ones. No Spark session and no broker.
"""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from orbitmq.client.producer.types import SendStatus
from orbitmq.client.transaction.types import HalfBatchResult
from orbitmq.common.errors import ClientError
from orbitmq.spark.sink import _Identity, _Sender


def half(status: SendStatus) -> concurrent.futures.Future[HalfBatchResult]:
    result = HalfBatchResult(
        topic="T", queue_id=0, broker_name="broker-a", broker_addr="127.0.0.1:1", offset=7,
        queue_offset=0, transaction_id=f"tx-{status.value}", count=3, msg_ids=("a", "b", "c"),
        status=status,
    )  # fmt: skip
    fut: concurrent.futures.Future[HalfBatchResult] = concurrent.futures.Future()
    fut.set_result(result)
    return fut


def test_only_send_ok_halves_are_kept_for_the_marker() -> None:
    opts = SimpleNamespace(send_timeout_s=1.0, marker_topic="M")
    sender = _Sender(None, opts, _Identity("q", 0, "0.0.0"))  # type: ignore[arg-type]
    sender._collect(half(SendStatus.SEND_OK))
    with pytest.raises(ClientError, match="stored as FLUSH_SLAVE_TIMEOUT"):
        sender._collect(half(SendStatus.FLUSH_SLAVE_TIMEOUT))
    # Both are the attempt's, so fail() rolls both back.
    assert [h.transaction_id for h in sender.halves] == ["tx-SEND_OK", "tx-FLUSH_SLAVE_TIMEOUT"]
