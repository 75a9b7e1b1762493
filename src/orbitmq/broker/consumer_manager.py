"""Consumer groups as one broker sees them: who is in each group, on which connection, subscribing
to what.

A broker knows a consumer only through its heartbeats (HEART_BEAT, body HeartbeatData): each one
registers or refreshes the client's membership of every group it lists, bound to the connection
the heartbeat came on. A member leaves when it says so (UNREGISTER_CLIENT), when that connection
closes, or when it has sent no heartbeat for ``expiry_s``. Whenever the set of members of a group
(or the set of topics the group subscribes to) changes, every member still there is sent
NOTIFY_CONSUMER_IDS_CHANGED (oneway, field ``group``) so clients rebalance at once instead of
waiting for their next periodic rebalance. Listeners registered with :meth:`on_leave` learn of
every departure (the lock manager frees the leaver's queue locks that way).

Every subscription of a heartbeat is validated and compiled before anything is registered: a bad
one refuses the whole heartbeat (SUBSCRIPTION_PARSE_FAILED or MESSAGE_ILLEGAL), so a group never
holds a subscription the broker could not evaluate.

Producer groups in heartbeats are only recorded (client id -> connection), for a later
transactional check-back; they carry no behaviour yet.

All state lives on the event loop thread; nothing here blocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orbitmq.common.clock import now_ms
from orbitmq.common.errors import FilterExpressionError, MessageIllegalError, MQError
from orbitmq.common.filter import MessageFilter, compile_filter
from orbitmq.common.validation import validate_group, validate_topic
from orbitmq.net.connection import Connection
from orbitmq.protocol.consumer import (
    CONSUME_FROM,
    CONSUME_TYPES,
    EXPRESSION_TYPES,
    MESSAGE_MODELS,
    ConsumerData,
    HeartbeatData,
    MemberInfo,
    SubscriptionData,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import NotifyConsumerIdsChangedRequest

log = logging.getLogger(__name__)

CLIENT_ID_MAX_LENGTH = 255
MAX_CONSUMERS_PER_HEARTBEAT = 256
MAX_SUBSCRIPTIONS_PER_CONSUMER = 1024
MAX_PRODUCER_GROUPS_PER_HEARTBEAT = 256

LeaveListener = Callable[[str, str], object]
"""``listener(group, client_id)``: a member left ``group`` (unregistered, closed or expired)."""


def validate_client_id(client_id: str) -> None:
    if not client_id or len(client_id) > CLIENT_ID_MAX_LENGTH:
        raise MessageIllegalError(f"client_id must be 1..{CLIENT_ID_MAX_LENGTH} characters")
    if not client_id.isprintable():
        raise MessageIllegalError("client_id holds non-printable characters")


@dataclass(slots=True)
class Member:
    client_id: str
    conn: Connection
    last_heartbeat: float
    """time.monotonic() of the last heartbeat (expiry)."""
    last_heartbeat_ms: int
    """Wall clock of the last heartbeat (for display)."""
    subscriptions: dict[str, SubscriptionData]
    """topic -> the member's subscription."""
    filters: dict[str, MessageFilter]
    """topic -> the compiled subscription."""
    language: str = "PYTHON"
    version: str = ""
    consume_type: str = "PUSH"
    """As this member's own heartbeat says (a group may mix kinds; the group keeps the last)."""


@dataclass(slots=True)
class ConsumerGroup:
    """One group's settings (as its latest heartbeat says) and its online members."""

    group: str
    consume_type: str = "PUSH"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "LAST_OFFSET"
    consume_timestamp_ms: int = 0
    orderly: bool = False
    members: dict[str, Member] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted(self.members)

    def rebalancing_client_ids(self) -> list[str]:
        """The members that divide the group's queues among themselves: every kind but POP.
        Pop consumers (native SimpleConsumers, RocketMQ 5 clients through the proxy) take
        messages from any queue; counting them would hand them queues nobody pulls."""
        return sorted(c for c, m in self.members.items() if m.consume_type != "POP")

    def subscriptions(self) -> dict[str, SubscriptionData]:
        """topic -> subscription over every member; the newest ``sub_version`` wins a topic."""
        out: dict[str, SubscriptionData] = {}
        for member in self.members.values():
            for topic, sub in member.subscriptions.items():
                have = out.get(topic)
                if have is None or sub.sub_version > have.sub_version:
                    out[topic] = sub
        return out

    def topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscriptions}

    def member_infos(self) -> list[MemberInfo]:
        return [
            MemberInfo(
                client_id=m.client_id,
                addr=m.conn.peer,
                language=m.language,
                version=m.version,
                last_heartbeat_ms=m.last_heartbeat_ms,
                subscriptions=list(m.subscriptions.values()),
            )
            for m in sorted(self.members.values(), key=lambda m: m.client_id)
        ]


@dataclass(slots=True)
class _Compiled:
    """A heartbeat's consumer, checked and compiled, ready to register."""

    data: ConsumerData
    subscriptions: dict[str, SubscriptionData]
    filters: dict[str, MessageFilter]


def compile_consumer(data: ConsumerData) -> _Compiled:
    """Check one ConsumerData and compile its subscriptions; raises on the first bad value."""
    validate_group(data.group)
    for name, value, allowed in (
        ("consume_type", data.consume_type, CONSUME_TYPES),
        ("message_model", data.message_model, MESSAGE_MODELS),
        ("consume_from_where", data.consume_from_where, CONSUME_FROM),
    ):
        if value not in allowed:
            raise MessageIllegalError(
                f"group {data.group}: {name} {value!r} is not one of {', '.join(allowed)}"
            )
    if len(data.subscriptions) > MAX_SUBSCRIPTIONS_PER_CONSUMER:
        raise MessageIllegalError(
            f"group {data.group}: {len(data.subscriptions)} subscriptions, "
            f"the limit is {MAX_SUBSCRIPTIONS_PER_CONSUMER}"
        )
    subs: dict[str, SubscriptionData] = {}
    filters: dict[str, MessageFilter] = {}
    for sub in data.subscriptions:
        validate_topic(sub.topic)
        have = subs.get(sub.topic)
        if have is not None and have.sub_version > sub.sub_version:
            continue
        where = f"group {data.group}, topic {sub.topic}"
        if sub.expression_type not in EXPRESSION_TYPES:
            raise FilterExpressionError(
                f"{where}: expression type {sub.expression_type[:50]!r} is not one of "
                f"{', '.join(EXPRESSION_TYPES)}"
            )
        try:
            compiled = compile_filter(sub.expression_type, sub.expression)
        except FilterExpressionError as exc:
            # Name the subscription: a client with many topics must know which one is wrong.
            raise FilterExpressionError(
                f"{where}: {sub.expression_type} expression {sub.expression[:200]!r}: {exc}"
            ) from exc
        subs[sub.topic] = sub
        filters[sub.topic] = compiled
    return _Compiled(data, subs, filters)


@dataclass(slots=True)
class _Producer:
    conn: Connection
    last_heartbeat: float
    language: str = "PYTHON"
    version: str = ""


class ConsumerManager:
    """Groups and their members. ``clock`` is monotonic seconds (tests pass their own)."""

    def __init__(
        self, expiry_s: float = 40.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.expiry_s = expiry_s
        self.clock = clock
        self.groups: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[str, _Producer]] = {}
        """producer group -> client id -> where it heartbeats from."""
        self.notify_enabled = True
        """Cleared while the broker stops: its own closing connections are no news."""
        self.notifications_sent = 0
        self._by_conn: dict[Connection, set[tuple[str, str]]] = {}
        self._leave_listeners: list[LeaveListener] = []
        self.on_event: Callable[[str], None] | None = None
        """Called with "join", "unregister", "close" or "expire" (metrics)."""

    def on_leave(self, listener: LeaveListener) -> None:
        self._leave_listeners.append(listener)

    # ------------------------------------------------------------------ heartbeats

    def register(self, conn: Connection, heartbeat: HeartbeatData) -> list[str]:
        """Register (or refresh) every group of a heartbeat on ``conn``. Everything is checked
        before anything changes. Returns the groups whose members or topics changed (they have
        been notified)."""
        validate_client_id(heartbeat.client_id)
        if len(heartbeat.consumers) > MAX_CONSUMERS_PER_HEARTBEAT:
            raise MessageIllegalError(
                f"heartbeat lists {len(heartbeat.consumers)} consumer groups, "
                f"the limit is {MAX_CONSUMERS_PER_HEARTBEAT}"
            )
        if len(heartbeat.producer_groups) > MAX_PRODUCER_GROUPS_PER_HEARTBEAT:
            raise MessageIllegalError(
                f"heartbeat lists {len(heartbeat.producer_groups)} producer groups, "
                f"the limit is {MAX_PRODUCER_GROUPS_PER_HEARTBEAT}"
            )
        for group in heartbeat.producer_groups:
            validate_group(group)
        compiled = [compile_consumer(c) for c in heartbeat.consumers]
        if not conn.is_open:
            return []  # closed while this heartbeat waited: registering would leave a ghost
        now = self.clock()
        wall_ms = now_ms()
        for pgroup in heartbeat.producer_groups:
            self.producers.setdefault(pgroup, {})[heartbeat.client_id] = _Producer(
                conn, now, heartbeat.language, heartbeat.version
            )
        changed = [
            c.data.group for c in compiled if self._register_one(conn, heartbeat, c, now, wall_ms)
        ]
        for group in changed:
            self.notify_changed(group)
        return changed

    def _register_one(
        self, conn: Connection, hb: HeartbeatData, c: _Compiled, now: float, now_ms: int
    ) -> bool:
        data = c.data
        group = self.groups.get(data.group)
        if group is None:
            group = self.groups[data.group] = ConsumerGroup(data.group)
        group.consume_type = data.consume_type
        group.message_model = data.message_model
        group.consume_from_where = data.consume_from_where
        group.consume_timestamp_ms = data.consume_timestamp_ms
        group.orderly = data.orderly
        topics_before = group.topics()
        member = group.members.get(hb.client_id)
        joined = member is None
        if member is None:
            member = Member(hb.client_id, conn, now, now_ms, c.subscriptions, c.filters)
            group.members[hb.client_id] = member
            log.info("consumer %s joined group %s from %s", hb.client_id, data.group, conn.peer)
            self._event("join")
        else:
            if member.conn is not conn:
                self._unbind(member.conn, data.group, hb.client_id)
                member.conn = conn
            member.last_heartbeat = now
            member.last_heartbeat_ms = now_ms
            member.subscriptions = c.subscriptions
            member.filters = c.filters
        member.language = hb.language[:64]
        member.version = hb.version[:64]
        member.consume_type = data.consume_type
        self._by_conn.setdefault(conn, set()).add((data.group, hb.client_id))
        return joined or group.topics() != topics_before

    def _unbind(self, conn: Connection, group: str, client_id: str) -> None:
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard((group, client_id))
            if not keys:
                del self._by_conn[conn]

    # ------------------------------------------------------------------ leaving

    def unregister(self, client_id: str, group: str | None = None) -> list[str]:
        """A client leaves one group, or every group (consumer and producer) when ``group`` is
        None. Returns the consumer groups it left."""
        names = [group] if group is not None else list(self.groups)
        left = [g for g in names if self._remove(g, client_id, "unregister")]
        for pgroup in [group] if group is not None else list(self.producers):
            members = self.producers.get(pgroup)
            if members is not None and members.pop(client_id, None) is not None and not members:
                del self.producers[pgroup]
        return left

    def connection_closed(self, conn: Connection) -> list[tuple[str, str]]:
        """Every member bound to ``conn`` leaves. Returns the (group, client id) pairs that left."""
        keys = sorted(self._by_conn.pop(conn, set()))
        gone = [k for k in keys if self._remove(k[0], k[1], "close", conn=conn)]
        for pgroup, members in list(self.producers.items()):
            for cid, p in list(members.items()):
                if p.conn is conn:
                    del members[cid]
            if not members:
                del self.producers[pgroup]
        return gone

    def scan_expired(self) -> list[tuple[str, str]]:
        """Members (and producers) without a heartbeat for ``expiry_s`` leave."""
        cut = self.clock() - self.expiry_s
        expired = [
            (g.group, m.client_id)
            for g in self.groups.values()
            for m in g.members.values()
            if m.last_heartbeat < cut
        ]
        gone = [k for k in expired if self._remove(k[0], k[1], "expire")]
        for pgroup, members in list(self.producers.items()):
            for cid, p in list(members.items()):
                if p.last_heartbeat < cut:
                    del members[cid]
            if not members:
                del self.producers[pgroup]
        return gone

    def _remove(
        self, group_name: str, client_id: str, why: str, conn: Connection | None = None
    ) -> bool:
        group = self.groups.get(group_name)
        if group is None:
            return False
        member = group.members.get(client_id)
        if member is None or (conn is not None and member.conn is not conn):
            return False
        del group.members[client_id]
        self._unbind(member.conn, group_name, client_id)
        log.info("consumer %s left group %s (%s)", client_id, group_name, why)
        self._event(why)
        if not group.members:
            del self.groups[group_name]
        for listener in self._leave_listeners:
            try:
                listener(group_name, client_id)
            except Exception:  # one listener's bug must not stop the others
                log.exception("leave listener failed for %s/%s", group_name, client_id)
        self.notify_changed(group_name)
        return True

    def _event(self, name: str) -> None:
        if self.on_event is not None:
            self.on_event(name)

    # ------------------------------------------------------------------ notifications

    def notify_changed(self, group_name: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (oneway, field ``group``) to every member of the group."""
        group = self.groups.get(group_name)
        if group is None or not self.notify_enabled:
            return
        self.send_to_members(
            group,
            lambda: NotifyConsumerIdsChangedRequest(group=group_name).frame(),
        )

    def send_to_members(self, group: ConsumerGroup, make: Callable[[], Frame]) -> int:
        """Send a oneway frame (a fresh one each: the opaque is per connection) to every member;
        returns how many it reached. A member whose connection is closing is skipped: its own
        close will remove it."""
        sent = 0
        for member in list(group.members.values()):
            if not member.conn.is_open:
                continue
            try:
                member.conn.send_oneway(make())
            except MQError as exc:
                log.debug("cannot notify %s: %s", member.client_id, exc)
                continue
            sent += 1
        self.notifications_sent += sent
        return sent

    # ------------------------------------------------------------------ queries

    def get(self, group: str) -> ConsumerGroup | None:
        return self.groups.get(group)

    def member_count(self) -> int:
        return sum(len(g.members) for g in self.groups.values())

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(g.group for g in self.groups.values() if topic in g.topics())

    def member_filter(self, group: str, client_id: str, topic: str) -> MessageFilter | None:
        g = self.groups.get(group)
        member = g.members.get(client_id) if g is not None else None
        return member.filters.get(topic) if member is not None else None

    def producer_connections(self, group: str) -> list[Connection]:
        return [p.conn for p in self.producers.get(group, {}).values() if p.conn.is_open]

    def all_members(self) -> Iterable[tuple[str, Member]]:
        for g in self.groups.values():
            for m in g.members.values():
                yield g.group, m
