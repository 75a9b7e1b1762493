"""The admin client behind the CLI: topics, cluster, offsets, pulls, message lookups and
consumer groups.

:class:`AdminClient` is async; :class:`BlockingAdminClient` runs one on a private event loop
thread. Messages come back decoded (:class:`orbitmq.common.record.StoredMessage`, CRC-checked)
with compressed bodies already inflated and the compression bits cleared from ``sys_flag``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client.dlq import DlqMessage
from orbitmq.client.route import (
    MessageQueue,
    TopicPublishInfo,
    TopicRouteCache,
    TopicRouteNotFoundError,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    ProtocolError,
    RemoteError,
    SubscriptionGroupNotExistError,
)
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_topic
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import (
    PERM_READ_WRITE,
    ClusterInfo,
    TopicConfig,
    TopicConfigList,
    TopicList,
    TopicRouteData,
    TopicStats,
    decode_body,
    encode_body,
)
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    ConsumerConnection,
    ConsumeStats,
    GroupList,
    GroupSummary,
    MemberInfo,
    OffsetsBody,
    QueueConsumeStats,
    QueueOffset,
)
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.group_config import (
    SubscriptionGroupConfig,
    SubscriptionGroupConfigList,
    validate_group_config,
)
from orbitmq.protocol.messages import decode_records

log = logging.getLogger(__name__)

__all__ = [
    "RESET_POSITIONS",
    "AdminClient",
    "BlockingAdminClient",
    "GroupDescription",
    "PullResult",
    "PullStatus",
    "TopicDescription",
]

_T = TypeVar("_T")
_END_OF_TIME_MS = (1 << 63) - 1

RESET_POSITIONS = ("earliest", "latest", "timestamp")
"""Where INVOKE_BROKER_TO_RESET_OFFSET can move a group: each queue's min offset, its max
offset, or the first offset stored at or after a time."""


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    """Nothing at or after the offset (after the long poll, if one was asked for)."""
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    """Messages were there but none matched the tag filter; continue at next_begin_offset."""
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
    """The offset is outside [min_offset, max_offset]; next_begin_offset says where to go."""


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class PullResult:
    status: PullStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    topic: str
    route: TopicRouteData
    stats: list[TopicStats]
    """One entry per broker that answered, sorted by broker name."""
    errors: dict[str, str]
    """broker name -> why its stats are missing."""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group as the brokers see it: who is in it and how far it got in each queue."""

    group: str
    members: list[MemberInfo]
    """Online members, one per client id, sorted (the brokers each see the same client; the
    freshest heartbeat wins). Empty when no member is online."""
    queues: list[QueueConsumeStats]
    """Every queue of every broker the group subscribes to or has offsets in (its retry topic
    included), sorted by topic, broker, queue."""
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""
    """As the members' heartbeats declare them; empty when no member is online."""
    errors: dict[str, str] = field(default_factory=dict)
    """broker name -> why its part is missing (unreachable, an error answer)."""

    @property
    def total_lag(self) -> int:
        return sum(max(0, q.lag) for q in self.queues)

    @property
    def total_inflight(self) -> int:
        return sum(q.inflight for q in self.queues)


class AdminClient:
    """Administration over the Remoting protocol. ``async with AdminClient(addrs) as admin:``."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        timeout_s: float = 3.0,
        connect_timeout_s: float = 3.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.remoting = RemotingClient(
            connect_timeout=connect_timeout_s, ssl_context=ssl_context, name="admin"
        )
        self.routes = TopicRouteCache(
            namesrv_addrs,
            self.remoting,
            timeout_s=timeout_s,
            refresh_interval_s=0,  # admin asks afresh where it matters
            auto_create_fallback=False,
        )
        self._closed = False

    async def start(self) -> AdminClient:
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.routes.close()
        await self.remoting.close()

    async def __aenter__(self) -> AdminClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ plumbing

    async def _call(
        self,
        addr: str,
        code: int,
        fields: dict[str, Any] | None = None,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
        timeout_s: float | None = None,
    ) -> Frame:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        resp = await self.remoting.invoke(
            addr, Frame(code, fields=fields or {}, body=body), timeout
        )
        if resp.code not in ok:
            raise RemoteError(resp.code, resp.remark)
        return resp

    async def _namesrv(self, code: int, fields: dict[str, Any] | None = None) -> Frame:
        resp = await self.routes.request(code, fields or {})
        if resp.code != ResponseCode.SUCCESS:
            raise RemoteError(resp.code, resp.remark)
        return resp

    async def _info(self, topic: str, *, fresh: bool = False) -> TopicPublishInfo:
        return await (self.routes.refresh(topic) if fresh else self.routes.get(topic))

    async def _addr_of(self, mq: MessageQueue) -> str:
        info = await self._info(mq.topic)
        addr = info.broker_addrs.get(mq.broker_name)
        if addr is None:
            info = await self._info(mq.topic, fresh=True)
            addr = info.broker_addrs.get(mq.broker_name)
        if addr is None:
            raise ClientError(f"no master of broker {mq.broker_name!r} holds {mq.topic!r}")
        return addr

    # ------------------------------------------------------------------ cluster and topics

    async def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: brokers by name and cluster."""
        return await self.routes.cluster_info()

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address, of ``cluster`` (None: the only cluster there is)."""
        info = await self.cluster_info()
        clusters = info.cluster_addr_table
        if cluster is None:
            if not clusters:
                raise ClientError("no broker is registered with the NameServers")
            if len(clusters) > 1:
                raise ClientError(f"several clusters ({', '.join(sorted(clusters))}): name one")
            cluster = next(iter(clusters))
        if cluster not in clusters:
            raise ClientError(f"no cluster {cluster!r} (known: {', '.join(sorted(clusters))})")
        out: dict[str, str] = {}
        for name in clusters[cluster]:
            bd = info.broker_addr_table.get(name)
            master = bd.master_addr() if bd is not None else None
            if master:
                out[name] = master
        return out

    async def list_topics(self) -> list[str]:
        """Every topic the NameServers know, sorted."""
        resp = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
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
            {a: self._call(a, RequestCode.UPDATE_AND_CREATE_TOPIC, body=body) for a in addrs},
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
            *(self._call(a, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}) for a in targets),
            return_exceptions=True,
        )
        for addr, res in zip(targets, results, strict=True):
            absent = (
                isinstance(res, RemoteError) and res.response_code == ResponseCode.TOPIC_NOT_EXIST
            )
            if isinstance(res, BaseException) and not absent:  # absent already is deleted
                failures.append(f"broker {addr}: {res}")
        answers = await self.routes.broadcast(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
        for addr, ans in answers.items():
            if isinstance(ans, MQError):
                failures.append(f"NameServer {addr}: {ans}")
            elif ans.code != ResponseCode.SUCCESS:
                failures.append(f"NameServer {addr}: {RemoteError(ans.code, ans.remark)}")
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
            *(
                self._call(info.broker_addrs[n], RequestCode.GET_TOPIC_STATS, {"topic": topic})
                for n in names
            ),
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
        resp = await self._call(broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        return _decode(resp.body, TopicConfigList).topic_configs

    async def broker_runtime_info(self, broker_addr: str) -> dict[str, Any]:
        """GET_BROKER_RUNTIME_INFO: the broker's statistics fields."""
        resp = await self._call(broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        return dict(resp.fields)

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        """WIPE_WRITE_PERM_OF_BROKER on every NameServer: NameServer -> topics changed."""
        return await self._perm(RequestCode.WIPE_WRITE_PERM_OF_BROKER, broker_name, "wipe")

    async def add_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        """ADD_WRITE_PERM_OF_BROKER on every NameServer: NameServer -> topics changed."""
        return await self._perm(RequestCode.ADD_WRITE_PERM_OF_BROKER, broker_name, "add")

    async def _perm(self, code: int, broker_name: str, verb: str) -> dict[str, int | MQError]:
        answers = await self.routes.broadcast(code, {"broker_name": broker_name})
        out: dict[str, int | MQError] = {}
        for addr, ans in answers.items():
            if isinstance(ans, MQError):
                out[addr] = ans
            elif ans.code != ResponseCode.SUCCESS:
                out[addr] = RemoteError(ans.code, ans.remark)
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
        return await self._offset(mq, RequestCode.GET_MIN_OFFSET, {})

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of the queue will get."""
        return await self._offset(mq, RequestCode.GET_MAX_OFFSET, {})

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``."""
        return await self._offset(
            mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"timestamp": timestamp_ms}
        )

    async def _offset(self, mq: MessageQueue, code: int, extra: dict[str, Any]) -> int:
        addr = await self._addr_of(mq)
        resp = await self._call(addr, code, {"topic": mq.topic, "queue_id": mq.queue_id, **extra})
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
        addr = await self._addr_of(mq)
        fields = {
            "topic": mq.topic,
            "queue_id": mq.queue_id,
            "queue_offset": offset,
            "max_msg_nums": max_nums,
            "max_bytes": max_bytes,
            "tags": list(tags) if tags else None,
            "suspend_timeout_ms": suspend_timeout_ms,
        }
        resp = await self._call(
            addr,
            RequestCode.PULL_MESSAGE,
            fields,
            ok=frozenset(_PULL_STATUS),
            timeout_s=self.timeout_s + max(0, suspend_timeout_ms) / 1000.0,
        )
        status = _PULL_STATUS[ResponseCode(resp.code)]
        messages: list[StoredMessage] = []
        if status is PullStatus.FOUND:
            messages = [_codec.plain(m) for m in decode_records(memoryview(resp.body))]
            if tags:
                wanted = set(tags)
                messages = [m for m in messages if m.tags in wanted]
        next_begin = _int_field(resp, "next_begin_offset", offset)
        return PullResult(
            status,
            messages,
            next_begin,
            _int_field(resp, "min_offset", -1),
            _int_field(resp, "max_offset", -1),
        )

    # ------------------------------------------------------------------ consumer groups

    async def _all_masters(self) -> dict[str, str]:
        """broker name -> master address, over every cluster the NameServers know."""
        info = await self.cluster_info()
        out: dict[str, str] = {}
        for name, bd in info.broker_addr_table.items():
            master = bd.master_addr()
            if master:
                out[name] = master
        if not out:
            raise ClientError("no master broker is registered with the NameServers")
        return out

    async def _each_master(
        self, code: int, fields: dict[str, Any], *, ok: frozenset[int] = frozenset()
    ) -> dict[str, Frame | MQError]:
        """The same request to every master, concurrently: broker name -> answer or error.

        A non-SUCCESS answer whose code is in ``ok`` comes back as the Frame; other error
        answers as RemoteError (so callers can tell "unknown group" from "unreachable").
        """
        masters = await self._all_masters()
        names = sorted(masters)
        accept = ok | {ResponseCode.SUCCESS}
        results = await asyncio.gather(
            *(self._call(masters[n], code, fields, ok=accept) for n in names),
            return_exceptions=True,
        )
        out: dict[str, Frame | MQError] = {}
        for name, res in zip(names, results, strict=True):
            if isinstance(res, (Frame, MQError)):
                out[name] = res
            else:
                raise res
        return out

    async def list_groups(self) -> list[GroupSummary]:
        """GET_CONSUMER_GROUP_LIST on every master, merged by group, sorted by name.

        A group is known to a broker while it has members online there or offsets kept there.
        Merged: topics are the union, members the most any one broker sees (each member
        heartbeats every broker of its topics), types from the first broker that names them.
        Brokers that fail are logged and skipped; if none answers, ClientError.
        """
        answers = await self._each_master(RequestCode.GET_CONSUMER_GROUP_LIST, {})
        merged: dict[str, GroupSummary] = {}
        failures: list[str] = []
        for name, ans in answers.items():
            if isinstance(ans, MQError):
                failures.append(f"{name}: {ans}")
                continue
            for g in _decode(ans.body, GroupList).groups:
                have = merged.get(g.group)
                if have is None:
                    merged[g.group] = GroupSummary(
                        group=g.group,
                        consume_type=g.consume_type,
                        message_model=g.message_model,
                        members=g.members,
                        topics=sorted(set(g.topics)),
                    )
                    continue
                have.consume_type = have.consume_type or g.consume_type
                have.message_model = have.message_model or g.message_model
                have.members = max(have.members, g.members)
                have.topics = sorted(set(have.topics) | set(g.topics))
        if failures and len(failures) == len(answers):
            raise ClientError("no broker answered: " + "; ".join(failures))
        for line in failures:
            log.warning("group list from broker %s", line)
        return [merged[g] for g in sorted(merged)]

    async def consume_stats(self, group: str, topic: str | None = None) -> list[QueueConsumeStats]:
        """GET_CONSUME_STATS on every master, merged: per queue the broker's max offset, the
        group's committed offset, the lag, the last consume time and (Pop) in-flight messages.

        Raises SubscriptionGroupNotExistError when no broker knows the group, ClientError when
        some broker could not answer (see :meth:`describe_group` for a partial answer).
        """
        queues, errors, known = await self._consume_stats(group, topic)
        if not known:
            raise _unknown_group(group)
        if errors:
            raise ClientError(
                "consume stats failed on " + "; ".join(f"{b}: {e}" for b, e in errors.items())
            )
        return queues

    async def _consume_stats(
        self, group: str, topic: str | None
    ) -> tuple[list[QueueConsumeStats], dict[str, str], bool]:
        fields: dict[str, Any] = {"group": group}
        if topic is not None:
            fields["topic"] = topic
        answers = await self._each_master(
            RequestCode.GET_CONSUME_STATS,
            fields,
            ok=frozenset({ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST}),
        )
        queues: list[QueueConsumeStats] = []
        errors: dict[str, str] = {}
        known = False
        for name, ans in answers.items():
            if isinstance(ans, MQError):
                errors[name] = str(ans)
            elif ans.code == ResponseCode.SUCCESS:
                known = True
                queues.extend(_decode(ans.body, ConsumeStats).queues)
        queues.sort(key=lambda q: (q.topic, q.broker_name, q.queue_id))
        # A broker that could not answer may know it: only "nobody knows" is unknown.
        return queues, errors, known or bool(errors)

    async def describe_group(self, group: str) -> GroupDescription:
        """Members (GET_CONSUMER_CONNECTION_LIST; CONSUMER_NOT_ONLINE: none) and per-queue
        stats (GET_CONSUME_STATS) from every master.

        Raises SubscriptionGroupNotExistError when no broker knows the group (no member online
        and no offsets anywhere). Brokers that fail are listed in ``errors``.
        """
        conn_answers, (queues, errors, known) = await asyncio.gather(
            self._each_master(
                RequestCode.GET_CONSUMER_CONNECTION_LIST,
                {"group": group},
                ok=frozenset(
                    {ResponseCode.CONSUMER_NOT_ONLINE, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST}
                ),
            ),
            self._consume_stats(group, None),
        )
        members: dict[str, MemberInfo] = {}
        kinds: tuple[str, str, str] = ("", "", "")
        for name, ans in conn_answers.items():
            if isinstance(ans, MQError):
                errors.setdefault(name, str(ans))
                continue
            if ans.code != ResponseCode.SUCCESS:
                continue
            conn = _decode(ans.body, ConsumerConnection)
            if not kinds[0]:
                kinds = (conn.consume_type, conn.message_model, conn.consume_from_where)
            for m in conn.members:
                have = members.get(m.client_id)
                if have is None or m.last_heartbeat_ms > have.last_heartbeat_ms:
                    members[m.client_id] = m
        if not known and not members:
            raise _unknown_group(group)
        return GroupDescription(
            group=group,
            members=[members[c] for c in sorted(members)],
            queues=queues,
            consume_type=kinds[0],
            message_model=kinds[1],
            consume_from_where=kinds[2],
            errors=dict(sorted(errors.items())),
        )

    async def reset_offset(
        self, group: str, topic: str, position: str, timestamp_ms: int | None = None
    ) -> dict[str, list[QueueOffset]]:
        """Move ``group``'s offsets in every queue of ``topic`` (INVOKE_BROKER_TO_RESET_OFFSET on
        every master serving the topic): ``position`` is "earliest", "latest" or "timestamp"
        (then ``timestamp_ms`` is required). Online members are told by the broker.

        Returns broker name -> the new offsets. A broker that answers "unknown group" while
        another resets is reported with no offsets (the group never consumed there). Raises
        SubscriptionGroupNotExistError when no broker knows the group, ClientError naming the
        brokers that failed otherwise (after trying them all).
        """
        if position not in RESET_POSITIONS:
            raise ClientError(f"position {position!r}: one of {', '.join(RESET_POSITIONS)}")
        if position == "timestamp" and timestamp_ms is None:
            raise ClientError("reset to a timestamp needs timestamp_ms")
        if timestamp_ms is not None and timestamp_ms < 0:
            raise ClientError(f"timestamp_ms {timestamp_ms} is negative")
        info = await self._info(topic, fresh=True)
        if not info.broker_addrs:
            raise TopicRouteNotFoundError(topic)
        fields: dict[str, Any] = {"group": group, "topic": topic, "position": position}
        if position == "timestamp":
            fields["timestamp_ms"] = timestamp_ms
        names = sorted(info.broker_addrs)
        results = await asyncio.gather(
            *(
                self._call(info.broker_addrs[n], RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
                for n in names
            ),
            return_exceptions=True,
        )
        out: dict[str, list[QueueOffset]] = {}
        unknown: list[str] = []
        failures: list[str] = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, RemoteError) and (
                res.response_code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            ):
                unknown.append(name)
            elif isinstance(res, MQError):
                failures.append(f"{name}: {res}")
            elif isinstance(res, BaseException):
                raise res
            else:
                offsets = _decode(res.body, OffsetsBody).offsets if res.body else []
                out[name] = sorted(offsets, key=lambda o: (o.topic, o.queue_id))
        if failures:
            raise ClientError(
                f"reset offset of group {group!r} on {topic!r} failed on " + "; ".join(failures)
            )
        if not out:
            raise _unknown_group(group)
        for name in unknown:
            out[name] = []
        return dict(sorted(out.items()))

    # ------------------------------------------------------------------ group configs, DLQ

    async def _masters_of(self, cluster: str | None) -> dict[str, str]:
        return await (self.masters(cluster) if cluster is not None else self._all_masters())

    async def update_group_config(
        self, config: SubscriptionGroupConfig, *, cluster: str | None = None
    ) -> list[str]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on every master (of ``cluster``; None: all):
        the group's retry policy and DLQ limit (docs/retry-dlq.md). Validated here first
        (MessageIllegalError naming the field). Returns the broker names; ClientError naming
        the brokers that failed."""
        validate_group_config(config)
        masters = await self._masters_of(cluster)
        body = encode_body(config)
        code = RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
        await _all_or_raise(
            {a: self._call(a, code, {}, body) for a in masters.values()},
            f"update of group config {config.group_name!r}",
        )
        return sorted(masters)

    async def get_group_config(self, group: str) -> SubscriptionGroupConfig:
        """The group's config as the first master (by name) that answers has it; the
        defaults when it was never configured."""
        answers = await self._each_master(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {"group": group}
        )
        errors: list[str] = []
        for name in sorted(answers):
            ans = answers[name]
            if isinstance(ans, MQError):
                errors.append(f"{name}: {ans}")
                continue
            configs = _decode(ans.body, SubscriptionGroupConfigList).configs
            if configs:
                return configs[0]
        raise ClientError("no broker answered: " + "; ".join(errors))

    async def group_configs(self) -> dict[str, list[SubscriptionGroupConfig]]:
        """broker name -> the groups configured there (not the ones left at the defaults)."""
        answers = await self._each_master(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
        out: dict[str, list[SubscriptionGroupConfig]] = {}
        for name, ans in sorted(answers.items()):
            if isinstance(ans, MQError):
                raise ClientError(f"group configs from {name}: {ans}")
            out[name] = _decode(ans.body, SubscriptionGroupConfigList).configs
        return out

    async def delete_group_config(self, group: str, *, cluster: str | None = None) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP on every master: the group is back to the defaults.
        Returns the brokers that had a config for it."""
        masters = await self._masters_of(cluster)
        names = sorted(masters)
        results = await asyncio.gather(
            *(
                self._call(masters[n], RequestCode.DELETE_SUBSCRIPTIONGROUP, {"group": group})
                for n in names
            ),
            return_exceptions=True,
        )
        deleted: list[str] = []
        failures: list[str] = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, MQError):
                failures.append(f"{name}: {res}")
            elif isinstance(res, BaseException):
                raise res
            elif res.fields.get("deleted") is True:
                deleted.append(name)
        if failures:
            raise ClientError(f"delete of group config {group!r} failed on " + "; ".join(failures))
        return deleted

    async def dlq_messages(self, group: str, *, max_messages: int = 1000) -> list[DlqMessage]:
        """The messages in ``%DLQ%<group>`` on every master (GET_DLQ_MESSAGES: consumers cannot
        pull a DLQ), oldest first per broker, at most ``max_messages`` in all. Brokers that
        fail are logged and skipped; ClientError when none answers."""
        if max_messages < 1:
            raise ClientError(f"max_messages must be at least 1, not {max_messages}")
        masters = await self._all_masters()
        ok = frozenset(
            {ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED}
        )
        out: list[DlqMessage] = []
        failures: list[str] = []
        for name in sorted(masters):
            offset, moves = -1, 0
            while len(out) < max_messages:
                fields = {
                    "group": group,
                    "queue_offset": offset,
                    "max_msg_nums": min(256, max_messages - len(out)),
                }
                try:
                    resp = await self._call(
                        masters[name], RequestCode.GET_DLQ_MESSAGES, fields, ok=ok
                    )
                except MQError as exc:
                    failures.append(f"{name}: {exc}")
                    break
                next_begin = _int_field(resp, "next_begin_offset", offset)
                if resp.code == ResponseCode.PULL_OFFSET_MOVED and moves < 3:
                    offset, moves = next_begin, moves + 1  # retention removed the start
                    continue
                if resp.code != ResponseCode.SUCCESS or next_begin <= offset:
                    break
                out += [DlqMessage(name, m) for m in _records(resp)]
                offset = next_begin
        if failures and len(failures) == len(masters):
            raise ClientError("no broker answered: " + "; ".join(failures))
        for line in failures:
            log.warning("DLQ of %s from broker %s", group, line)
        return out[:max_messages]

    # ------------------------------------------------------------------ message lookups

    async def get_message_by_id(self, topic: str, msg_id: str) -> StoredMessage | None:
        """VIEW_MESSAGE_BY_ID on each broker of the topic; None when none has it."""
        info = await self._info(topic, fresh=True)
        answers = await self._each_broker(
            info, RequestCode.VIEW_MESSAGE_BY_ID, {"topic": topic, "msg_id": msg_id}
        )
        for msgs in answers:
            if msgs:
                return msgs[0]
        return None

    async def get_message_by_offset(self, broker_addr: str, offset: int) -> StoredMessage | None:
        """VIEW_MESSAGE_BY_ID by CommitLog offset on one broker; None when there is none."""
        resp = await self._call(
            broker_addr,
            RequestCode.VIEW_MESSAGE_BY_ID,
            {"offset": offset},
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
        fields = {
            "topic": topic,
            "key": key,
            "max_num": max_num,
            "begin_ts": begin_ts_ms,
            "end_ts": _END_OF_TIME_MS if end_ts_ms is None else end_ts_ms,
        }
        answers = await self._each_broker(info, RequestCode.QUERY_MESSAGE, fields)
        found = [m for msgs in answers for m in msgs]
        found.sort(key=lambda m: (m.store_timestamp_ms, m.physical_offset))
        return found[:max_num] if max_num > 0 else found

    async def _each_broker(
        self, info: TopicPublishInfo, code: int, fields: dict[str, Any]
    ) -> list[list[StoredMessage]]:
        addrs = [info.broker_addrs[n] for n in sorted(info.broker_addrs)]
        ok = frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND})
        results = await asyncio.gather(
            *(self._call(a, code, fields, ok=ok) for a in addrs), return_exceptions=True
        )
        out: list[list[StoredMessage]] = []
        errors: list[str] = []
        for addr, res in zip(addrs, results, strict=True):
            if isinstance(res, MQError):
                errors.append(f"{addr}: {res}")
            elif isinstance(res, BaseException):
                raise res
            else:
                out.append(_records(res))
        if errors and not any(out):
            raise ClientError("no broker answered: " + "; ".join(errors))
        for err in errors:
            log.warning("lookup on broker %s", err)
        return out


def _unknown_group(group: str) -> SubscriptionGroupNotExistError:
    return SubscriptionGroupNotExistError(
        f"consumer group {group!r} is unknown to every broker (no member online, no offsets)"
    )


def _records(resp: Frame) -> list[StoredMessage]:
    if resp.code != ResponseCode.SUCCESS or not resp.body:
        return []
    return [_codec.plain(m) for m in decode_records(memoryview(resp.body))]


def _int_field(resp: Frame, name: str, default: int | None = None) -> int:
    value = resp.fields.get(name, default)
    if value is None:
        raise ProtocolError(f"response lacks field {name!r}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"response field {name!r} is not an integer: {value!r}") from exc


def _decode(body: Buffer, typ: type[_T]) -> _T:
    try:
        return decode_body(bytes(body) if isinstance(body, bytearray) else body, typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {typ.__name__} body: {exc}") from exc


async def _all_or_raise(calls: dict[str, Coroutine[Any, Any, Any]], what: str) -> None:
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    failures = [
        f"{addr}: {res}"
        for addr, res in zip(calls, results, strict=True)
        if isinstance(res, BaseException)
    ]
    if failures:
        raise ClientError(f"{what} failed on " + "; ".join(failures))


class BlockingAdminClient(BlockingFacade[AdminClient]):
    """:class:`AdminClient` with blocking methods, on a private event loop thread."""

    def __init__(self, namesrv_addrs: str | Sequence[str], **options: Any) -> None:
        self._thread = LoopThread("orbitmq-admin")
        self._async = AdminClient(namesrv_addrs, **options)
        self._closed = False

    @property
    def async_client(self) -> AdminClient:
        return self._async

    def cluster_info(self) -> ClusterInfo:
        return self._thread.run(self._async.cluster_info())

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        return self._thread.run(self._async.masters(cluster))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._async.list_topics())

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._thread.run(self._async.topic_route(topic))

    def create_topic(self, topic: str, **options: Any) -> list[str]:
        return self._thread.run(self._async.create_topic(topic, **options))

    def update_topic(
        self, config: TopicConfig, *, cluster: str | None = None, broker_addr: str | None = None
    ) -> list[str]:
        return self._thread.run(
            self._async.update_topic(config, cluster=cluster, broker_addr=broker_addr)
        )

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        return self._thread.run(self._async.delete_topic(topic, cluster=cluster))

    def describe_topic(self, topic: str) -> TopicDescription:
        return self._thread.run(self._async.describe_topic(topic))

    def topic_stats(self, topic: str) -> list[TopicStats]:
        return self._thread.run(self._async.topic_stats(topic))

    def topic_configs(self, broker_addr: str) -> list[TopicConfig]:
        return self._thread.run(self._async.topic_configs(broker_addr))

    def broker_runtime_info(self, broker_addr: str) -> dict[str, Any]:
        return self._thread.run(self._async.broker_runtime_info(broker_addr))

    def wipe_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        return self._thread.run(self._async.wipe_write_perm(broker_name))

    def add_write_perm(self, broker_name: str) -> dict[str, int | MQError]:
        return self._thread.run(self._async.add_write_perm(broker_name))

    def queues(self, topic: str, *, writable: bool = False) -> list[MessageQueue]:
        return self._thread.run(self._async.queues(topic, writable=writable))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._thread.run(self._async.min_offset(mq))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._thread.run(self._async.max_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._thread.run(self._async.search_offset(mq, timestamp_ms))

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        *,
        max_nums: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tags: Sequence[str] | None = None,
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        return self._thread.run(
            self._async.pull(
                mq,
                offset,
                max_nums=max_nums,
                max_bytes=max_bytes,
                tags=tags,
                suspend_timeout_ms=suspend_timeout_ms,
            )
        )

    def get_message_by_id(self, topic: str, msg_id: str) -> StoredMessage | None:
        return self._thread.run(self._async.get_message_by_id(topic, msg_id))

    def get_message_by_offset(self, broker_addr: str, offset: int) -> StoredMessage | None:
        return self._thread.run(self._async.get_message_by_offset(broker_addr, offset))

    def query_by_key(self, topic: str, key: str, **options: Any) -> list[StoredMessage]:
        return self._thread.run(self._async.query_by_key(topic, key, **options))

    def list_groups(self) -> list[GroupSummary]:
        return self._thread.run(self._async.list_groups())

    def describe_group(self, group: str) -> GroupDescription:
        return self._thread.run(self._async.describe_group(group))

    def consume_stats(self, group: str, topic: str | None = None) -> list[QueueConsumeStats]:
        return self._thread.run(self._async.consume_stats(group, topic))

    def reset_offset(
        self, group: str, topic: str, position: str, timestamp_ms: int | None = None
    ) -> dict[str, list[QueueOffset]]:
        return self._thread.run(self._async.reset_offset(group, topic, position, timestamp_ms))

    def update_group_config(
        self, config: SubscriptionGroupConfig, *, cluster: str | None = None
    ) -> list[str]:
        return self._thread.run(self._async.update_group_config(config, cluster=cluster))

    def get_group_config(self, group: str) -> SubscriptionGroupConfig:
        return self._thread.run(self._async.get_group_config(group))

    def group_configs(self) -> dict[str, list[SubscriptionGroupConfig]]:
        return self._thread.run(self._async.group_configs())

    def delete_group_config(self, group: str, *, cluster: str | None = None) -> list[str]:
        return self._thread.run(self._async.delete_group_config(group, cluster=cluster))

    def dlq_messages(self, group: str, *, max_messages: int = 1000) -> list[DlqMessage]:
        return self._thread.run(self._async.dlq_messages(group, max_messages=max_messages))
