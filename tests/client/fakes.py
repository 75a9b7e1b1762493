"""Small in-memory NameServer and broker on RemotingServer, for client tests.

They speak docs/protocol.md closely enough for the client (sends, pulls, offsets, lookups,
topic admin) and let a test count frames, inject error answers, hang, or stop listening.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import decode_properties
from orbitmq.common.record import BatchHeader, encode_batch, pack_host, record_sizes
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.bodies import (
    PERM_READ_WRITE,
    BrokerData,
    ClusterInfo,
    QueueData,
    QueueStats,
    TopicConfig,
    TopicList,
    TopicRouteData,
    TopicStats,
    decode_body,
    encode_body,
)
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import decode_send_body
from orbitmq.protocol.requests import request_class


@dataclass
class StoredRecord:
    raw: bytes
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    properties: dict[str, str]


@dataclass
class SendSeen:
    code: int
    topic: str
    queue_id: int
    sys_flag: int
    flag: int
    count: int
    oneway: bool


class FakeBroker:
    def __init__(self, name: str, cluster: str = "DefaultCluster") -> None:
        self.name = name
        self.cluster = cluster
        self.server = RemotingServer(self.handle, name=f"fake-{name}")
        self.topics: dict[str, TopicConfig] = {}
        self.auto_create = False
        self.records: list[StoredRecord] = []
        self.queues: dict[tuple[str, int], list[StoredRecord]] = {}
        self.end = 0
        self.sends: list[SendSeen] = []
        self.requests: Counter[int] = Counter()
        self.fail_next: list[tuple[int, dict[str, Any]]] = []
        """Answers for the next sends: (code, fields); fields may make it a stored-but answer."""
        self.hang = False
        self.delay_s = 0.0
        self.released = asyncio.Event()
        self.refuse: tuple[int, str] | None = None
        """Answer every request with this (code, remark): a slave or a deposed master."""

    @property
    def addr(self) -> str:
        return self.server.address

    async def start(self) -> FakeBroker:
        await self.server.start()
        return self

    async def stop(self) -> None:
        self.released.set()
        await self.server.stop()

    def add_topic(self, topic: str, queues: int = 4, perm: int = PERM_READ_WRITE) -> None:
        self.topics[topic] = TopicConfig(
            topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm
        )

    def bodies(self, topic: str) -> list[bytes]:
        from orbitmq.common.record import decode

        return [decode(r.raw).body for r in self.records if r.topic == topic]

    # ------------------------------------------------------------------ handler

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        self.requests[frame.code] += 1
        if self.refuse is not None:
            return frame.reply(*self.refuse)
        if frame.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
            return await self._send(frame)
        f = full_fields(frame)
        if frame.code == RequestCode.PULL_MESSAGE:
            return self._pull(frame)
        if frame.code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
            q = self.queues.get((f["topic"], f["queue_id"]), [])
            off = len(q) if frame.code == RequestCode.GET_MAX_OFFSET else 0
            return frame.reply(ResponseCode.SUCCESS, fields={"offset": off})
        if frame.code == RequestCode.VIEW_MESSAGE_BY_ID:
            for r in self.records:
                if ("offset" in f and r.physical_offset == f["offset"]) or (
                    r.topic == f.get("topic")
                    and r.properties.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX") == f.get("msg_id")
                ):
                    return frame.reply(ResponseCode.SUCCESS, body=r.raw)
            return frame.reply(ResponseCode.QUERY_NOT_FOUND, "no such message")
        if frame.code == RequestCode.QUERY_MESSAGE:
            hits = [
                r.raw
                for r in self.records
                if r.topic == f["topic"]
                and (
                    f["key"] in r.properties.get("KEYS", "").split(" ")
                    or f["key"] == r.properties.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX")
                )
            ][: f["max_num"]]
            if not hits:
                return frame.reply(ResponseCode.QUERY_NOT_FOUND, "none")
            return frame.reply(ResponseCode.SUCCESS, body=b"".join(hits))
        if frame.code == RequestCode.UPDATE_AND_CREATE_TOPIC:
            config = decode_body(bytes(frame.body), TopicConfig)
            self.topics[config.topic_name] = config
            return frame.reply(ResponseCode.SUCCESS)
        if frame.code == RequestCode.DELETE_TOPIC_IN_BROKER:
            if self.topics.pop(f["topic"], None) is None:
                return frame.reply(ResponseCode.TOPIC_NOT_EXIST, "no such topic")
            return frame.reply(ResponseCode.SUCCESS)
        if frame.code == RequestCode.GET_TOPIC_STATS:
            known = self.topics.get(f["topic"])
            if known is None:
                return frame.reply(ResponseCode.TOPIC_NOT_EXIST, "no such topic")
            stats = TopicStats(
                topic=f["topic"],
                broker_name=self.name,
                queues=[
                    QueueStats(
                        queue_id=q,
                        min_offset=0,
                        max_offset=len(self.queues.get((f["topic"], q), [])),
                    )
                    for q in range(known.write_queue_nums)
                ],
            )
            return frame.reply(ResponseCode.SUCCESS, body=encode_body(stats))
        return frame.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "fake")

    async def _send(self, frame: Frame) -> Reply:
        f = full_fields(frame)
        decoded = decode_send_body(bytes(frame.body))
        bodies, props = [bytes(b) for b in decoded.bodies], decoded.properties
        self.sends.append(
            SendSeen(
                frame.code,
                f["topic"],
                f["queue_id"],
                f["sys_flag"],
                f["flag"],
                len(bodies),
                frame.is_oneway,
            )
        )
        if self.hang:
            await self.released.wait()
            return None
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next:
            code, fields = self.fail_next.pop(0)
            if not fields:
                return frame.reply(code, "injected")
        else:
            code, fields = ResponseCode.SUCCESS, {}
        topic = f["topic"]
        config = self.topics.get(topic)
        if config is None:
            if not self.auto_create:
                return frame.reply(ResponseCode.TOPIC_NOT_EXIST, f"no topic {topic}")
            self.add_topic(topic)
            config = self.topics[topic]
        qid = f["queue_id"]
        if qid < 0:
            qid = 0
        if qid >= config.write_queue_nums:
            return frame.reply(ResponseCode.MESSAGE_ILLEGAL, "no such queue")
        q = self.queues.setdefault((topic, qid), [])
        head = BatchHeader(
            topic.encode(), qid, len(q), self.end, f["flag"], f["sys_flag"], f["born_ts"],
            pack_host(("127.0.0.1", 1)), int(time.time() * 1000), pack_host(("127.0.0.1", 2)),
            0, 0,
        )  # fmt: skip
        buf = bytes(encode_batch(head, bodies, props))
        first_offset, first_qoff = self.end, len(q)
        at = 0
        for size, p in zip(record_sizes(len(topic.encode()), bodies, props), props, strict=True):
            rec = StoredRecord(
                buf[at : at + size], topic, qid, len(q), self.end + at, decode_properties(p)
            )
            q.append(rec)
            self.records.append(rec)
            at += size
        self.end += len(buf)
        out = {
            "msg_ids": [decode_properties(p).get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX") for p in props],
            "queue_id": qid,
            "queue_offset": first_qoff,
            "offset": first_offset,
        }
        return frame.reply(code, fields=out)

    def _pull(self, frame: Frame) -> Reply:
        f = full_fields(frame)
        if f["topic"] not in self.topics:
            return frame.reply(ResponseCode.TOPIC_NOT_EXIST, "no topic")
        q = self.queues.get((f["topic"], f["queue_id"]), [])
        off = f["queue_offset"]
        fields = {"min_offset": 0, "max_offset": len(q)}
        if off > len(q):
            return frame.reply(
                ResponseCode.PULL_OFFSET_MOVED, "bad", {**fields, "next_begin_offset": len(q)}
            )
        if off == len(q):
            return frame.reply(
                ResponseCode.PULL_NOT_FOUND, "none", {**fields, "next_begin_offset": off}
            )
        out = q[off : off + f["max_msg_nums"]]
        return frame.reply(
            ResponseCode.SUCCESS,
            fields={**fields, "next_begin_offset": off + len(out)},
            body=b"".join(r.raw for r in out),
        )


@dataclass
class FakeNamesrv:
    routes: dict[str, TopicRouteData] = field(default_factory=dict)
    cluster: ClusterInfo = field(
        default_factory=lambda: ClusterInfo(broker_addr_table={}, cluster_addr_table={})
    )
    requests: Counter[int] = field(default_factory=Counter)
    hang: bool = False
    busy: bool = False
    deleted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = RemotingServer(self.handle, name="fake-namesrv")
        self._release = asyncio.Event()

    @property
    def addr(self) -> str:
        return self.server.address

    async def start(self) -> FakeNamesrv:
        await self.server.start()
        return self

    async def stop(self) -> None:
        self._release.set()
        await self.server.stop()

    def register(self, brokers: list[FakeBroker]) -> None:
        """Routes and cluster info from the brokers' current topics."""
        table = {
            b.name: BrokerData(cluster=b.cluster, broker_name=b.name, broker_addrs={0: b.addr})
            for b in brokers
        }
        clusters: dict[str, list[str]] = {}
        for b in brokers:
            clusters.setdefault(b.cluster, []).append(b.name)
        self.cluster = ClusterInfo(broker_addr_table=table, cluster_addr_table=clusters)
        self.routes = {}
        for b in brokers:
            for topic, config in b.topics.items():
                route = self.routes.setdefault(
                    topic, TopicRouteData(queue_datas=[], broker_datas=[])
                )
                route.queue_datas.append(
                    QueueData(
                        broker_name=b.name,
                        read_queue_nums=config.read_queue_nums,
                        write_queue_nums=config.write_queue_nums,
                        perm=config.perm,
                    )
                )
                route.broker_datas.append(table[b.name])

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        self.requests[frame.code] += 1
        if self.hang:
            await self._release.wait()
            return None
        if self.busy:
            return frame.reply(ResponseCode.SYSTEM_BUSY, "busy")
        if frame.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            route = self.routes.get(frame.fields["topic"])
            if route is None:
                return frame.reply(ResponseCode.TOPIC_NOT_EXIST, "no route")
            return frame.reply(ResponseCode.SUCCESS, body=encode_body(route))
        if frame.code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return frame.reply(ResponseCode.SUCCESS, body=encode_body(self.cluster))
        if frame.code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            return frame.reply(
                ResponseCode.SUCCESS, body=encode_body(TopicList(topics=list(self.routes)))
            )
        if frame.code == RequestCode.DELETE_TOPIC_IN_NAMESRV:
            self.routes.pop(frame.fields["topic"], None)
            self.deleted.append(frame.fields["topic"])
            return frame.reply(ResponseCode.SUCCESS)
        return frame.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "fake")


def full_fields(frame: Frame) -> dict[str, Any]:
    """The request's header fields with the defaults its typed header class fills in: clients
    leave out fields at their default, as the real servers' readers allow."""
    cls = request_class(frame.code)
    if cls is None:
        return dict(frame.fields)
    header = cls.from_fields(dict(frame.fields))
    out = {k: v for k, v in msgspec.structs.asdict(header).items() if v is not None}
    return {**out, **frame.fields}
