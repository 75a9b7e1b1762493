"""Authentication and authorization of MQTT clients: the ACL users and policies, or a password file.

Three modes, picked at start (:meth:`Authenticator.build`):

- **ACL** (the broker runs with ``[broker] auth_enabled``; issue #12, docs/security.md): the
  CONNECT's user name is an ACL user and its password that user's secret key, compared in
  constant time (an unknown user costs the same comparison). Without a password, a verified
  client certificate's principal (first DNS/URI subjectAltName, else CN; mutual TLS) is the user;
  a user name that differs from it is refused. A disabled user is refused. Then every PUBLISH is
  a ``Pub`` on the OrbitMQ topic it is stored in (the MQTT topic's first level, or the fallback
  topic), every SUBSCRIBE a ``Sub`` on the filter's OrbitMQ topic, plus ``Sub`` on
  ``Group:<name>`` for ``$share/<name>/...``, and a will a ``Pub`` checked at CONNECT, all decided
  by :func:`orbitmq.auth.model.decide` from the client's address. A filter whose first level is
  a wildcard reads every topic: it needs ``Sub`` on ``Topic:*`` (or ``*``) and no Deny entry on
  any topic. The store is re-read when its file changes (a revoked user cannot connect within
  about a second; a live connection keeps the subscriptions it was granted). Refusals are
  written to the broker's audit log.
- **Password file** (``[mqtt] auth_enabled`` while the broker's authentication is off): the
  pre-#12 stop-gap, kept for small setups: one ``user:sha256-hex`` line per user (blank lines and
  ``#`` comments skipped), compared in constant time; a verified certificate's principal is
  accepted as the user. No policies.
- **Off**: every client is accepted and may do everything (the principal of a certificate, if
  any, is still the connection's user name).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from orbitmq.auth.model import Action, Decision, ResourceType, check, decide, inner_refusal
from orbitmq.common.errors import ConfigError

if TYPE_CHECKING:
    from orbitmq.auth.server import ServerAuth
    from orbitmq.mqtt.config import MqttConfig

log = logging.getLogger(__name__)

AUDIT_CODE_CONNECT = 1
AUDIT_CODE_PUBLISH = 3
AUDIT_CODE_SUBSCRIBE = 8
"""MQTT packet types, written as the ``code`` of the audit log's deny lines."""
AUTH_FAILED = "MQTT CONNECT: bad user name or password"
EVERY_TOPIC = "*"
"""The resource name checked for a filter whose first level is a wildcard."""


def load_password_file(path: str) -> dict[str, str]:
    users: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"mqtt.password_file {path}: {exc}") from exc
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, digest = line.partition(":")
        if not sep or not user or len(digest) != 64:
            raise ConfigError(f"mqtt.password_file {path}:{n}: not user:sha256-hex")
        users[user] = digest.lower()
    return users


class Authenticator:
    def __init__(
        self, enabled: bool, password_file: str | None, acl: ServerAuth | None = None
    ) -> None:
        self.guard = acl.guard if acl is not None else None
        """The broker's guard (ACL mode), None otherwise."""
        self.audit = acl.audit if acl is not None else None
        self.enabled = enabled or self.guard is not None
        self.users = (
            load_password_file(password_file)
            if enabled and password_file and self.guard is None
            else {}
        )
        self.refused = 0
        """CONNECTs, PUBLISHes and subscriptions refused so far."""

    @classmethod
    def build(cls, config: MqttConfig, server_auth: ServerAuth | None) -> Authenticator:
        acl = server_auth if server_auth is not None and server_auth.guard is not None else None
        if acl is None and config.auth_enabled and not config.password_file:
            raise ConfigError(
                "mqtt.auth_enabled needs mqtt.password_file (or the broker's auth_enabled)"
            )
        if acl is not None and config.password_file:
            log.warning("mqtt.password_file is ignored: the broker's ACL users authenticate MQTT")
        return cls(config.auth_enabled, config.password_file, acl)

    def check(self, username: str | None, password: bytes | None) -> bool:
        """Whether a CONNECT with these credentials (and no certificate) is accepted."""
        return self.login(username, password, None, "-") is not None

    def login(
        self, username: str | None, password: bytes | None, principal: str | None, source: str
    ) -> str | None:
        """The connection's user name ("" for an anonymous client when authentication is
        off), or None: refused (CONNACK 0x86 / 3.1.1 code 4)."""
        if not self.enabled:
            return username or principal or ""
        user = self._authenticate(username, password, principal)
        reason = AUTH_FAILED
        if user is not None:
            why = self._inner_refusal(user, principal, source)
            if why is not None:  # an inner user's secret alone is not enough (docs/security.md)
                user, reason = None, why
        if user is None:
            self.refused += 1
            if self.guard is not None and self.audit is not None:
                self.audit.deny(
                    principal=(username or principal or "-")[:64], source=source,
                    code=AUDIT_CODE_CONNECT, resource="-", action="-", reason=reason,
                )  # fmt: skip
        return user

    def _inner_refusal(self, name: str, principal: str | None, source: str) -> str | None:
        """Why inner user ``name`` may not log in so (None: not inner, or it may)."""
        user = None if self.guard is None else self.guard.store.user(name)
        if user is None or not user.inner:
            return None
        return inner_refusal(user, principal, source.rpartition(":")[0].strip("[]"))

    def _authenticate(
        self, username: str | None, password: bytes | None, principal: str | None
    ) -> str | None:
        if password is None:
            if principal is None or (username and username != principal):
                return None
            if self.guard is None:
                return principal  # the CA vouches for it: no policies to look up
            return principal if self._enabled_user(principal) else None
        if username is None:
            return None
        if self.guard is None:
            want = self.users.get(username)
            got = hashlib.sha256(password).hexdigest()
            ok = hmac.compare_digest(want or "0" * 64, got) and want is not None
            return username if ok else None
        self.guard.refresh()
        secret = self.guard.store.secret(username)
        # the same comparison for an unknown user: no timing difference to probe names with
        ok = hmac.compare_digest((secret or "\0" * 32).encode(), password) and secret is not None
        return username if ok and self._enabled_user(username) else None

    @property
    def scram_enabled(self) -> bool:
        """SCRAM-SHA-256 enhanced authentication needs the ACL users' secrets (the password
        file keeps only digests)."""
        return self.guard is not None

    def scram_secret(self, username: str) -> str | None:
        """The secret of an enabled ACL user, None for anyone else (scram.py's lookup)."""
        if self.guard is None:
            return None
        self.guard.refresh()
        secret = self.guard.store.secret(username)
        user = self.guard.store.user(username)
        if user is not None and user.inner:  # SCRAM proves the shared secret only
            return None
        return secret if secret is not None and self._enabled_user(username) else None

    def scram_failed(self, username: str, source: str) -> None:
        """A SCRAM exchange failed: counted and audited as a refused CONNECT."""
        self.refused += 1
        if self.audit is not None:
            self.audit.deny(
                principal=(username or "-")[:64], source=source, code=AUDIT_CODE_CONNECT,
                resource="-", action="-", reason=AUTH_FAILED,
            )  # fmt: skip

    def _enabled_user(self, name: str) -> bool:
        if self.guard is None:
            return False
        self.guard.refresh()
        user = self.guard.store.user(name)
        return user is not None and user.enabled

    def may(
        self, user: str, action: Action, topic: str, source_ip: str, *, group: str | None = None
    ) -> bool:
        """Whether ``user`` may Pub/Sub on OrbitMQ ``topic`` (EVERY_TOPIC: a first-level
        wildcard) and, for a shared subscription, Sub on ``group``. Always True outside ACL
        mode."""
        guard = self.guard
        if guard is None or self.audit is None:
            return True
        guard.refresh()
        store = guard.store
        entries = store.acl(user)
        checks = [check(ResourceType.TOPIC, topic, action)]
        if group is not None:
            checks.append(check(ResourceType.GROUP, group, Action.SUB))
        verdict = decide(store.user(user), entries, checks, source_ip)
        allowed, reason = verdict.allowed, verdict.reason
        if allowed and topic == EVERY_TOPIC and verdict.reason != "super user":
            for e in entries:  # every topic includes the denied ones
                if (
                    e.decision is Decision.DENY
                    and e.resource.type in (ResourceType.TOPIC, ResourceType.ANY)
                    and e.covers(frozenset({action}))
                    and e.applies_to(source_ip)
                ):
                    allowed, reason = False, f"{e.resource} denies {action.value} to {user}"
                    break
        if not allowed:
            self.refused += 1
            self.audit.deny(
                principal=user, source=source_ip,
                code=AUDIT_CODE_PUBLISH if action is Action.PUB else AUDIT_CODE_SUBSCRIBE,
                resource=f"Topic:{topic}" + (f";Group:{group}" if group else ""),
                action=action.value, reason=reason,
            )  # fmt: skip
        return allowed
