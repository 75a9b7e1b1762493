"""Authorization of Kafka requests by the ACL 2.0 model: every API mapped to (resource, actions).

:meth:`Authorizer.run` stands between a decoded request of an authenticated user and its
handler. Each API served has a rule (:data:`RULES`; an API without one is refused with
CLUSTER_AUTHORIZATION_FAILED, or by closing the connection when that API's answer has no
top-level error code, and never reaches a handler). A rule splits the request into what
the user may do, which goes to the handler, and what they may not, which is answered with
Kafka's per-item authorization error and merged into the handler's answer, as Kafka does: a
Produce to one denied topic and one allowed topic stores the allowed one only. When nothing is
left, the handler is not called at all.

| API | needs (one of) | refused with |
| --- | --- | --- |
| Produce | Topic Pub, per topic | TOPIC_AUTHORIZATION_FAILED (29) per partition |
| Fetch | Topic Sub, per topic | 29 per partition |
| ListOffsets | Topic Sub or Get, per topic | 29 per partition |
| Metadata | Topic Pub, Sub or Get to see a topic; Create to auto-create it | unlisted (all topics) or 29 (named) |
| OffsetCommit | Group Sub or Update; Topic Sub or Update per topic | 30 on every partition; 29 |
| OffsetFetch | Group Sub or Get; Topic Sub or Get per topic | GROUP_AUTHORIZATION_FAILED (30); 29 |
| FindCoordinator (group) | Group Sub | 30 (a transaction key: 53, no transactions here) |
| JoinGroup, SyncGroup, Heartbeat, LeaveGroup | Group Sub | 30 |
| DescribeGroups | Group Sub or Get, per group | 30 per group |
| ListGroups | Group Sub or Get | unlisted |
| CreateTopics | Topic Create, per topic | 29 per topic |
| DeleteTopics | Topic Delete, per topic | 29 per topic |
| InitProducerId (idempotent) | Pub on some topic (Kafka >= 2.8's rule) | CLUSTER_AUTHORIZATION_FAILED (31) |
| InitProducerId (transactional) | none can: no transactions here | TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) |

Every refusal of a named resource is audited and counted (:meth:`KafkaAuth.deny`); filtering a
full listing (Metadata of all topics, ListGroups) is not, as Kafka does not either. Verdicts are
remembered per (user, address, resource, actions) for the store version they were decided
against, so a producer's requests decide once per topic until the ACLs change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from orbitmq.auth.model import Action, Decision, ResourceType, UserType, check, decide
from orbitmq.kafka.sasl import KafkaAuth, Session
from orbitmq.protocol.kafka.codec import RESPONSES
from orbitmq.protocol.kafka.primitives import KafkaCodecError
from orbitmq.protocol.kafka.schema_types import in_range

Body = dict[str, Any]
Handler = Callable[[Body], Awaitable[Body | None]]

TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

PUB, SUB, GET = Action.PUB, Action.SUB, Action.GET
CREATE, DELETE, UPDATE = Action.CREATE, Action.DELETE, Action.UPDATE
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
MAX_REMEMBERED = 4096


class Authorizer:
    def __init__(self, auth: KafkaAuth) -> None:
        self.auth = auth
        self._verdicts: dict[tuple[str, str, ResourceType, str, frozenset[Action]], object] = {}

    # -- decisions ------------------------------------------------------------------------

    def may(
        self, s: Session, api: int, rtype: ResourceType, name: str, *actions: Action,
        audit: bool = True,
    ) -> bool:  # fmt: skip
        """Whether the session's user may do one of ``actions`` on ``name``; a refusal is
        audited unless ``audit`` is False (filtered listings)."""
        user = s.user or ""
        self.auth.guard.refresh()
        store = self.auth.store
        snapshot = store.snapshot
        key = (user, s.ip, rtype, name, frozenset(actions))
        if self._verdicts.get(key) is snapshot:
            return True
        verdict = decide(store.user(user), store.acl(user), [check(rtype, name, *actions)], s.ip)
        if verdict.allowed:
            if len(self._verdicts) >= MAX_REMEMBERED:
                self._verdicts.clear()
            self._verdicts[key] = snapshot
            return True
        if audit:
            self.auth.deny(
                s, api, f"{rtype.value}:{name}", "|".join(sorted(a.value for a in actions)),
                verdict.reason,
            )  # fmt: skip
        return False

    def may_pub_somewhere(self, s: Session) -> bool:
        """Kafka's rule for an idempotent producer id (KIP-679): Write on any topic. Here: a
        Super user, or an Allow entry covering Pub on a topic pattern from this address that
        no Deny of the same resource outranks."""
        self.auth.guard.refresh()
        store = self.auth.store
        user = store.user(s.user or "")
        if user is None or not user.enabled:
            return False
        if user.type is UserType.SUPER:
            return True
        entries = store.acl(user.name) or ()
        for e in entries:
            if (
                e.decision is Decision.ALLOW
                and e.resource.type in (TOPIC, ResourceType.ANY)
                and e.covers(frozenset({PUB}))
                and e.applies_to(s.ip)
            ):
                return True
        return False

    # -- the rules --------------------------------------------------------------------------

    async def run(
        self, api: int, version: int, body: Body, s: Session, handler: Handler
    ) -> Body | None:
        rule = RULES.get(api)
        if rule is None:
            self.auth.deny(
                s, api, "Cluster:" + self.auth.cluster, "-", f"API {api} has no ACL rule"
            )
            answer = RESPONSES[api]
            if any(f.name == "error_code" and in_range(version, f.versions) for f in answer.fields):
                return {"throttle_time_ms": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED}
            # no top-level error in this answer: a close is the refusal that cannot be missed
            raise KafkaCodecError(f"API {api} has no ACL rule: refused")
        return await rule(self, version, body, s, handler)


async def _split(
    body: Body, key: str, allowed: Callable[[Any], bool], handler: Handler, empty: Body,
    out_key: str, denied_entry: Callable[[Any], Body],
) -> Body | None:  # fmt: skip
    """Run ``handler`` on the items of ``body[key]`` that are ``allowed`` (not at all when
    none is) and append the denied items' entries to ``answer[out_key]``."""
    items = body.get(key) or []
    flags = [allowed(i) for i in items]
    ok = [i for i, f in zip(items, flags, strict=True) if f]
    denied = [i for i, f in zip(items, flags, strict=True) if not f]
    if ok or not denied:
        answer = await handler({**body, key: ok})
    else:
        answer = dict(empty)
    if answer is None:
        return None
    if denied:
        answer[out_key] = list(answer.get(out_key) or []) + [denied_entry(i) for i in denied]
    return answer


async def _produce(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def entry(t: Body) -> Body:
        return {"name": t["name"], "partition_responses": [
            {"index": p["index"], "error_code": TOPIC_AUTHORIZATION_FAILED, "base_offset": -1,
             "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [],
             "error_message": None} for p in t["partition_data"]]}  # fmt: skip

    answer = await _split(
        body, "topic_data", lambda t: a.may(s, 0, TOPIC, t["name"], PUB), h,
        {"responses": [], "throttle_time_ms": 0}, "responses", entry,
    )  # fmt: skip
    return None if body.get("acks") == 0 else answer


async def _fetch(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def entry(t: Body) -> Body:
        return {"topic": t["topic"], "partitions": [
            {"partition_index": p["partition"], "error_code": TOPIC_AUTHORIZATION_FAILED,
             "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
             "aborted_transactions": [], "preferred_read_replica": -1, "records": b""}
            for p in t["partitions"]]}  # fmt: skip

    return await _split(
        body, "topics", lambda t: a.may(s, 1, TOPIC, t["topic"], SUB), h,
        {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": []}, "responses",
        entry,
    )  # fmt: skip


async def _list_offsets(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def entry(t: Body) -> Body:
        return {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": TOPIC_AUTHORIZATION_FAILED,
             "timestamp": -1, "offset": -1, "leader_epoch": -1, "old_style_offsets": []}
            for p in t["partitions"]]}  # fmt: skip

    return await _split(
        body, "topics", lambda t: a.may(s, 2, TOPIC, t["name"], SUB, GET), h,
        {"throttle_time_ms": 0, "topics": []}, "topics", entry,
    )  # fmt: skip


async def _metadata(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    requested = body.get("topics")
    listing = requested is None or (v == 0 and not requested)

    def visible(name: str | None, audit: bool) -> bool:
        return name is None or a.may(s, 3, TOPIC, name, PUB, SUB, GET, audit=audit)

    if listing:  # the handler lists only the visible topics (control.py's ``visible``)
        return await h(body)

    named = requested or []
    flags = [visible(t["name"], True) for t in named]
    if all(flags):
        return await h(body)
    ok = [t for t, f in zip(named, flags, strict=True) if f]
    # Metadata v0 reads an empty list as "all topics": list them and show none
    answer = await h({**body, "topics": ok if ok or v > 0 else None})
    if answer is None:
        return None
    answer["topics"] = (list(answer["topics"]) if ok or v > 0 else []) + [
        {"error_code": TOPIC_AUTHORIZATION_FAILED, "name": t["name"], "topic_id": bytes(16),
         "is_internal": False, "partitions": [], "topic_authorized_operations": -2147483648}
        for t, f in zip(named, flags, strict=True) if not f
    ]  # fmt: skip
    return answer


def _group_refusal(a: Authorizer, s: Session, api: int, group: str, *actions: Action) -> bool:
    return not a.may(s, api, GROUP, group, *actions)


async def _group_call(
    a: Authorizer, v: int, body: Body, s: Session, h: Handler, api: int
) -> Body | None:
    if _group_refusal(a, s, api, body["group_id"], SUB):
        answer: Body = {"throttle_time_ms": 0, "error_code": GROUP_AUTHORIZATION_FAILED,
                        "generation_id": -1, "members": []}  # fmt: skip
        if api == 11:  # JoinGroup: the member id the client sent back
            answer["member_id"] = body.get("member_id") or ""
        return answer
    return await h(body)


def _group_rule(
    api: int,
) -> Callable[[Authorizer, int, Body, Session, Handler], Awaitable[Body | None]]:
    async def rule(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
        return await _group_call(a, v, body, s, h, api)

    return rule


async def _offset_commit(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    group_ok = not _group_refusal(a, s, 8, body["group_id"], SUB, UPDATE)

    def entry_of(code: int) -> Callable[[Body], Body]:
        return lambda t: {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": code} for p in t["partitions"]]}  # fmt: skip

    if not group_ok:
        return {"throttle_time_ms": 0,
                "topics": [entry_of(GROUP_AUTHORIZATION_FAILED)(t) for t in body["topics"]]}  # fmt: skip
    return await _split(
        body, "topics", lambda t: a.may(s, 8, TOPIC, t["name"], SUB, UPDATE), h,
        {"throttle_time_ms": 0, "topics": []}, "topics", entry_of(TOPIC_AUTHORIZATION_FAILED),
    )  # fmt: skip


async def _offset_fetch(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def topic_entry(t: Body, code: int = TOPIC_AUTHORIZATION_FAILED) -> Body:
        return {"name": t["name"], "partitions": [
            {"partition_index": i, "committed_offset": -1, "committed_leader_epoch": -1,
             "metadata": "", "error_code": code} for i in t["partition_indexes"]]}  # fmt: skip

    def topics_ok(t: Body) -> bool:
        return a.may(s, 9, TOPIC, t["name"], SUB, GET)

    if v < 8:
        if _group_refusal(a, s, 9, body["group_id"], SUB, GET):
            # v1 has no top-level error: each partition says it, as Kafka answers
            topics = [topic_entry(t, GROUP_AUTHORIZATION_FAILED) for t in body.get("topics") or []]
            return {
                "throttle_time_ms": 0,
                "topics": topics,
                "error_code": GROUP_AUTHORIZATION_FAILED,
            }
        if body.get("topics") is None:
            return await h(body)  # the gateway lists no topics for "all" (control.py)
        return await _split(body, "topics", topics_ok, h,
                            {"throttle_time_ms": 0, "topics": [], "error_code": 0}, "topics",
                            topic_entry)  # fmt: skip
    groups: list[Body] = []
    for g in body["groups"]:
        if _group_refusal(a, s, 9, g["group_id"], SUB, GET):
            groups.append({"group_id": g["group_id"], "topics": [],
                           "error_code": GROUP_AUTHORIZATION_FAILED})  # fmt: skip
            continue
        topics = g.get("topics")
        ok = None if topics is None else [t for t in topics if topics_ok(t)]
        answer = await h({**body, "groups": [{**g, "topics": ok}]}) if ok is None or ok else None
        got = (
            answer["groups"][0]
            if answer
            else {"group_id": g["group_id"], "topics": [], "error_code": 0}
        )
        denied = [topic_entry(t) for t in topics or [] if not any(t is o for o in ok or [])]
        groups.append({**got, "topics": list(got["topics"]) + denied})
    return {"throttle_time_ms": 0, "groups": groups}


async def _find_coordinator(
    a: Authorizer, v: int, body: Body, s: Session, h: Handler
) -> Body | None:
    def node(code: int) -> Body:
        return {"node_id": -1, "host": "", "port": -1, "error_code": code,
                "error_message": "not authorized"}  # fmt: skip

    if body.get("key_type", 0) != 0:
        a.auth.deny(s, 10, "TransactionalId", "-", "transactions are not served")
        keys = body.get("coordinator_keys") if v >= 4 else [body.get("key")]
        denied = node(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return {"throttle_time_ms": 0, **denied,
                "coordinators": [{"key": k, **denied} for k in keys or []]}  # fmt: skip
    if v >= 4:  # a batch of groups: each decided alone
        return await _split(
            body, "coordinator_keys", lambda k: a.may(s, 10, GROUP, k, SUB), h,
            {"throttle_time_ms": 0, "coordinators": []}, "coordinators",
            lambda k: {"key": k, **node(GROUP_AUTHORIZATION_FAILED)},
        )  # fmt: skip
    if _group_refusal(a, s, 10, body.get("key") or "", SUB):
        return {"throttle_time_ms": 0, **node(GROUP_AUTHORIZATION_FAILED), "coordinators": []}
    return await h(body)


async def _describe_groups(
    a: Authorizer, v: int, body: Body, s: Session, h: Handler
) -> Body | None:
    def entry(g: str) -> Body:
        return {"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": g, "group_state": "",
                "protocol_type": "", "protocol_data": "", "members": [],
                "authorized_operations": -2147483648}  # fmt: skip

    return await _split(body, "groups", lambda g: a.may(s, 15, GROUP, g, SUB, GET), h,
                        {"throttle_time_ms": 0, "groups": []}, "groups", entry)  # fmt: skip


async def _list_groups(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    answer = await h(body)
    if answer is not None:
        answer["groups"] = [
            g for g in answer["groups"] if a.may(s, 16, GROUP, g["group_id"], SUB, GET, audit=False)
        ]
    return answer


async def _create_topics(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def entry(t: Body) -> Body:
        return {"name": t["name"], "topic_id": bytes(16), "error_code": TOPIC_AUTHORIZATION_FAILED,
                "error_message": "not authorized to create this topic", "num_partitions": -1,
                "replication_factor": -1, "configs": []}  # fmt: skip

    return await _split(body, "topics", lambda t: a.may(s, 19, TOPIC, t["name"], CREATE), h,
                        {"throttle_time_ms": 0, "topics": []}, "topics", entry)  # fmt: skip


async def _delete_topics(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    def entry(name: str) -> Body:
        return {"name": name, "topic_id": bytes(16), "error_code": TOPIC_AUTHORIZATION_FAILED,
                "error_message": None}  # fmt: skip

    return await _split(body, "topic_names", lambda n: a.may(s, 20, TOPIC, n, DELETE), h,
                        {"throttle_time_ms": 0, "responses": []}, "responses", entry)  # fmt: skip


async def _init_producer_id(
    a: Authorizer, v: int, body: Body, s: Session, h: Handler
) -> Body | None:
    refused = {"throttle_time_ms": 0, "producer_id": -1, "producer_epoch": -1}
    if body.get("transactional_id") is not None:
        a.auth.deny(s, 22, f"TransactionalId:{body['transactional_id']}"[:200], "-",
                    "transactions are not served")  # fmt: skip
        return {**refused, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    if not a.may_pub_somewhere(s):
        a.auth.deny(s, 22, "Topic:*", "Pub", "an idempotent producer id needs Pub on a topic")
        return {**refused, "error_code": CLUSTER_AUTHORIZATION_FAILED}
    return await h(body)


async def _free(a: Authorizer, v: int, body: Body, s: Session, h: Handler) -> Body | None:
    return await h(body)


Rule = Callable[[Authorizer, int, Body, Session, Handler], Awaitable[Body | None]]
RULES: dict[int, Rule] = {
    0: _produce, 1: _fetch, 2: _list_offsets, 3: _metadata, 8: _offset_commit,
    9: _offset_fetch, 10: _find_coordinator, 11: _group_rule(11), 12: _group_rule(12),
    13: _group_rule(13), 14: _group_rule(14), 15: _describe_groups, 16: _list_groups,
    18: _free, 19: _create_topics, 20: _delete_topics, 22: _init_producer_id,
    17: _free, 36: _free,
}  # fmt: skip
"""API key -> its rule. ApiVersions and the SASL APIs need no right (they are served before
authentication); an API missing here is refused."""
