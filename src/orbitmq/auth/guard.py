"""The one check every request passes on a broker or NameServer: who sent it, may they do it.

``Guard.admit(frame, conn)`` runs before any handler (``broker/routes.py:Dispatcher.handle``,
``namesrv/processor.py:NamesrvProcessor.process``, through ``orbitmq.auth.server.ServerAuth``)
and returns the authenticated user's name (go on) or the refusal Frame to send back:

1. **Authentication.** The request's ``AccessKey``/``Signature`` (v1 RocketMQ, v2 OrbitMQ with a
   replay window; ``orbitmq.protocol.signature``) is checked against the user's secret in
   constant time; or, without an AccessKey, a verified client certificate (mTLS) names the user
   by its first DNS/URI subjectAltName, else its CN. An inner user (``User.inner``: the
   proxy's, a broker's own, Super) is admitted only when a verified certificate names it too
   (or, ``loopback``, from a loopback address): its secret alone is not enough. No
   credentials, an unknown user, a wrong signature, a disabled user and an inner user
   without its transport all get the same answer, NO_PERMISSION (16), as RocketMQ's
   "check signature failed", so a caller cannot probe for user names.
2. **Authorization.** ``orbitmq.auth.actions`` maps the code to its checks (an unmapped code,
   or a request whose resource names cannot be read, is refused) and ``orbitmq.auth.model.decide`` applies the user's ACL from the source IP.

**Caches** (what makes the check cheap next to the body's HMAC, docs/benchmarks.md "ACL
cost"): per access key, the user, its keyed secret and its ACL; per (code, header names read
by the code's rule), the checks; per (user, source IP, those), the allowed verdict. The user
and verdict caches belong to one store version (the Snapshot they were read from) and are
emptied when the store moves to another, so a revocation is as quick as without them.
Refusals are never cached.

Refusals go to the audit log. Failed authentications are counted per connection;
``ServerAuth.penalize`` delays their answers and closes the connection at MAX_AUTH_FAILURES. The store is re-read when its file changed, looked at no more
often than every ``refresh_interval_s`` (0.25 s): a revocation holds within 1 s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orbitmq.auth.actions import ADMIN_CODES, Unmapped, checks_for, header_key
from orbitmq.auth.audit import AuditLog
from orbitmq.auth.model import Check, PolicyEntry, User, Verdict, decide, inner_refusal
from orbitmq.auth.store import AuthStore, Snapshot
from orbitmq.common.codes import ResponseCode
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import NonceCache, SignatureError, SigningKey, claim_of, verify

log = logging.getLogger(__name__)

AUTH_FAILED = "authentication failed: check signature failed or unknown access key"
MAX_AUTH_FAILURES = 5
"""Authentication failures after which a connection is closed (brief 6.1)."""
CACHE_LIMIT = 4096
"""Entries per cache (users, checks, decisions); a full cache is emptied, as the proxy's."""


def peer_ip(conn: Any) -> tuple[str, str]:
    """(ip, "ip:port") of a server connection (anything with ``peer``)."""
    source = str(getattr(conn, "peer", "?"))
    host, sep, _port = source.rpartition(":")
    ip = host if sep else source
    return ip.strip("[]"), source


def cert_principal(conn: Any) -> str | None:
    """The user a verified client certificate names (None: no certificate). A connection that
    already names it (``conn.principal``, set by the TLS layer) is taken at its word."""
    named = getattr(conn, "principal", None)
    if isinstance(named, str) and named:
        return named
    transport = getattr(conn, "transport", None)
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "URI") and value:
            return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    return None


_UserEntry = tuple[User, SigningKey, tuple[PolicyEntry, ...]]
_Version = tuple[Snapshot, dict[str, _UserEntry | None], dict[tuple[object, ...], Verdict]]


class Guard:
    """Authenticates and authorizes requests against an AuthStore."""

    def __init__(
        self,
        store: AuthStore,
        audit: AuditLog,
        *,
        cluster: str,
        refresh_interval_s: float = 0.25,
        clock_ms: Any = None,
    ) -> None:
        self.store = store
        self.audit = audit
        self.cluster = cluster
        self.refresh_interval_s = refresh_interval_s
        self.nonces = NonceCache()
        self._keys: dict[str, SigningKey] = {}
        """Per user, its secret keyed once (kept across store versions while the secret is
        the same: re-deriving the pads is the one costly step of a user's entry)."""
        self._version: _Version = (Snapshot(), {}, {})
        """(store version, its users, its verdicts): users are access key -> (user, key,
        ACL) or None (no such user); verdicts (user, source IP, header_key) -> an allowed
        verdict. Replaced whole when the store publishes another Snapshot (immutable once
        published), so an entry computed from one version can only land in that version's
        dicts, even when requests are checked on several threads (the controller's)."""
        self._checks: dict[tuple[object, ...], list[Check]] = {}
        """header_key -> its checks (independent of the version: names and codes only)."""
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._next_refresh = 0.0
        self.refused = 0
        """Requests refused so far (authentication and authorization)."""

    def refresh(self) -> None:
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval_s
            try:
                self.store.refresh()
            except Exception:  # a half-edited or unreadable file: keep the last good version
                log.exception(
                    "auth store %s could not be read; keeping version %d",
                    self.store.path,
                    self.store.version,
                )

    def _current(self) -> _Version:
        """The caches of the store's current version (new, empty ones for a new version)."""
        version = self._version
        snapshot = self.store.snapshot
        if version[0] is not snapshot:
            version = self._version = (snapshot, {}, {})
        return version

    def _user(self, name: str, version: _Version) -> _UserEntry | None:
        """The user ``name`` of ``version``, its signing key and its ACL, looked up once per
        version (None: no such user)."""
        snapshot, users, _ = version
        try:
            return users[name]
        except KeyError:
            pass
        user, secret = snapshot.users.get(name), snapshot.secrets.get(name)
        if secret is None:
            self._keys.pop(name, None)  # a deleted user's key is not kept
        key = None if secret is None else self._key(name, secret)
        entry = None if user is None or key is None else (user, key, snapshot.acls.get(name, ()))
        if len(users) >= CACHE_LIMIT:
            users.clear()
        users[name] = entry
        return entry

    def principal(self, frame: Frame, conn: Any) -> str | None:
        """The authenticated user of ``frame`` (None: not authenticated)."""
        return self._principal(frame, conn, self._current())

    def _principal(self, frame: Frame, conn: Any, version: _Version) -> str | None:
        try:
            claim = claim_of(frame)
        except SignatureError:
            return None
        if claim is None:
            return cert_principal(conn)
        entry = self._user(claim.access_key, version)
        if entry is None or not verify(entry[1], frame, claim):
            return None
        if claim.version == 2 and self.nonces.admit(claim, self._clock_ms()) is not None:
            return None
        return claim.access_key

    def _key(self, name: str, secret: str) -> SigningKey:
        key = self._keys.get(name)
        if key is None or key.secret != secret:
            if len(self._keys) >= 10_000:  # bounded: users come and go
                self._keys.clear()
            key = self._keys[name] = SigningKey(secret)
        return key

    def _peer(self, conn: Any) -> tuple[str, str]:
        """peer_ip(conn), worked out once per connection (kept in its attributes)."""
        attributes = getattr(conn, "attributes", None)
        if attributes.__class__ is not dict:
            return peer_ip(conn)
        assert isinstance(attributes, dict)
        peer: tuple[str, str] | None = attributes.get("auth_peer")
        if peer is None:
            peer = attributes["auth_peer"] = peer_ip(conn)
        return peer

    def admit(self, frame: Frame, conn: Any) -> str | Frame:
        """The principal when ``frame`` may go to its handler, else the refusal to answer.

        Per request this verifies the signature (one HMAC over the fields and the body) and
        looks up three caches: the user of the access key, the checks of the code and its
        header names (``header_key``), and the verdict for (user, source IP, those checks).
        The user and verdict caches hold for one store version, so a revocation is
        enforced as soon as the store is re-read (``refresh``, 0.25 s). Failures are never
        remembered: each is refused, audited and counted anew."""
        self.refresh()
        version = self._current()
        ip, source = self._peer(conn)
        name = self._principal(frame, conn, version)
        if name is None:
            claimed = frame.fields.get("AccessKey")
            self._failed(conn)
            return self._refuse(
                frame, str(claimed)[:64] if claimed else "-", source, "-", "-", AUTH_FAILED
            )
        entry = self._user(name, version)
        # a certificate's user without a secret is not in the cache: read it from the version
        user = entry[0] if entry is not None else version[0].users.get(name)
        if user is None or not user.enabled:
            self._failed(conn)
            return self._refuse(frame, name, source, "-", "-", AUTH_FAILED)
        if user.inner:
            why = inner_refusal(user, cert_principal(conn), ip)
            if why is not None:  # audited with why, answered as any failed authentication
                self._failed(conn)
                return self._refuse(frame, name, source, "-", "-", why, answer=AUTH_FAILED)
        key = header_key(frame)
        decisions = version[2]
        remembered = None if key is None else decisions.get((name, ip, key))
        if remembered is not None and frame.code not in ADMIN_CODES:
            return name  # only allowed verdicts are remembered
        try:
            checks = self._checks.get(key) if key is not None else None
            if checks is None:
                checks = checks_for(frame, self.cluster)
                if key is not None:
                    if len(self._checks) >= CACHE_LIMIT:
                        self._checks.clear()
                    self._checks[key] = checks
        except Unmapped:
            return self._refuse(
                frame, name, source, "-", "-", f"request code {frame.code} is not authorized here"
            )
        except FieldError as exc:  # fail closed: what cannot be named cannot be allowed
            return self._refuse(frame, name, source, "-", "-", f"cannot authorize: {exc}")
        acl = entry[2] if entry is not None else version[0].acls.get(name, ())
        verdict = decide(user, acl, checks, ip)
        if not verdict.allowed:
            failed = verdict.failed
            return self._refuse(
                frame,
                name,
                source,
                str(failed.resource) if failed else "-",
                "|".join(sorted(a.value for a in failed.actions)) if failed else "-",
                verdict.reason,
            )
        if key is not None:
            if len(decisions) >= CACHE_LIMIT:
                decisions.clear()
            decisions[(name, ip, key)] = verdict
        if frame.code in ADMIN_CODES and not 3001 <= frame.code <= 3010:
            # user and ACL changes are recorded by the admin handler, with before and after
            self.audit.admin(
                principal=name,
                source=source,
                code=frame.code,
                resource=";".join(str(c.resource) for c in checks),
                action=";".join("|".join(sorted(a.value for a in c.actions)) for c in checks),
                result="authorized",
            )
        return name

    def _failed(self, conn: Any) -> None:
        """Count an authentication failure on ``conn`` (``ServerAuth.penalize`` closes it at
        MAX_AUTH_FAILURES)."""
        attributes = getattr(conn, "attributes", None)
        if isinstance(attributes, dict):
            attributes["auth_failures"] = int(attributes.get("auth_failures", 0)) + 1

    def _refuse(
        self,
        frame: Frame,
        principal: str,
        source: str,
        resource: str,
        action: str,
        reason: str,
        answer: str | None = None,
    ) -> Frame:
        self.refused += 1
        self.audit.deny(
            principal=principal,
            source=source,
            code=frame.code,
            resource=resource,
            action=action,
            reason=reason,
        )
        return frame.reply(ResponseCode.NO_PERMISSION, answer or reason)
