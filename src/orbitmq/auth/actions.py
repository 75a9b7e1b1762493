"""Every request code a broker or NameServer answers, mapped to what it needs: (resource, actions).

``checks_for(frame, cluster)`` returns the checks a request must pass (all of them; within one
check, one of its actions suffices, as RocketMQ asks {Pub, Sub, Get} of a route lookup). A code
missing from :data:`RULES` is **denied** (:class:`Unmapped`), unlike RocketMQ, which skips a
code without an annotated header (UPDATE_BROKER_CONFIG was one). An empty list means "any
authenticated user": a client's own bookkeeping (unregistering, a producer's heartbeat).

Names come from the header fields and, where the header has none, from the body (a heartbeat's
groups and subscribed topics, a lock's group, a batch ack's group and topic, a created topic's
or group's name). A send or batch send carries one topic in its header and every message of the
batch goes to it, so checking that topic checks every message. ``%RETRY%g`` is group ``g``
(``model.Resource.of``): Sub when a consumer uses it, as in RocketMQ; the admin actions
(Create, Update, Delete) when they are asked alone, where RocketMQ asks only Sub. END_TRANSACTION names no topic in OrbitMQ's header: it needs Pub on its
producer group's ``Group:`` resource.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from orbitmq.auth.model import Action, Check, ResourceType, check
from orbitmq.protocol.bodies import TopicConfig, decode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    HeartbeatData,
    LockBatchBody,
    OffsetsBody,
    ReceiptHandleList,
)
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import SubscriptionGroupConfig

PUB, SUB, GET, LIST = Action.PUB, Action.SUB, Action.GET, Action.LIST
CREATE, UPDATE, DELETE = Action.CREATE, Action.UPDATE, Action.DELETE
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER

Rule = Callable[[Frame, str], list[Check]]


class Unmapped(Exception):
    """The request code has no (resource, action) mapping: it is refused."""


def _field(frame: Frame, name: str, default: str | None = None) -> str:
    value = frame.fields.get(name, default)
    if value is None and default is None:
        raise FieldError(f"missing field {name}")
    if not isinstance(value, str):
        raise FieldError(f"field {name} is not a string")
    return value


def _body(frame: Frame, typ: type[msgspec.Struct]) -> msgspec.Struct:
    try:
        return decode_body(memoryview(frame.body), typ)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise FieldError(f"body is not a {typ.__name__}: {exc}") from None


def _topic(name: str, *actions: Action) -> Check:
    return check(TOPIC, name, *actions)


class HeaderRule:
    """A rule that reads only the header fields ``names`` (and the cluster): its checks are a
    function of those values, so a server may remember them per (code, values) instead of
    building them per request (:func:`header_key`)."""

    __slots__ = ("build", "names")

    def __init__(self, names: tuple[str, ...], build: Rule) -> None:
        self.names = names
        self.build = build

    def __call__(self, frame: Frame, cluster: str) -> list[Check]:
        return self.build(frame, cluster)


def _topic_rule(*actions: Action) -> Rule:
    return HeaderRule(("topic",), lambda f, _c: [_topic(_field(f, "topic"), *actions)])


def _group_rule(*actions: Action) -> Rule:
    return HeaderRule(("group",), lambda f, _c: [check(GROUP, _field(f, "group"), *actions)])


def _cluster_rule(*actions: Action) -> Rule:
    return HeaderRule((), lambda _f, c: [check(CLUSTER, c, *actions)])


def _topic_group(*actions: Action) -> Rule:
    def rule(f: Frame, _c: str) -> list[Check]:
        out = [_topic(_field(f, "topic"), *actions)]
        group = _field(f, "group", "")
        if group:
            out.append(check(GROUP, group, *actions))
        return out

    return HeaderRule(("topic", "group"), rule)


def _anyone_checks(_f: Frame, _c: str) -> list[Check]:
    return []


_anyone = HeaderRule((), _anyone_checks)


def _heartbeat(f: Frame, _c: str) -> list[Check]:
    hb = _body(f, HeartbeatData)
    assert isinstance(hb, HeartbeatData)
    out = []
    for consumer in hb.consumers:
        out.append(check(GROUP, consumer.group, SUB))
        out.extend(_topic(s.topic, SUB) for s in consumer.subscriptions)
    return out


def _update_offset(f: Frame, _c: str) -> list[Check]:
    if f.body:
        body = _body(f, OffsetsBody)
        assert isinstance(body, OffsetsBody)
        topics = {o.topic for o in body.offsets}
        return [check(GROUP, body.group, SUB, UPDATE)] + [
            _topic(t, SUB, UPDATE) for t in sorted(topics)
        ]
    return _topic_group(SUB, UPDATE)(f, _c)


def _lock(f: Frame, _c: str) -> list[Check]:
    body = _body(f, LockBatchBody)
    assert isinstance(body, LockBatchBody)
    return [check(GROUP, body.group, SUB)] + [
        _topic(t, SUB) for t in sorted({q.topic for q in body.queues})
    ]


def _batch_ack(f: Frame, _c: str) -> list[Check]:
    body = _body(f, ReceiptHandleList)
    assert isinstance(body, ReceiptHandleList)
    return [_topic(body.topic, SUB), check(GROUP, body.group, SUB)]


def _create_topic(f: Frame, _c: str) -> list[Check]:
    body = _body(f, TopicConfig)
    assert isinstance(body, TopicConfig)
    return [check(TOPIC, body.topic_name, CREATE, UPDATE)]


def _create_group(f: Frame, _c: str) -> list[Check]:
    body = _body(f, SubscriptionGroupConfig)
    assert isinstance(body, SubscriptionGroupConfig)
    return [check(GROUP, body.group_name, CREATE, UPDATE)]


def _view(f: Frame, c: str) -> list[Check]:
    topic = f.fields.get("topic")
    if isinstance(topic, str) and topic:
        return [_topic(topic, SUB, GET)]
    return [check(CLUSTER, c, GET)]


_send_back = HeaderRule(("group",), lambda f, _c: [check(GROUP, _field(f, "group"), SUB)])
_end_tx = HeaderRule(
    ("producer_group",), lambda f, _c: [check(GROUP, _field(f, "producer_group"), PUB)]
)
_register = HeaderRule(("cluster",), lambda f, _c: [check(CLUSTER, _field(f, "cluster"), UPDATE)])


R = RequestCode
RULES: dict[int, Rule] = {
    # producing
    R.SEND_MESSAGE: _topic_rule(PUB),
    R.SEND_BATCH_MESSAGE: _topic_rule(PUB),
    R.RECALL_MESSAGE: _topic_rule(PUB),
    R.END_TRANSACTION: _end_tx,
    # reading
    R.PULL_MESSAGE: _topic_group(SUB),
    R.GET_MAX_OFFSET: _topic_rule(SUB, GET),
    R.GET_MIN_OFFSET: _topic_rule(SUB, GET),
    R.SEARCH_OFFSET_BY_TIMESTAMP: _topic_rule(SUB, GET),
    R.QUERY_MESSAGE: _topic_rule(SUB, GET),
    R.VIEW_MESSAGE_BY_ID: _view,
    # topics and the broker
    R.UPDATE_AND_CREATE_TOPIC: _create_topic,
    R.DELETE_TOPIC_IN_BROKER: _topic_rule(DELETE),
    R.GET_ALL_TOPIC_CONFIG: _cluster_rule(LIST, GET),
    R.GET_TOPIC_STATS: _topic_rule(GET),
    R.GET_BROKER_RUNTIME_INFO: _cluster_rule(GET),
    R.UPDATE_BROKER_CONFIG: _cluster_rule(UPDATE),
    R.GET_BROKER_CONFIG: _cluster_rule(GET),
    R.UPDATE_NAMESRV_CONFIG: _cluster_rule(UPDATE),
    R.GET_NAMESRV_CONFIG: _cluster_rule(GET),
    # Pop
    R.POP_MESSAGE: _topic_group(SUB),
    R.ACK_MESSAGE: _topic_group(SUB),
    R.CHANGE_MESSAGE_INVISIBLETIME: _topic_group(SUB),
    R.BATCH_ACK_MESSAGE: _batch_ack,
    # consumer groups
    R.HEART_BEAT: _heartbeat,
    R.UNREGISTER_CLIENT: _anyone,
    R.GET_CONSUMER_LIST_BY_GROUP: _group_rule(SUB, GET),
    R.GET_CONSUMER_CONNECTION_LIST: _group_rule(GET),
    R.GET_CONSUMER_GROUP_LIST: _cluster_rule(LIST),
    R.QUERY_CONSUMER_OFFSET: _topic_group(SUB, GET),
    R.UPDATE_CONSUMER_OFFSET: _update_offset,
    R.INVOKE_BROKER_TO_RESET_OFFSET: _topic_group(UPDATE),
    R.LOCK_BATCH_MQ: _lock,
    R.UNLOCK_BATCH_MQ: _lock,
    R.CONSUMER_SEND_MSG_BACK: _send_back,
    R.GET_CONSUME_STATS: _group_rule(GET),
    # group configs and dead letters
    R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _create_group,
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _cluster_rule(LIST, GET),
    R.DELETE_SUBSCRIPTIONGROUP: _group_rule(DELETE),
    R.GET_DLQ_MESSAGES: _group_rule(GET),
    # NameServer
    R.REGISTER_BROKER: _register,
    R.UNREGISTER_BROKER: _register,
    R.GET_ROUTEINFO_BY_TOPIC: _topic_rule(PUB, SUB, GET),
    R.GET_BROKER_CLUSTER_INFO: _cluster_rule(GET),
    R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _cluster_rule(LIST),
    R.DELETE_TOPIC_IN_NAMESRV: _topic_rule(DELETE),
    R.WIPE_WRITE_PERM_OF_BROKER: _cluster_rule(UPDATE),
    R.ADD_WRITE_PERM_OF_BROKER: _cluster_rule(UPDATE),
    # controller (docs/ha.md): brokers' heartbeats and registrations change the group state,
    # as a NameServer registration does; elections and forgetting replicas are admin changes
    R.BROKER_HEARTBEAT: _cluster_rule(UPDATE),
    R.CONTROLLER_GET_NEXT_BROKER_ID: _cluster_rule(UPDATE),
    R.CONTROLLER_APPLY_BROKER_ID: _cluster_rule(UPDATE),
    R.CONTROLLER_REGISTER_BROKER: _cluster_rule(UPDATE),
    R.CONTROLLER_ALTER_SYNC_STATE_SET: _cluster_rule(UPDATE),
    R.CONTROLLER_ELECT_MASTER: _cluster_rule(UPDATE),
    R.CLEAN_BROKER_DATA: _cluster_rule(UPDATE),
    R.CONTROLLER_GET_REPLICA_INFO: _cluster_rule(GET),
    R.CONTROLLER_GET_METADATA_INFO: _cluster_rule(GET),
    # the sealed users-and-ACLs document servers follow: what a server's own user may read
    R.CONTROLLER_GET_AUTH_DATA: _cluster_rule(UPDATE),
    # users and ACLs (3001-3010)
    R.AUTH_CREATE_USER: _cluster_rule(UPDATE),
    R.AUTH_UPDATE_USER: _cluster_rule(UPDATE),
    R.AUTH_DELETE_USER: _cluster_rule(UPDATE),
    R.AUTH_GET_USER: _cluster_rule(GET),
    R.AUTH_LIST_USER: _cluster_rule(LIST, GET),
    R.AUTH_CREATE_ACL: _cluster_rule(UPDATE),
    R.AUTH_UPDATE_ACL: _cluster_rule(UPDATE),
    R.AUTH_DELETE_ACL: _cluster_rule(UPDATE),
    R.AUTH_GET_ACL: _cluster_rule(GET),
    R.AUTH_LIST_ACL: _cluster_rule(LIST, GET),
}
"""code -> rule. The broker, NameServer and proxy ask this one table."""

ADMIN_CODES = frozenset(
    code
    for code in RULES
    if code
    in {
        R.UPDATE_AND_CREATE_TOPIC,
        R.DELETE_TOPIC_IN_BROKER,
        R.DELETE_TOPIC_IN_NAMESRV,
        R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        R.DELETE_SUBSCRIPTIONGROUP,
        R.INVOKE_BROKER_TO_RESET_OFFSET,
        R.WIPE_WRITE_PERM_OF_BROKER,
        R.ADD_WRITE_PERM_OF_BROKER,
        R.CONTROLLER_ELECT_MASTER,
        R.CLEAN_BROKER_DATA,
    }
    or 3001 <= code <= 3010
)
"""Changes the audit log records when they are allowed too (not only when refused)."""

TRANSPORT_ADMIN_CODES = ADMIN_CODES | {
    R.UPDATE_BROKER_CONFIG,
    R.GET_BROKER_CONFIG,
    R.UPDATE_NAMESRV_CONFIG,
    R.GET_NAMESRV_CONFIG,
}
"""Admin requests a listener's ``admin_transport`` restricts to TLS or mutual TLS: the
changes above, and reading or changing a server's configuration."""


def header_key(frame: Frame) -> tuple[object, ...] | None:
    """A key that determines ``checks_for(frame, cluster)`` for one cluster: the code and the
    values of the header fields its rule reads, when the rule reads nothing else and every
    such value is a str or absent (None: the checks must be built from the frame)."""
    rule = RULES.get(frame.code)
    if rule.__class__ is not HeaderRule:
        return None
    assert isinstance(rule, HeaderRule)
    fields = frame.fields
    values = [fields.get(n) for n in rule.names]
    for v in values:
        if v is not None and v.__class__ is not str:
            return None
    return (frame.code, *values)


def checks_for(frame: Frame, cluster: str) -> list[Check]:
    """What ``frame`` needs; Unmapped for a code nobody mapped, FieldError for a bad name."""
    rule = RULES.get(frame.code)
    if rule is None:
        raise Unmapped(frame.code)
    return rule(frame, cluster)
