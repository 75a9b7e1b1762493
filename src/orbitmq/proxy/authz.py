"""Authorization of gRPC calls: every MessagingService request mapped to (resource, actions),
decided by the caller's ACL in the shared auth store (docs/security.md).

As on Remoting (``orbitmq.auth.actions``), a request type without a mapping is refused, and a
SendMessage is checked on the topic of **every** message (RocketMQ checks only the first). The
refusal is FORBIDDEN (40300), the answer RocketMQ 5's proxy gives. Telemetry (a stream of
settings, whose publishing and subscription topics the client also names in the calls it then
makes) has each settings command checked as RocketMQ does: Pub on every publishing topic, Sub
on the group and every subscribed topic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.model import Action, Check, ResourceType, check, decide
from orbitmq.auth.store import AuthStore
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.status import ProxyError

PUB, SUB, GET, UPDATE = Action.PUB, Action.SUB, Action.GET, Action.UPDATE
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


def _topic(res: pb.Resource, *actions: Action) -> Check:
    return check(TOPIC, res.name, *actions)


def _group(res: pb.Resource, *actions: Action) -> list[Check]:
    return [check(GROUP, res.name, *actions)] if res.name else []


def _consume(topic: pb.Resource, group: pb.Resource, *actions: Action) -> list[Check]:
    return [_topic(topic, *actions), *_group(group, *actions)]


RULES: dict[type[Any], Callable[[Any], list[Check]]] = {
    svc.QueryRouteRequest: lambda r: [_topic(r.topic, PUB, SUB, GET)],
    svc.SendMessageRequest: lambda r: [_topic(m.topic, PUB) for m in r.messages],
    svc.RecallMessageRequest: lambda r: [_topic(r.topic, PUB)],
    svc.EndTransactionRequest: lambda r: [_topic(r.topic, PUB)],
    svc.HeartbeatRequest: lambda r: _group(r.group, SUB),
    svc.NotifyClientTerminationRequest: lambda r: _group(r.group, SUB),
    svc.QueryAssignmentRequest: lambda r: _consume(r.topic, r.group, SUB),
    svc.ReceiveMessageRequest: lambda r: _consume(r.message_queue.topic, r.group, SUB),
    svc.PullMessageRequest: lambda r: _consume(r.message_queue.topic, r.group, SUB),
    svc.AckMessageRequest: lambda r: _consume(r.topic, r.group, SUB),
    svc.ChangeInvisibleDurationRequest: lambda r: _consume(r.topic, r.group, SUB),
    svc.ForwardMessageToDeadLetterQueueRequest: lambda r: _consume(r.topic, r.group, SUB),
    svc.UpdateOffsetRequest: lambda r: _consume(r.message_queue.topic, r.group, SUB, UPDATE),
    svc.GetOffsetRequest: lambda r: _consume(r.message_queue.topic, r.group, SUB, GET),
    svc.QueryOffsetRequest: lambda r: [_topic(r.message_queue.topic, SUB, GET)],
}
"""request type -> its checks (all must pass). A type missing here is refused."""


MAX_REMEMBERED = 4096
"""SendMessage verdicts kept (see Authorizer); the table is emptied when it is full."""


class Authorizer:
    """Decides a call of an authenticated user; ``check`` raises ProxyError(FORBIDDEN).

    SendMessage, the call made per message, remembers what it allowed: (user, source address,
    topics) for the store version it was decided against, so a producer's sends decide once per
    topic until the ACLs change. Refusals are decided (and audited) every time."""

    def __init__(self, store: AuthStore, audit: AuditLog) -> None:
        self.store = store
        self.audit = audit
        self._sends_allowed: dict[tuple[str, str, tuple[str, ...]], object] = {}

    def check(self, principal: str, request: Any, peer: str) -> None:
        """``peer``: gRPC's ``context.peer()`` (``ipv4:1.2.3.4:5678``)."""
        ip = peer_ip(peer)
        if type(request) is svc.SendMessageRequest:
            snapshot = self.store.snapshot
            key = (principal, ip, tuple(m.topic.name for m in request.messages))
            if self._sends_allowed.get(key) is snapshot:
                return
            self._decide(principal, request, peer, ip)
            if len(self._sends_allowed) >= MAX_REMEMBERED:
                self._sends_allowed.clear()
            self._sends_allowed[key] = snapshot
            return
        self._decide(principal, request, peer, ip)

    def _decide(self, principal: str, request: Any, peer: str, ip: str) -> None:
        rule = RULES.get(type(request))
        if rule is None:
            self._refuse(principal, peer, type(request).__name__, "-", "unmapped request")
        verdict = decide(self.store.user(principal), self.store.acl(principal), rule(request), ip)
        if not verdict.allowed:
            failed = verdict.failed
            self._refuse(
                principal,
                peer,
                type(request).__name__,
                str(failed) if failed else "-",
                verdict.reason,
            )

    def check_settings(self, principal: str, command: svc.TelemetryCommand, peer: str) -> None:
        """A Telemetry settings command: Pub on each publishing topic; Sub on the group and
        each subscribed topic. Other commands (thread stacks, verify results) pass."""
        if not command.HasField("settings"):
            return
        settings = command.settings
        checks: list[Check] = [_topic(t, PUB) for t in settings.publishing.topics]
        sub = settings.subscription
        if settings.HasField("subscription"):
            checks += _group(sub.group, SUB) + [_topic(e.topic, SUB) for e in sub.subscriptions]
        user, entries = self.store.user(principal), self.store.acl(principal)
        verdict = decide(user, entries, checks, peer_ip(peer))
        if not verdict.allowed:
            failed = verdict.failed
            self._refuse(
                principal, peer, "Telemetry", str(failed) if failed else "-", verdict.reason
            )

    def _refuse(self, principal: str, peer: str, rpc: str, what: str, reason: str) -> NoReturn:
        self.audit.deny(
            principal=principal, source=peer, code=0, resource=what, action=rpc, reason=reason
        )
        raise ProxyError(pb.Code.FORBIDDEN, reason)


def peer_ip(peer: str) -> str:
    """The address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]").replace("%5B", "").replace("%5D", "")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer
