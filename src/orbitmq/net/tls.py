"""TLS contexts for every Remoting listener and client, and certificate reload without restart.

Contract:

- :func:`server_context` builds a server context from PEM files: TLS 1.2 or newer only, the
  certificate chain and key, and, for mutual TLS, the CA that client certificates must chain to
  with ``client_auth`` ``optional`` (a certificate, if shown, must verify) or ``required`` (no
  certificate, no connection: the handshake fails before any application byte).
- :func:`client_context` builds a client context that **verifies the server by default**
  (certificate chain and host name) against the system roots or ``ca_file``; ``verify=False`` is
  an explicit opt-out for development. A client certificate is optional (mutual TLS).
- :class:`ContextSource` holds the context a listener uses for *new* handshakes and rebuilds it
  when a file it was built from changes (polled by SHA-256, as RocketMQ polls every 500 ms) or on
  SIGHUP (:func:`reload_all`). Established connections keep the context they were made with, so
  a reload drops nothing. A rebuild that fails (a half-written file) keeps the old context and
  logs why; the next poll tries again.

- :meth:`ContextSource.handshake_context` serves servers that take one ``ssl=`` context at
  start (``asyncio.start_server``, the broker's HA replication port): its SNI callback, which
  OpenSSL calls on every ClientHello (with or without a server name), checks the files at most
  every ``interval_s`` and switches the handshake to the current context. The switch replaces
  the certificate, key and CA store (OpenSSL's ``SSL_set_SSL_CTX``); the verify mode stays the
  front context's, which is built by the same function and so asks the same.

Why not ``load_cert_chain`` again on the same context: a CA change needs a fresh verify store,
and a fresh context is the only way to replace one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbitmq.common.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "CLIENT_AUTH",
    "TLS_MODES",
    "ContextSource",
    "client_context",
    "peer_identity",
    "reload_all",
    "server_context",
]

TLS_MODES = ("off", "permissive", "required")
"""off: plaintext only. permissive: TLS and plaintext on one port, told apart by the first byte
(0x16 starts a TLS handshake record). required: TLS only; a plaintext connection is closed."""
CLIENT_AUTH = ("none", "optional", "required")
"""Client certificates: not asked for; verified if shown; required (mutual TLS)."""
TLS_RECORD_HANDSHAKE = 0x16


def _base(purpose: ssl.Purpose) -> ssl.SSLContext:
    ctx = ssl.create_default_context(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert_file}: {exc}") from exc


def _load_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS CA file {ca_file}: {exc}") from exc


def server_context(
    cert_file: str,
    key_file: str | None = None,
    *,
    ca_file: str | None = None,
    client_auth: str = "none",
) -> ssl.SSLContext:
    """A server context (TLS >= 1.2). ``client_auth`` other than ``none`` needs ``ca_file``."""
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"client_auth {client_auth!r}: must be one of {', '.join(CLIENT_AUTH)}")
    # Purpose.CLIENT_AUTH is a server-side context: it does not load default roots for clients.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    _load_chain(ctx, cert_file, key_file)
    if client_auth != "none":
        if not ca_file:
            raise ConfigError(f"client_auth={client_auth} needs a CA file for client certificates")
        _load_ca(ctx, ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(
    *,
    ca_file: str | None = None,
    verify: bool = True,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext:
    """A client context that verifies the server (chain and host name) unless ``verify`` is
    False; ``ca_file`` replaces the system roots; ``cert_file`` is shown for mutual TLS."""
    ctx = _base(ssl.Purpose.SERVER_AUTH)
    if ca_file:
        _load_ca(ctx, ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        _load_chain(ctx, cert_file, key_file)
    return ctx


def peer_identity(cert: dict[str, Any] | None) -> str | None:
    """The principal a verified client certificate names: its first DNS or IP subject
    alternative name, else its subject CN (None: no certificate)."""
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "IP Address"):
            return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


_SOURCES: weakref.WeakSet[ContextSource] = weakref.WeakSet()


class ContextSource:
    """The current context built by ``build`` from ``files``; :meth:`check` rebuilds it when
    a file's content changed. Call :meth:`watch` in a task to poll."""

    def __init__(
        self, build: Callable[[], ssl.SSLContext], files: list[str], interval_s: float = 0.5
    ) -> None:
        self._build = build
        self.files = [f for f in files if f]
        self.interval_s = interval_s
        """How often :meth:`watch` looks at the files."""
        self.current = build()
        self.reloads = 0
        self._digest = self._hash()
        _SOURCES.add(self)

    @classmethod
    def fixed(cls, ctx: ssl.SSLContext) -> ContextSource:
        """A context given ready-made (tests, embedding): never reloaded."""
        return cls(lambda: ctx, [])

    def _hash(self) -> bytes:
        h = hashlib.sha256()
        for name in self.files:
            try:
                h.update(Path(name).read_bytes())
            except OSError:
                h.update(b"\0missing\0")
            h.update(b"\0")
        return h.digest()

    def check(self, force: bool = False) -> bool:
        """Rebuild if a file changed (or ``force``); True if the context was replaced."""
        if not self.files:
            return False
        digest = self._hash()
        if digest == self._digest and not force:
            return False
        try:
            ctx = self._build()
        except ConfigError as exc:
            log.warning("TLS reload failed, keeping the previous certificate: %s", exc)
            return False
        self.current, self._digest = ctx, digest
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", ", ".join(self.files))
        return True

    def handshake_context(self) -> ssl.SSLContext:
        """A context to give ``ssl=`` once that serves each new handshake with the current
        context (files checked at most every ``interval_s``; SIGHUP applies at once)."""
        front = self._build()
        last = [time.monotonic()]

        def switch(conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any) -> None:
            now = time.monotonic()
            if now - last[0] >= self.interval_s:
                last[0] = now
                self.check()
            conn.context = self.current

        front.sni_callback = switch
        return front

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()


def reload_all() -> int:
    """Rebuild every live source now (SIGHUP); returns how many were replaced."""
    return sum(1 for source in list(_SOURCES) if source.check(force=True))
