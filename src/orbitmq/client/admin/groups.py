"""Admin operations on consumer groups: membership, consume stats, offset resets, group configs
and dead-letter queues."""

from __future__ import annotations

import asyncio
import logging

from orbitmq.client.admin.base import (
    AdminBase,
    _all_or_raise,
    _decode,
    _int_field,
    _records,
    _unknown_group,
)
from orbitmq.client.admin.types import RESET_POSITIONS, GroupDescription
from orbitmq.client.dlq import DlqMessage
from orbitmq.client.route import (
    MessageQueue,
    TopicRouteNotFoundError,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    RemoteError,
)
from orbitmq.protocol.bodies import (
    encode_body,
)
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
from orbitmq.protocol.group_config import (
    SubscriptionGroupConfig,
    SubscriptionGroupConfigList,
    validate_group_config,
)
from orbitmq.protocol.requests import (
    DeleteSubscriptionGroupRequest,
    GetAllSubscriptionGroupRequest,
    GetConsumerConnectionListRequest,
    GetConsumerGroupListRequest,
    GetConsumeStatsRequest,
    GetDlqMessagesRequest,
    QueryConsumerOffsetRequest,
    ResetOffsetRequest,
    UpdateConsumerOffsetRequest,
    UpdateSubscriptionGroupRequest,
)

log = logging.getLogger(__name__)

__all__ = ["GroupAdmin"]


class GroupAdmin(AdminBase):
    """Consumer groups, their configs and dead-letter queues."""

    async def list_groups(self) -> list[GroupSummary]:
        """GET_CONSUMER_GROUP_LIST on every master, merged by group, sorted by name.

        A group is known to a broker while it has members online there or offsets kept there.
        Merged: topics are the union, members the most any one broker sees (each member
        heartbeats every broker of its topics), types from the first broker that names them.
        Brokers that fail are logged and skipped; if none answers, ClientError.
        """
        answers = await self._each_master(GetConsumerGroupListRequest())
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
        answers = await self._each_master(
            GetConsumeStatsRequest(group=group, topic=topic or ""),
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
                GetConsumerConnectionListRequest(group=group),
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
        header = ResetOffsetRequest(
            group=group,
            topic=topic,
            position=position,
            timestamp_ms=timestamp_ms if position == "timestamp" else None,
        )
        names = sorted(info.broker_addrs)
        results = await asyncio.gather(
            *(self._call(info.broker_addrs[n], header) for n in names),
            return_exceptions=True,
        )
        out: dict[str, list[QueueOffset]] = {}
        unknown: list[str] = []
        failures: list[str] = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, RemoteError) and (
                res.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
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

    async def commit_offsets(self, group: str, offsets: dict[MessageQueue, int]) -> None:
        """Store ``group``'s offsets (UPDATE_CONSUMER_OFFSET, one request per broker with an
        OffsetsBody): what a consumer's commit does, for gateways and tools."""
        by_broker: dict[str, list[QueueOffset]] = {}
        for mq, offset in offsets.items():
            by_broker.setdefault(mq.broker_name, []).append(
                QueueOffset(topic=mq.topic, queue_id=mq.queue_id, offset=offset)
            )
        calls = {}
        for name, items in by_broker.items():
            mq = next(q for q in offsets if q.broker_name == name)
            addr = await self._addr_of(mq)
            body = encode_body(OffsetsBody(group=group, offsets=items))
            calls[name] = self._call(addr, UpdateConsumerOffsetRequest(group=group), body)
        await _all_or_raise(calls, f"commit offsets of group {group!r}")

    async def committed_offset(self, group: str, mq: MessageQueue) -> int | None:
        """``group``'s stored offset in ``mq`` (QUERY_CONSUMER_OFFSET, stored offsets only), or
        None when it never committed there."""
        addr = await self._addr_of(mq)
        header = QueryConsumerOffsetRequest(
            group=group, topic=mq.topic, queue_id=mq.queue_id, set_zero_if_not_found=False
        )
        resp = await self._call(
            addr, header, ok=frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND})
        )
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return _int_field(resp, "offset")

    # ------------------------------------------------------------------ group configs, DLQ
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
        header = UpdateSubscriptionGroupRequest()
        await _all_or_raise(
            {a: self._call(a, header, body) for a in masters.values()},
            f"update of group config {config.group_name!r}",
        )
        return sorted(masters)

    async def get_group_config(self, group: str) -> SubscriptionGroupConfig:
        """The group's config as the first master (by name) that answers has it; the
        defaults when it was never configured."""
        answers = await self._each_master(GetAllSubscriptionGroupRequest(group=group))
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
        answers = await self._each_master(GetAllSubscriptionGroupRequest())
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
            *(self._call(masters[n], DeleteSubscriptionGroupRequest(group=group)) for n in names),
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
                header = GetDlqMessagesRequest(
                    group=group,
                    queue_offset=offset,
                    max_msg_nums=min(256, max_messages - len(out)),
                )
                try:
                    resp = await self._call(masters[name], header, ok=ok)
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
