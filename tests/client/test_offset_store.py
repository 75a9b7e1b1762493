"""Offset stores: the local JSON file (broadcasting) and batched broker commits (clustering)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client.offset_store import BrokerRequester, LocalOffsetStore, RemoteOffsetStore
from orbitmq.client.route import MessageQueue
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import RemoteError
from orbitmq.protocol.bodies import decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import OffsetsBody
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.header import Header

A0 = MessageQueue("T", "broker-a", 0)
A1 = MessageQueue("T", "broker-a", 1)
B0 = MessageQueue("T", "broker-b", 0)


async def test_local_store_round_trip(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path, "inst/1", "G")
    await store.load()
    assert await store.fetch(A0) is None
    store.update(A0, 5)
    store.update(B0, 7)
    store.update(A0, 3, increase_only=True)  # ignored: lower
    assert store.read(A0) == 5
    await store.persist()
    assert store.path == tmp_path / "inst_1" / "G" / "offsets.json"
    assert not store.path.with_suffix(".tmp").exists()
    data = json.loads(store.path.read_text())
    assert data["offsets"] == {"T": {"broker-a": {"0": 5}, "broker-b": {"0": 7}}}

    again = LocalOffsetStore(tmp_path, "inst/1", "G")
    await again.load()
    assert await again.query(A0) == 5
    assert await again.fetch(B0) == 7 and again.read(B0) == 7
    # Persisting one queue keeps the others' offsets in the file.
    again.update(A1, 1)
    await again.persist([A1])
    third = LocalOffsetStore(tmp_path, "inst/1", "G")
    await third.load()
    assert [await third.query(q) for q in (A0, A1, B0)] == [5, 1, 7]


async def test_local_store_ignores_an_unreadable_file(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path, "i", "G", fsync=False)
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"{not json")
    await store.load()
    assert await store.fetch(A0) is None
    store.update(A0, 1)
    await store.persist()
    assert json.loads(store.path.read_text())["offsets"]["T"]["broker-a"]["0"] == 1


class FakeRequester(BrokerRequester):
    """Answers offset requests from a dict per broker; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any], bytes]] = []
        self.committed: dict[str, dict[tuple[str, int], int]] = {
            "broker-a": {},
            "broker-b": {},
        }
        self.max_offset = 100

    async def addr(self, broker_name: str, topic: str) -> str:
        return broker_name

    async def call(
        self,
        addr: str,
        header: Header,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
        timeout_s: float | None = None,
    ) -> Frame:
        code, fields = header.code, header.to_header()
        self.calls.append((addr, code, fields, bytes(body)))
        table = self.committed[addr]
        resp_code: int = ResponseCode.SUCCESS
        out: dict[str, Any] = {}
        if code == RequestCode.QUERY_CONSUMER_OFFSET:
            key = (fields["topic"], fields["queue_id"])
            if key in table:
                out["offset"] = table[key]
            else:
                resp_code = ResponseCode.QUERY_NOT_FOUND
        elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
            if body:
                items = [
                    (o.topic, o.queue_id, o.offset)
                    for o in decode_body(bytes(body), OffsetsBody).offsets
                ]
            else:
                items = [(fields["topic"], fields["queue_id"], fields["offset"])]
            if any(not 0 <= off <= self.max_offset for _, _, off in items):
                resp_code = ResponseCode.OFFSET_ILLEGAL
            else:
                for topic, qid, off in items:
                    table[(topic, qid)] = off
        resp = Frame(code, fields=out)
        resp.code = resp_code
        if resp_code not in ok:
            raise RemoteError(resp_code, "fake")
        return resp


async def test_remote_store_batches_per_broker_and_skips_unchanged() -> None:
    req = FakeRequester()
    store = RemoteOffsetStore("G", req)
    assert await store.fetch(A0) is None
    for mq, off in ((A0, 3), (A1, 4), (B0, 5)):
        store.update(mq, off)
    req.calls.clear()
    await store.persist()
    assert req.committed == {"broker-a": {("T", 0): 3, ("T", 1): 4}, "broker-b": {("T", 0): 5}}
    kinds = sorted((addr, bool(body)) for addr, _code, _f, body in req.calls)
    assert kinds == [("broker-a", True), ("broker-b", False)]  # a batch body; a single commit
    req.calls.clear()
    await store.persist()
    assert req.calls == []  # nothing changed
    assert await store.fetch(A1) == 4 and store.read(A1) == 4
    store.remove(A1)
    assert store.read(A1) is None


async def test_remote_store_isolates_an_illegal_offset() -> None:
    req = FakeRequester()
    store = RemoteOffsetStore("G", req)
    store.update(A0, 3)
    store.update(A1, 1000)  # beyond the queue
    with pytest.raises(RemoteError) as info:
        await store.persist()
    assert info.value.code == ResponseCode.OFFSET_ILLEGAL
    assert req.committed["broker-a"] == {("T", 0): 3}  # the good one still landed
    req.calls.clear()
    await store.persist()
    assert req.calls == []  # the refused one is not retried every interval
