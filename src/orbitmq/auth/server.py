"""What a broker or NameServer holds of auth: the Guard (when authentication is on) and the
user/ACL admin codes, behind one call made before any handler.

``ServerAuth.before(frame, conn)`` returns None when the request goes on to its handler, or
the answer: a refusal, or the answer to an admin code (3001-3010), which it handles itself.
First of all, an admin request over a connection the listener's ``admin_transport`` does not
accept (plaintext, or TLS without a client certificate for ``mtls``) gets ADMIN_REQUIRES_TLS,
whether authentication is on or not. With
authentication off there is no Guard; the admin codes still work on the store when one is
configured (to prepare users before turning authentication on), answered to anyone who can
reach the port, as every other request then is: `make up`'s development mode, on loopback.

An admitted request's user (its verified access key, or the certificate's principal) becomes
the connection's ``attributes["principal"]``, the key its byte-rate quotas are charged to
(``net/quota.py``): Kafka's user quotas, so two users behind one address (one NAT, one host)
each get their own quota. A connection carries one client's credentials in practice; were two
users to interleave requests on one, each response is charged to the last user admitted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orbitmq.auth.actions import TRANSPORT_ADMIN_CODES
from orbitmq.auth.admin import AuthAdmin
from orbitmq.auth.audit import AuditLog
from orbitmq.auth.document import FollowerAuthStore, Invoker
from orbitmq.auth.guard import AUTH_FAILED, MAX_AUTH_FAILURES, Guard, peer_ip
from orbitmq.auth.store import AuthStore, load_key
from orbitmq.common.codes import ResponseCode
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)

AUTH_FAILURE_DELAY_S = 0.1
ADMIN_SECRET_ENV = "ORBITMQ_AUTH_ADMIN_SECRET"
"""The initial admin's secret when a store has no Super user yet (else one is generated)."""


def bootstrap_admin(store: AuthStore, admin_user: str = "admin") -> None:
    """Give a store without a Super user its first admin: the secret of ADMIN_SECRET_ENV, or a
    generated one printed once to stderr (never logged, never stored in clear)."""
    generated = store.bootstrap(admin_user, os.environ.get(ADMIN_SECRET_ENV) or None)
    if generated is not None:
        print(
            f"orbitmq: authentication is on and the auth store had no Super user: created "
            f"{admin_user!r} with secret {generated} (shown once; keep it, or set "
            f"{ADMIN_SECRET_ENV} before the first start)",
            file=sys.stderr,
            flush=True,
        )


def transport_refusal(frame: Frame, conn: Any, needed: str) -> str | None:
    """Why ``frame`` may not come over ``conn`` (None: it may). ``needed``: ``any``, ``tls`` or
    ``mtls`` (``ListenerSettings.admin_transport_needed``); only admin codes are restricted."""
    if needed == "any" or frame.code not in TRANSPORT_ADMIN_CODES:
        return None
    if not getattr(conn, "tls", False):
        return f"request code {frame.code} is an admin request: it needs a TLS connection"
    if needed == "mtls" and not getattr(conn, "peer_cert", None):
        return (
            f"request code {frame.code} is an admin request: it needs TLS with a client certificate"
        )
    return None


class ServerAuth:
    def __init__(
        self,
        store: AuthStore | None,
        audit: AuditLog,
        guard: Guard | None,
        admin_transport: str = "any",
    ) -> None:
        """``store``: a file AuthStore, or a DocumentAuthStore (controller quorum)."""
        self.store = store
        self.audit = audit
        self.guard = guard
        self.admin_transport = admin_transport
        """``any``, ``tls`` or ``mtls``: what admin requests need (checked before anything)."""
        self.admin = None if store is None else AuthAdmin(store, audit)
        self.codes = frozenset() if self.admin is None else self.admin.codes
        """Request codes answered here (the admin codes)."""

    @classmethod
    def open(
        cls,
        *,
        enabled: bool,
        auth_file: str | os.PathLike[str] | None,
        audit_file: str | os.PathLike[str] | None,
        cluster: str,
        node: str,
        admin_user: str = "admin",
        controllers: Sequence[str] = (),
        admin_transport: str = "any",
    ) -> ServerAuth:
        """Build from a server's settings; with ``enabled``, make sure an admin exists (a
        generated secret is printed once, to stderr, and never stored in clear).
        ``controllers``: users and ACLs are the controller quorum's, followed read-only
        (``auth_file`` then caches the last version; call :meth:`start`)."""
        audit = AuditLog(audit_file, node)
        if controllers:
            if auth_file is None:
                raise ValueError("following the controllers' users needs an auth_file (cache)")
            cache = Path(auth_file)
            follower = FollowerAuthStore(cache, load_key(cache, create=False), controllers)
            guard = Guard(follower, audit, cluster=cluster) if enabled else None
            return cls(follower, audit, guard, admin_transport)
        if auth_file is None:
            if enabled:
                raise ValueError("authentication needs an auth_file")
            return cls(None, audit, None, admin_transport)
        store = AuthStore(auth_file)
        if not enabled:
            return cls(store, audit, None, admin_transport)
        bootstrap_admin(store, admin_user)
        return cls(store, audit, Guard(store, audit, cluster=cluster), admin_transport)

    async def start(self, invoker: Invoker) -> None:
        """Start following the controllers (a FollowerAuthStore only): ``invoker`` is a
        RemotingClient that signs as this server's user."""
        if isinstance(self.store, FollowerAuthStore):
            await self.store.start(invoker)

    async def stop(self) -> None:
        if isinstance(self.store, FollowerAuthStore):
            await self.store.stop()

    @property
    def enabled(self) -> bool:
        return self.guard is not None

    @staticmethod
    async def penalize(answer: Frame, conn: Any) -> None:
        """Call before sending ``answer``: a failed authentication waits AUTH_FAILURE_DELAY_S,
        and the MAX_AUTH_FAILURES-th on a connection closes it once this answer is written
        (brief 6.1: guessing a secret costs time and connections)."""
        if answer.code != ResponseCode.NO_PERMISSION or answer.remark != AUTH_FAILED:
            return
        await asyncio.sleep(AUTH_FAILURE_DELAY_S)
        attributes = getattr(conn, "attributes", None)
        failures = attributes.get("auth_failures", 0) if isinstance(attributes, dict) else 0
        if failures >= MAX_AUTH_FAILURES and hasattr(conn, "close"):
            # call_soon: the caller writes the answer first, in this same step
            asyncio.get_running_loop().call_soon(conn.close, f"{failures} authentication failures")

    def before(self, frame: Frame, conn: Any) -> Frame | None:
        refusal = (
            None
            if self.admin_transport == "any"
            else transport_refusal(frame, conn, self.admin_transport)
        )
        if refusal is not None:  # before any credential is looked at
            self.audit.deny(
                principal="-", source=peer_ip(conn)[1], code=frame.code, resource="-",
                action="-", reason=refusal,
            )  # fmt: skip
            return frame.reply(ResponseCode.ADMIN_REQUIRES_TLS, refusal)
        principal: str | None = None
        if self.guard is not None:
            admitted = self.guard.admit(frame, conn)
            if isinstance(admitted, Frame):
                return admitted
            principal = admitted
            attributes = getattr(conn, "attributes", None)
            if isinstance(attributes, dict):
                attributes["principal"] = principal  # the quota key (net/quota.py)
        if self.admin is not None and frame.code in self.codes:
            return self.admin.handle(frame, principal, peer_ip(conn)[1])
        return None
