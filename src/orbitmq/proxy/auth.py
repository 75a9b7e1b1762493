"""The ``MQv2-HMAC-SHA1`` Authorization header of RocketMQ 5 clients, verified.

Every call carries ``authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
Signature=<hex>`` where the signature is ``hex(HMAC-SHA1(secret key, x-mq-date-time header))``.
Clients send it even without credentials (empty ``Credential=``), so it only matters when ACL is
on. The secrets come from the shared auth store (``auth_file``: the users of the brokers and
NameServers, re-read when the file changes, so a disabled or deleted user is refused within a
second) or, without one, from the proxy's own ``access_keys`` table. An unknown access key, a
disabled user and a wrong signature get the same answer. No clock-skew check, on purpose: the Python client stamps local time labelled as UTC, and the
Telemetry stream is signed once and lives for a year (the Java proxy does not check skew either).

**Client certificates.** With mutual TLS on (``tls_client_ca_file``), a call that carries no
signature (no Authorization header, or one naming no access key, as clients without
credentials send) but a verified client certificate is made by the user the certificate names
(``check(..., certificate=name)``; the name comes from :mod:`orbitmq.proxy.mtls`, Remoting's
rule). That user must exist and be enabled (in the store, or be a key of ``access_keys``).
A call that carries a signature is judged by it alone, as on Remoting (``Guard.principal``): a
wrong signature is refused even when the certificate names a valid user, and a right one
counts as its access key even when the certificate names someone else.

Verified headers are remembered: clients stamp ``x-mq-date-time`` to the second, so the calls of
one client within a second carry the same (Authorization, date-time) pair, and its verdict
depends only on that pair and the secrets. A remembered pass holds only for the store version
it was checked against (``AuthStore.snapshot``, re-read as before), so a disabled user is
refused as soon as the proxy sees the new file. Failures are not remembered.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orbitmq.auth.model import inner_refusal
from orbitmq.auth.store import AuthStore
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.status import ProxyError

log = logging.getLogger(__name__)

ALGORITHM = "MQv2-HMAC-SHA1"
HEADER_AUTHORIZATION = "authorization"
HEADER_DATE_TIME = "x-mq-date-time"
BAD_CREDENTIAL = "authentication failed: check signature failed or unknown access key"
MAX_HEADER_CHARS = 4096
"""A longer Authorization header is refused before parsing (no client sends one)."""
MAX_REMEMBERED = 4096
"""Verified (Authorization, date-time) pairs kept; the table is emptied when it is full."""


@dataclass(frozen=True, slots=True)
class Credential:
    access_key: str
    signature: str
    signed_headers: str


def parse_authorization(value: str) -> Credential:
    """Split ``<algorithm> k=v, k=v, ...``; raise UNAUTHORIZED if it is not our scheme."""
    if len(value) > MAX_HEADER_CHARS:
        raise ProxyError(pb.Code.UNAUTHORIZED, "authorization header too long")
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise ProxyError(
            pb.Code.UNAUTHORIZED, f"unsupported authorization algorithm {algorithm[:40]!r}"
        )
    items: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            items[key.strip()] = val.strip()
    # Some SDKs send "AK/<scope...>": the access key is the part before the first slash.
    access_key = items.get("Credential", "").split("/", 1)[0]
    signature = items.get("Signature", "")
    if not access_key or not signature:
        raise ProxyError(pb.Code.UNAUTHORIZED, "authorization header lacks Credential or Signature")
    return Credential(access_key, signature, items.get("SignedHeaders", HEADER_DATE_TIME))


def unsigned(value: str) -> bool:
    """True when the Authorization header ``value`` carries no signature: it is absent, or is
    our scheme naming no access key (``Credential=``, what clients without credentials send).
    Anything else is a signature, checked (and refused if malformed)."""
    if not value:
        return True
    if len(value) > MAX_HEADER_CHARS:
        return False
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return False
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep and key.strip() == "Credential":
            return not val.strip().split("/", 1)[0]
    return True


def sign(secret_key: str, date_time: str) -> str:
    """What a client puts in ``Signature=``: lowercase hex of HMAC-SHA1(sk, date-time)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class Authenticator:
    """Verifies calls against the auth store's users (or the configured access keys). ``check``
    returns the access key (or "" when ACL is off) and raises ProxyError(UNAUTHORIZED)
    otherwise."""

    def __init__(
        self,
        enabled: bool,
        access_keys: Mapping[str, str],
        *,
        store: AuthStore | None = None,
        refresh_interval_s: float = 0.25,
    ) -> None:
        self.enabled = enabled
        self._keys = dict(access_keys)
        self.store = store
        self.refresh_interval_s = refresh_interval_s
        self._next_refresh = 0.0
        self._verified: dict[tuple[str, str], tuple[object, str]] = {}
        """(authorization, date-time) -> (the store snapshot it passed against, access key)."""

    def refresh(self) -> None:
        """Re-read the store if its file changed, at most every refresh_interval_s."""
        now = time.monotonic()
        if self.store is not None and now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval_s
            try:
                self.store.refresh()
            except Exception:  # a half-written file: keep the last good version
                log.exception("auth store %s could not be read", self.store.path)

    def _secret(self, access_key: str) -> str | None:
        if self.store is None:
            return self._keys.get(access_key)
        self.refresh()
        user = self.store.user(access_key)
        if user is None or not user.enabled:
            return None
        return self.store.secret(access_key)

    def _certified(self, name: str) -> str:
        """The user a verified client certificate names, if it may authenticate."""
        if self.store is None:
            known = name in self._keys
        else:
            user = self.store.user(name)
            known = user is not None and user.enabled
        if not known:
            raise ProxyError(pb.Code.UNAUTHORIZED, BAD_CREDENTIAL)
        return name

    def check(
        self,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        certificate: str | None = None,
        peer_ip: str = "",
    ) -> str:
        """The call's user. ``certificate``: the user its verified client certificate names
        (mutual TLS), used when the call carries no signature. ``peer_ip``: the caller's
        address; an inner user (``User.inner``) signing without a certificate naming it is
        admitted only from loopback, and only when its ``inner`` is ``loopback``."""
        if not self.enabled:
            return ""
        auth = date_time = ""
        for key, value in metadata or ():
            if key == HEADER_AUTHORIZATION:
                auth = value if isinstance(value, str) else value.decode("latin-1")
            elif key == HEADER_DATE_TIME:
                date_time = value if isinstance(value, str) else value.decode("latin-1")
        snapshot: object = None
        if self.store is not None:
            self.refresh()
            snapshot = self.store.snapshot
        if certificate and unsigned(auth):
            return self._certified(certificate)
        if not auth:
            raise ProxyError(pb.Code.UNAUTHORIZED, "ACL is on: the call carries no authorization")
        known = self._verified.get((auth, date_time))
        if known is not None and known[0] is snapshot:
            return self._inner_checked(known[1], certificate, peer_ip)
        cred = parse_authorization(auth)
        secret = self._secret(cred.access_key)
        if secret is None:
            raise ProxyError(pb.Code.UNAUTHORIZED, BAD_CREDENTIAL)
        if not date_time:
            raise ProxyError(pb.Code.UNAUTHORIZED, f"missing {HEADER_DATE_TIME} header")
        expected = sign(secret, date_time)
        given = cred.signature.strip().lower().encode("utf-8", "replace")
        if not hmac.compare_digest(expected.encode(), given):
            raise ProxyError(pb.Code.UNAUTHORIZED, BAD_CREDENTIAL)
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        self._verified[(auth, date_time)] = (snapshot, cred.access_key)
        return self._inner_checked(cred.access_key, certificate, peer_ip)

    def _inner_checked(self, name: str, certificate: str | None, peer_ip: str) -> str:
        """``name``, unless it is an inner user whose transport this call does not have."""
        user = None if self.store is None else self.store.user(name)
        if user is not None and user.inner and inner_refusal(user, certificate, peer_ip):
            raise ProxyError(pb.Code.UNAUTHORIZED, BAD_CREDENTIAL)
        return name
