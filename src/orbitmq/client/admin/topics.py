"""Admin operations on the cluster, topics, queues, offsets, pulls and message lookups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from orbitmq.client import _codec
from orbitmq.client.admin.base import (
    _END_OF_TIME_MS,
    AdminBase,
    _all_or_raise,
    _decode,
    _int_field,
    _records,
)
from orbitmq.client.admin.types import PULL_STATUS as _PULL_STATUS
from orbitmq.client.admin.types import PullResult, PullStatus, RawPull, TopicDescription
from orbitmq.client.route import (
    MessageQueue,
    TopicRouteNotFoundError,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    RemoteError,
    error_for,
)
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_topic
from orbitmq.protocol.bodies import (
    PERM_READ_WRITE,
    TopicConfig,
    TopicConfigList,
    TopicList,
    TopicRouteData,
    TopicStats,
    encode_body,
)
from orbitmq.protocol.header import Header
from orbitmq.protocol.messages import decode_records
from orbitmq.protocol.requests import (
    AddWritePermRequest,
    DeleteTopicInBrokerRequest,
    DeleteTopicInNamesrvRequest,
    GetAllTopicConfigRequest,
    GetAllTopicListRequest,
    GetBrokerRuntimeInfoRequest,
    GetMaxOffsetRequest,
    GetMinOffsetRequest,
    GetTopicStatsRequest,
    PullMessageRequest,
    QueryMessageRequest,
    SearchOffsetRequest,
    UpdateTopicRequest,
    ViewMessageRequest,
    WipeWritePermRequest,
)

log = logging.getLogger(__name__)

__all__ = ["TopicAdmin"]


class TopicAdmin(AdminBase):
    """Cluster, topics, queues and offsets, pulls, message lookups."""

    async def list_topics(self) -> list[str]:
        """Every topic the NameServers know, sorted."""
        resp = await self._namesrv(GetAllTopicListRequest())
        return sorted(_decode(resp.body, TopicList).topics)

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The route as a NameServer has it now (TopicRouteNotFoundError if none knows it)."""
        info = await self._info(topic, fresh=True)
        if info.route is None:
            raise TopicRouteNotFoundError(topic)
        return info.route

    async def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ_WRITE,
        message_type: str = "NORMAL",
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        cluster: str | None = None,
        broker_addr: str | None = None,
    ) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on ``broker_addr``, or on every master of ``cluster`` (None:
        the only cluster). Creates or updates. Returns the broker addresses that applied it."""
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums,
            perm=perm,
            message_type=message_type,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
        )
        return await self.update_topic(config, cluster=cluster, broker_addr=broker_addr)

    async def update_topic(
        self, config: TopicConfig, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        validate_topic(config.topic_name)
        addrs = [broker_addr] if broker_addr else sorted((await self.masters(cluster)).values())
        if not addrs:
            raise ClientError(f"cluster {cluster!r} has no master broker")
        body = encode_body(config)
        await _all_or_raise(
            {a: self._call(a, UpdateTopicRequest(), body) for a in addrs},
            f"create/update topic {config.topic_name!r}",
        )
        self.routes.forget(config.topic_name)
        return addrs

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """DELETE_TOPIC_IN_BROKER on every master holding it (and every master of ``cluster`` if
        given), then DELETE_TOPIC_IN_NAMESRV on every NameServer. Returns the broker addresses.
        A broker that does not have the topic counts as done.

        Raises ClientError naming the brokers/NameServers that failed, after trying them all.
        """
        addrs: set[str] = set()
        with contextlib.suppress(TopicRouteNotFoundError):
            addrs.update((await self._info(topic, fresh=True)).broker_addrs.values())
        if cluster is not None or not addrs:
            try:
                addrs.update((await self.masters(cluster)).values())
            except ClientError:
                if not addrs:
                    raise
        failures: list[str] = []
        targets = sorted(addrs)
        results = await asyncio.gather(
            *(self._call(a, DeleteTopicInBrokerRequest(topic=topic)) for a in targets),
            return_exceptions=True,
        )
        for addr, res in zip(targets, results, strict=True):
            absent = isinstance(res, RemoteError) and res.code == ResponseCode.TOPIC_NOT_EXIST
            if isinstance(res, BaseException) and not absent:  # absent already is deleted
                failures.append(f"broker {addr}: {res}")
        answers = await self.routes.broadcast(DeleteTopicInNamesrvRequest(topic=topic))
        for addr, ans in answers.items():
            if isinstance(ans, MQError):
                failures.append(f"NameServer {addr}: {ans}")
            elif ans.code != ResponseCode.SUCCESS:
                failures.append(f"NameServer {addr}: {error_for(ans.code, ans.remark)}")
        self.routes.forget(topic)
        if failures:
            raise ClientError(f"delete topic {topic!r} failed on: " + "; ".join(failures))
        return targets

    async def topic_stats(self, topic: str) -> list[TopicStats]:
        return (await self.describe_topic(topic)).stats

    async def describe_topic(self, topic: str) -> TopicDescription:
        """The route plus GET_TOPIC_STATS (per-queue min/max offsets) from each broker of it."""
        info = await self._info(topic, fresh=True)
        if info.route is None:
            raise TopicRouteNotFoundError(topic)
        names = sorted(info.broker_addrs)
        results = await asyncio.gather(
            *(self._call(info.broker_addrs[n], GetTopicStatsRequest(topic=topic)) for n in names),
            return_exceptions=True,
        )
        stats: list[TopicStats] = []
        errors: dict[str, str] = {}
        for name, res in zip(names, results, strict=True):
            if isinstance(res, MQError):
                errors[name] = str(res)
            elif isinstance(res, BaseException):
                raise res
            else:
                stats.append(_decode(res.body, TopicStats))
        return TopicDescription(topic, info.route, stats, errors)

    async def topic_configs(self, broker_addr: str) -> list[TopicConfig]:
        """GET_ALL_TOPIC_CONFIG of one broker."""
        resp = await self._call(broker_addr, GetAllTopicConfigRequest())
        return _decode(resp.body, TopicConfigList).topic_configs

    async def broker_runtime_info(self, broker_addr: str) -> dict[str, Any]:
        """GET_BROKER_RUNTIME_INFO: the broker's statistics fields."""
        resp = await self._call(broker_addr, GetBrokerRuntimeInfoRequest())
        return dict(resp.fields)

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        """WIPE_WRITE_PERM_OF_BROKER on every NameServer: NameServer -> topics changed."""
        return await self._perm(WipeWritePermRequest(broker_name=broker_name), "wipe")

    async def add_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        """ADD_WRITE_PERM_OF_BROKER on every NameServer: NameServer -> topics changed."""
        return await self._perm(AddWritePermRequest(broker_name=broker_name), "add")

    async def _perm(self, header: Header, verb: str) -> dict[str, int | MQError]:
        answers = await self.routes.broadcast(header)
        out: dict[str, int | MQError] = {}
        for addr, ans in answers.items():
            if isinstance(ans, MQError):
                out[addr] = ans
            elif ans.code != ResponseCode.SUCCESS:
                out[addr] = error_for(ans.code, ans.remark)
            else:
                out[addr] = int(ans.fields.get(f"{verb}_topic_count", 0))
        return out

    # ------------------------------------------------------------------ queues and offsets

    async def queues(self, topic: str, *, writable: bool = False) -> list[MessageQueue]:
        """The topic's readable (or writable) queues, sorted; asks the NameServers afresh."""
        info = await self._info(topic, fresh=True)
        if info.route is None:
            raise TopicRouteNotFoundError(topic)
        return list(info.write_queues if writable else info.read_queues)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset(mq, GetMinOffsetRequest(topic=mq.topic, queue_id=mq.queue_id))

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of the queue will get."""
        return await self._offset(mq, GetMaxOffsetRequest(topic=mq.topic, queue_id=mq.queue_id))

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``."""
        header = SearchOffsetRequest(topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms)
        return await self._offset(mq, header)

    async def _offset(self, mq: MessageQueue, header: Header) -> int:
        addr = await self._addr_of(mq)
        resp = await self._call(addr, header)
        return _int_field(resp, "offset")

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        *,
        max_nums: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tags: Sequence[str] | None = None,
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        """PULL_MESSAGE from the queue's master, decoded and decompressed.

        ``tags`` filters by tag (the broker by tag hash, then here by the tag itself, so a hash
        collision never leaks a message). ``suspend_timeout_ms`` > 0 long-polls when there is
        nothing new yet. Continue from ``next_begin_offset``.
        """
        raw = await self.pull_raw(mq, offset, max_nums=max_nums, max_bytes=max_bytes,
                                  tags=tags, suspend_timeout_ms=suspend_timeout_ms)  # fmt: skip
        messages: list[StoredMessage] = []
        if raw.status is PullStatus.FOUND:
            messages = [_codec.plain(m) for m in decode_records(memoryview(raw.body))]
            if tags:
                wanted = set(tags)
                messages = [m for m in messages if m.tags in wanted]
        return PullResult(
            raw.status, messages, raw.next_begin_offset, raw.min_offset, raw.max_offset
        )

    async def pull_raw(
        self,
        mq: MessageQueue,
        offset: int,
        *,
        max_nums: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tags: Sequence[str] | None = None,
        suspend_timeout_ms: int = 0,
    ) -> RawPull:
        """:meth:`pull` without decoding: the records as the broker sent them (stored
        records back to back, not CRC-checked yet, bodies maybe compressed), for callers that
        re-encode them without a message object each (the Kafka gateway's Fetch)."""
        addr = await self._addr_of(mq)
        header = PullMessageRequest(
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            max_bytes=max_bytes,
            tags=list(tags) if tags else None,
            suspend_timeout_ms=suspend_timeout_ms,
        )
        resp = await self._call(
            addr,
            header,
            ok=frozenset(_PULL_STATUS),
            timeout_s=self.timeout_s + max(0, suspend_timeout_ms) / 1000.0,
        )
        status = _PULL_STATUS[ResponseCode(resp.code)]
        body = resp.body if status is PullStatus.FOUND else b""
        return RawPull(
            status,
            body if isinstance(body, bytes) else bytes(body),
            _int_field(resp, "next_begin_offset", offset),
            _int_field(resp, "min_offset", -1),
            _int_field(resp, "max_offset", -1),
        )

    # ------------------------------------------------------------------ message lookups

    async def get_message_by_id(self, topic: str, msg_id: str) -> StoredMessage | None:
        """VIEW_MESSAGE_BY_ID on each broker of the topic; None when none has it."""
        info = await self._info(topic, fresh=True)
        answers = await self._each_broker(info, ViewMessageRequest(topic=topic, msg_id=msg_id))
        for msgs in answers:
            if msgs:
                return msgs[0]
        return None

    async def get_message_by_offset(self, broker_addr: str, offset: int) -> StoredMessage | None:
        """VIEW_MESSAGE_BY_ID by CommitLog offset on one broker; None when there is none."""
        resp = await self._call(
            broker_addr,
            ViewMessageRequest(offset=offset),
            ok=frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND}),
        )
        msgs = _records(resp)
        return msgs[0] if msgs else None

    async def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 64,
        begin_ts_ms: int = 0,
        end_ts_ms: int | None = None,
    ) -> list[StoredMessage]:
        """QUERY_MESSAGE on each broker of the topic: messages with ``key`` among their keys (or
        that unique id), by store time."""
        info = await self._info(topic, fresh=True)
        header = QueryMessageRequest(
            topic=topic,
            key=key,
            max_num=max_num,
            begin_ts=begin_ts_ms,
            end_ts=_END_OF_TIME_MS if end_ts_ms is None else end_ts_ms,
        )
        answers = await self._each_broker(info, header)
        found = [m for msgs in answers for m in msgs]
        found.sort(key=lambda m: (m.store_timestamp_ms, m.physical_offset))
        return found[:max_num] if max_num > 0 else found
