"""The ACL 2.0 model and its evaluation: users, policy entries, resources, actions, decisions.

RocketMQ 5.3's model (docs/security.md): a **user** is Super (bypasses authorization) or
Normal, enabled or disabled; an **ACL** gives a subject (``User:alice``) a list of **policy
entries**, each a resource pattern (``*``, ``Topic:*``, ``Topic:orders``, ``Topic:ord*``), the
actions it covers (Pub, Sub, Create, Update, Delete, Get, List, All), the source IP ranges it
applies to (none: any) and a decision (Allow, Deny). Entries are keyed by resource: writing an
entry for a resource replaces the one there.

Evaluation (:func:`decide`) follows ``AclAuthorizationHandler``: the entries that match the
resource, one of the requested actions and the source IP are sorted most specific first (a
concrete type before ``*``; literal before prefixed before any; a longer prefix first; Deny
before Allow at equal rank) and the first decides. No matching entry, or no ACL, is a Deny
(default-deny). A retry topic ``%RETRY%g`` is the group ``g``.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

RETRY_PREFIX = "%RETRY%"


class ConfigurationError(ValueError):
    """A user, resource, action or entry that the model does not accept."""


class ResourceType(enum.Enum):
    ANY = "*"
    CLUSTER = "Cluster"
    NAMESPACE = "Namespace"
    TOPIC = "Topic"
    GROUP = "Group"


class PatternType(enum.IntEnum):
    """Rank order: a lower value is more specific."""

    LITERAL = 0
    PREFIXED = 1
    ANY = 2


class Action(enum.Enum):
    ALL = "All"
    ANY = "Any"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"

    @classmethod
    def parse(cls, text: str) -> Action:
        for a in cls:
            if a.value.lower() == text.strip().lower():
                return a
        raise ConfigurationError(f"unknown action {text[:40]!r}")


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"

    @classmethod
    def parse(cls, text: str) -> Decision:
        for d in cls:
            if d.value.lower() == text.strip().lower():
                return d
        raise ConfigurationError(f"decision must be Allow or Deny, not {text[:40]!r}")


class UserType(enum.Enum):
    SUPER = "Super"
    NORMAL = "Normal"

    @classmethod
    def parse(cls, text: str) -> UserType:
        for t in cls:
            if t.value.lower() == text.strip().lower():
                return t
        raise ConfigurationError(f"user type must be Super or Normal, not {text[:40]!r}")


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource pattern (in an entry) or a concrete resource (in a request)."""

    type: ResourceType
    name: str
    pattern: PatternType

    @classmethod
    def parse(cls, text: str) -> Resource:
        text = text.strip()
        if text == "*":
            return cls(ResourceType.ANY, "", PatternType.ANY)
        kind, sep, name = text.partition(":")
        rtype = next((t for t in ResourceType if t.value.lower() == kind.lower()), None)
        if not sep or rtype is None or rtype is ResourceType.ANY or not name:
            raise ConfigurationError(f"resource {text[:80]!r} is not *, Type:name or Type:*")
        if len(name) > 255 or any(c.isspace() for c in name):
            raise ConfigurationError(f"resource name {name[:80]!r} is not a name")
        if name == "*":
            return cls(rtype, "", PatternType.ANY)
        if name.endswith("*"):
            return cls(rtype, name[:-1], PatternType.PREFIXED)
        return cls(rtype, name, PatternType.LITERAL)

    @classmethod
    def of(cls, rtype: ResourceType, name: str) -> Resource:
        """A concrete resource of a request; ``%RETRY%g`` topics become group ``g``."""
        if rtype is ResourceType.TOPIC and name.startswith(RETRY_PREFIX):
            return cls(ResourceType.GROUP, name[len(RETRY_PREFIX) :], PatternType.LITERAL)
        return cls(rtype, name, PatternType.LITERAL)

    def __str__(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        suffix = {PatternType.LITERAL: self.name, PatternType.PREFIXED: self.name + "*"}
        return f"{self.type.value}:{suffix.get(self.pattern, '*')}"

    def matches(self, target: Resource) -> bool:
        """This pattern covers the concrete ``target``."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not target.type:
            return False
        if self.pattern is PatternType.ANY:
            return True
        if self.pattern is PatternType.LITERAL:
            return self.name == target.name
        return target.name.startswith(self.name)

    def rank(self) -> tuple[int, int, int]:
        """Sort key, most specific first."""
        return (
            1 if self.type is ResourceType.ANY else 0,
            int(self.pattern),
            -len(self.name),
        )


def parse_networks(
    items: Iterable[str],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    out = []
    for item in items:
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ConfigurationError(f"source IP {item[:60]!r} is not an address or CIDR") from None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    resource: Resource
    actions: frozenset[Action]
    decision: Decision
    source_ips: tuple[str, ...] = ()
    _nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default=(), compare=False, repr=False
    )

    @classmethod
    def make(
        cls,
        resource: str | Resource,
        actions: Iterable[str | Action],
        decision: str | Decision,
        source_ips: Iterable[str] = (),
    ) -> PolicyEntry:
        """A checked entry (RocketMQ's write-time validation: actions set, no ``Any``, CIDRs)."""
        res = resource if isinstance(resource, Resource) else Resource.parse(resource)
        acts = frozenset(a if isinstance(a, Action) else Action.parse(a) for a in actions)
        if not acts:
            raise ConfigurationError("an entry needs at least one action")
        if Action.ANY in acts:
            raise ConfigurationError("Any is for requests only; use All in an entry")
        dec = decision if isinstance(decision, Decision) else Decision.parse(decision)
        ips = tuple(s.strip() for s in source_ips if s.strip())
        return cls(res, acts, dec, ips, parse_networks(ips))

    def covers(self, wanted: frozenset[Action]) -> bool:
        return Action.ALL in self.actions or bool(self.actions & wanted)

    def applies_to(self, ip: str) -> bool:
        if not self._nets:
            return True
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self._nets)

    def to_json(self) -> dict[str, object]:
        return {
            "resource": str(self.resource),
            "actions": sorted(a.value for a in self.actions),
            "decision": self.decision.value,
            "source_ips": list(self.source_ips),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> PolicyEntry:
        actions = data.get("actions", [])
        ips = data.get("source_ips", [])
        assert isinstance(actions, list) and isinstance(ips, list)
        return cls.make(
            str(data["resource"]), map(str, actions), str(data["decision"]), map(str, ips)
        )


INNER_TRANSPORTS = ("mtls", "loopback")
"""What an inner user (the proxy's, a broker's own) needs besides its secret: ``mtls``, a
verified client certificate naming it; ``loopback``, that or a loopback source address (the
single-host ``up`` commands, whose inner secret is made fresh at each start and never written)."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    type: UserType = UserType.NORMAL
    enabled: bool = True
    inner: str = ""
    """"" (any transport), or one of INNER_TRANSPORTS."""


def parse_inner(text: str | None) -> str:
    """An inner-transport value ("", "none" -> ""), checked."""
    value = (text or "").strip().lower()
    if value in ("", "none"):
        return ""
    if value not in INNER_TRANSPORTS:
        raise ConfigurationError(f"inner must be mtls, loopback or none, not {value[:40]!r}")
    return value


def inner_refusal(user: User, certified: str | None, ip: str) -> str | None:
    """Why ``user`` may not authenticate on this connection (None: it may). ``certified``: the
    user a verified client certificate of the connection names; ``ip``: its source. An inner
    principal has Super rights: its secret alone, from any host, must not be enough (brief
    section 10, bootstrap)."""
    if not user.inner or certified == user.name:
        return None
    if user.inner == "loopback":
        try:
            if ipaddress.ip_address(ip).is_loopback:
                return None
        except ValueError:
            pass
        return (
            f"inner user {user.name} authenticates only from loopback or over mutual TLS "
            f"with a certificate naming it"
        )
    return f"inner user {user.name} authenticates only over mutual TLS with a certificate naming it"


@dataclass(frozen=True, slots=True)
class Check:
    """One thing a request needs: ``resource`` with one of ``actions``."""

    resource: Resource
    actions: frozenset[Action]

    def __str__(self) -> str:
        return f"{self.resource}:{'|'.join(sorted(a.value for a in self.actions))}"


def check(rtype: ResourceType, name: str, *actions: Action) -> Check:
    """What a request needs of a resource. A retry topic ``%RETRY%g`` is group ``g``: Sub when
    the request consumes or produces (Pub, Sub or Get asked, RocketMQ's rule), else the admin
    actions asked (creating or deleting a retry topic is not a consumer's right)."""
    resource = Resource.of(rtype, name)
    wanted = frozenset(actions)
    retry = rtype is ResourceType.TOPIC and resource.type is ResourceType.GROUP
    if retry and wanted & {Action.PUB, Action.SUB, Action.GET}:
        wanted = frozenset({Action.SUB})
    return Check(resource, wanted)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str
    failed: Check | None = None


def decide(
    user: User | None,
    entries: Sequence[PolicyEntry] | None,
    checks: Sequence[Check],
    source_ip: str,
) -> Verdict:
    """Whether ``user`` may do all of ``checks`` from ``source_ip`` (every check must pass)."""
    if user is None:
        return Verdict(False, "unknown user")
    if not user.enabled:
        return Verdict(False, f"user {user.name} is disabled")
    if user.type is UserType.SUPER:
        return Verdict(True, "super user")
    if not entries:
        return Verdict(False, f"user {user.name} has no ACL", checks[0] if checks else None)
    for chk in checks:
        best = _best(entries, chk, source_ip)
        if best is None:
            return Verdict(False, f"no entry of {user.name} grants {chk}", chk)
        if best.decision is Decision.DENY:
            return Verdict(False, f"{best.resource} denies {chk} to {user.name}", chk)
    return Verdict(True, "allowed by policy")


def _best(entries: Sequence[PolicyEntry], chk: Check, ip: str) -> PolicyEntry | None:
    found = [
        e
        for e in entries
        if e.resource.matches(chk.resource) and e.covers(chk.actions) and e.applies_to(ip)
    ]
    if not found:
        return None
    return min(found, key=lambda e: (*e.resource.rank(), 0 if e.decision is Decision.DENY else 1))
