"""Who a Kafka connection is: SASL (PLAIN, SCRAM-SHA-256/512) or a client certificate,
checked against the cluster's ACL users, and the refusals audited.

Kafka's exchange (KIP-152): SaslHandshake v1 names the mechanism (the answer lists the enabled
ones; an unknown one gets UNSUPPORTED_SASL_MECHANISM), then SaslAuthenticate requests carry the
mechanism's tokens: PLAIN one (``authzid NUL user NUL password``), SCRAM two (client-first ->
server-first, client-final -> server-final; one implementation for MQTT and Kafka,
:mod:`orbitmq.auth.scram`). The password is the ACL user's secret key, compared in constant time;
an unknown user costs the same comparison (no probing for names). A wrong password, an unknown
or disabled user and a malformed token all get SASL_AUTHENTICATION_FAILED (58), after
AUTH_FAILURE_DELAY_S, and the connection is closed once the answer is written, as Kafka does.
After a SaslHandshake v0 (clients before KIP-152) the same tokens come in bare frames
(``orbitmq.protocol.kafka.connection.RawToken``), answered bare; a failure there closes the
connection without an answer, as Kafka 3 does.

A connection whose verified client certificate names an enabled user is that user from the
start (Kafka's SSL principal); SASL on such a connection authenticates as the SASL user instead.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from orbitmq.auth.audit import AuditLog
from orbitmq.auth.guard import Guard
from orbitmq.auth.model import User, inner_refusal
from orbitmq.auth.scram import HASHES, ScramError, ScramServer
from orbitmq.auth.store import AuthStore
from orbitmq.net.limits import REASON_ACL_DENIED, REASON_AUTH_FAILED, Refusals

log = logging.getLogger(__name__)

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
AUTH_FAILED_MESSAGE = "Authentication failed: invalid username or password"
AUDIT_CODE_AUTH = SASL_AUTHENTICATE
"""The ``code`` of a failed authentication's audit line (the Kafka API key)."""


@dataclass
class Session:
    """One connection's authentication state."""

    source: str
    """``ip:port`` of the client."""
    user: str | None = None
    """The authenticated user (None: not yet)."""
    certified: str | None = None
    """The user a verified client certificate of the connection names (None: no certificate)."""
    mechanism: str | None = None
    """Chosen by SaslHandshake, until the exchange ends."""
    scram: ScramServer | None = None
    failed: bool = False
    muted_until: float = 0.0
    """Loop time until which a byte-rate quota holds the connection's reading."""
    """An exchange failed: the connection is closed once the answer is written."""

    @property
    def ip(self) -> str:
        host, sep, _port = self.source.rpartition(":")
        return (host if sep else self.source).strip("[]")


class KafkaAuth:
    """The users of one auth store for the Kafka listener; ``refused`` counts refusals
    (authentication and authorization), as the broker's Guard does, and ``refusals`` (the
    listener's, exported as ``orbitmq_net_refused_total{listener="kafka"}``) counts them by
    reason: ``auth_failed``, ``acl_denied``."""

    def __init__(
        self,
        store: AuthStore,
        audit: AuditLog,
        mechanisms: tuple[str, ...],
        cluster: str,
        refusals: Refusals | None = None,
    ) -> None:
        # the broker's Guard re-reads the store (at most every 0.25 s): one refresh rule
        self.guard = Guard(store, audit, cluster=cluster)
        self.store = store
        self.audit = audit
        self.mechanisms = mechanisms
        self.cluster = cluster
        self.refused = 0
        self.refusals = refusals or Refusals()

    @classmethod
    def open(
        cls,
        auth_file: str,
        audit_file: str | None,
        mechanisms: tuple[str, ...],
        cluster: str,
        node: str,
        refusals: Refusals | None = None,
    ) -> KafkaAuth:
        audit = AuditLog(audit_file, node)
        return cls(AuthStore(auth_file), audit, mechanisms, cluster, refusals)

    def user(self, name: str) -> User | None:
        """An enabled user of the store now (None otherwise)."""
        self.guard.refresh()
        user = self.store.user(name)
        return user if user is not None and user.enabled else None

    def certificate_user(self, principal: str | None) -> str | None:
        """The user a verified client certificate names, when it is an enabled user."""
        if principal and self.user(principal) is not None:
            return principal
        return None

    def _secret(self, name: str) -> str | None:
        if self.user(name) is None:
            return None
        return self.store.secret(name)

    def handshake(self, session: Session, mechanism: str) -> int:
        """SaslHandshake: 0, or UNSUPPORTED_SASL_MECHANISM / ILLEGAL_SASL_STATE."""
        if session.mechanism is not None:
            return ILLEGAL_SASL_STATE
        if mechanism not in self.mechanisms:
            return UNSUPPORTED_SASL_MECHANISM
        session.mechanism = mechanism
        if mechanism in HASHES:
            session.scram = ScramServer(self._secret, HASHES[mechanism])
        return 0

    def authenticate(self, session: Session, token: bytes) -> tuple[int, bytes, bool]:
        """One SaslAuthenticate token -> (error code, server token, exchange done). A non-zero
        code is final: the caller answers it, then closes the connection."""
        mechanism = session.mechanism
        if mechanism is None:
            return ILLEGAL_SASL_STATE, b"", True
        if mechanism == "PLAIN":
            user = self._plain(token)
            return self._finish(session, user, "PLAIN"), b"", True
        scram = session.scram
        assert scram is not None
        try:
            if not scram.started:
                return 0, scram.first(token), False
            user, final = scram.final(token)
        except ScramError as exc:
            log.info("kafka %s: SCRAM failed: %s", session.source, exc)
            return self._finish(session, None, mechanism, scram.user), b"", True
        return self._finish(session, user, mechanism), final, True

    def _plain(self, token: bytes) -> str | None:
        parts = token.split(b"\0")
        if len(parts) != 3:
            return None
        try:
            authzid, name, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            return None
        if not name or (authzid and authzid != name):
            return None  # acting for another user is not a right anyone has here
        secret = self._secret(name)
        # the same comparison for an unknown user: no timing difference to probe names with
        ok = hmac.compare_digest((secret or "\0" * 32).encode(), password.encode())
        return name if ok and secret is not None else None

    def _finish(self, session: Session, user: str | None, mechanism: str, claimed: str = "") -> int:
        session.mechanism, session.scram = None, None
        known = self.user(user) if user is not None else None
        why = AUTH_FAILED_MESSAGE
        if known is not None and (inner := inner_refusal(known, session.certified, session.ip)):
            why, claimed, user = inner, user or "", None  # the client hears only "failed"
        if user is None:
            self.refused += 1
            self.refusals.counts[REASON_AUTH_FAILED] += 1  # no log line each: the audit has it
            self.audit.deny(
                principal=(claimed or "-")[:64], source=session.source, code=AUDIT_CODE_AUTH,
                resource="-", action="-", reason=f"SASL {mechanism}: {why}",
            )  # fmt: skip
            return SASL_AUTHENTICATION_FAILED
        session.user = user
        return 0

    def deny(
        self, session: Session, api_key: int, resource: str, action: str, reason: str,
        kind: str = REASON_ACL_DENIED,
    ) -> None:  # fmt: skip
        """Record a refused request (audit line, counters; ``kind``: the metric's reason)."""
        self.refused += 1
        self.refusals.counts[kind] += 1
        self.audit.deny(
            principal=session.user or "-", source=session.source, code=api_key,
            resource=resource, action=action, reason=reason,
        )  # fmt: skip
