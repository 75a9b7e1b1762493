"""ListenerSettings: TLS and abuse-limit settings shared by every Remoting server's config.

``NamesrvConfig`` and ``BrokerConfig`` inherit these fields, so ``[namesrv]`` and ``[broker]``
each take ``tls_mode``, ``tls_cert_file`` ... and the limits, documented and checked like their
other settings. The broker's HA replication link uses the broker's certificate and CA (mutual
TLS whenever ``tls_client_auth`` asks for it). Why one base class rather than a ``[tls]``
table: each listener can have its own certificate and mode, and configs stay flat.

Nothing here is remotely mutable (file paths and TLS switches are never on the runtime
allowlist; see docs/security.md).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from orbitmq.common.config import above, at_least, one_of, setting
from orbitmq.common.errors import ConfigError
from orbitmq.net.limits import Limits
from orbitmq.net.tls import CLIENT_AUTH, TLS_MODES, ContextSource, client_context, server_context

_D = Limits()
ADMIN_TRANSPORTS = ("auto", "any", "tls", "mtls")


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    tls_mode: str = setting(
        "off",
        "TLS on this server's port: ``off``; ``permissive`` (TLS and plaintext on the same port, "
        "told apart by the first byte, RocketMQ's default); ``required`` (plaintext refused). "
        "TLS 1.2+ only.",
        one_of(*TLS_MODES),
    )
    tls_cert_file: str | None = setting(
        None, "PEM certificate chain this server shows (needed unless tls_mode is off)."
    )
    tls_key_file: str | None = setting(
        None, "PEM private key of tls_cert_file (None: the key is in tls_cert_file)."
    )
    tls_ca_file: str | None = setting(
        None,
        "PEM CA certificate(s): client certificates must chain to them (tls_client_auth), and "
        "outbound TLS connections verify servers against them (None: system roots).",
    )
    tls_client_auth: str = setting(
        "none",
        "Client certificates (mutual TLS): ``none``, ``optional`` (verified if shown) or "
        "``required`` (no certificate, no connection, before any application byte).",
        one_of(*CLIENT_AUTH),
    )
    tls_reload_interval_s: float = setting(
        0.5,
        "How often the certificate, key and CA files are checked for changes (SHA-256); a "
        "change (or SIGHUP) applies to new connections without a restart.",
        above(0),
    )
    tls_outbound: bool = setting(
        False,
        "Connect to NameServers and the HA master with TLS, verifying them against tls_ca_file "
        "and showing tls_cert_file as client certificate.",
    )
    metrics_tls: bool = setting(
        False,
        "Serve the Prometheus endpoint (metrics_port) over HTTPS with tls_cert_file, TLS 1.2+, "
        "asking for client certificates of tls_ca_file when tls_client_auth is required.",
    )
    admin_transport: str = setting(
        "auto",
        "Which connections may send admin requests (topic, group, offset, permission, config, "
        "user and ACL changes; config reads): ``any``; ``tls``; ``mtls`` (TLS with a verified "
        "client certificate); ``auto`` = ``tls`` whenever tls_mode is not off. Others get "
        "ADMIN_REQUIRES_TLS (1040).",
        one_of(*ADMIN_TRANSPORTS),
    )
    max_connections: int = setting(_D.max_connections, "Open connections at most.", at_least(1))
    max_connections_per_ip: int = setting(
        _D.max_connections_per_ip, "Open connections from one address at most.", at_least(1)
    )
    new_connections_per_ip_per_s: float = setting(
        _D.new_connections_per_ip_per_s,
        "New connections per second from one address (token bucket).",
        above(0),
    )
    limits_exempt_loopback: bool = setting(
        _D.exempt_loopback,
        "Connections from loopback skip the per-address caps (max_connections still applies).",
    )
    max_pending_requests: int = setting(
        _D.max_pending_requests,
        "Requests of one connection handled at once; beyond, reading pauses.",
        at_least(1),
    )
    max_pending_bytes: int = setting(
        _D.max_pending_bytes,
        "Request bytes of one connection being handled; beyond, reading pauses.",
        at_least(1),
    )
    handshake_timeout_s: float = setting(
        _D.handshake_timeout_s,
        "A new connection must send its first byte (and finish TLS) within this.",
        above(0),
    )
    frame_timeout_s: float = setting(
        _D.frame_timeout_s,
        "A frame whose first bytes came must be complete within this (slow clients).",
        above(0),
    )
    idle_timeout_s: float = setting(
        _D.idle_timeout_s,
        "A connection with no traffic and nothing pending this long is closed (0: never).",
        at_least(0),
    )

    def check_listener(self, table: str) -> None:
        """Cross-field checks; each subclass's ``__post_init__`` calls it."""
        if self.tls_mode != "off" and not self.tls_cert_file:
            raise ConfigError(f"{table}.tls_mode={self.tls_mode} needs {table}.tls_cert_file")
        if self.tls_client_auth != "none" and not self.tls_ca_file:
            raise ConfigError(f"{table}.tls_client_auth needs {table}.tls_ca_file")
        if self.metrics_tls and not self.tls_cert_file:
            raise ConfigError(f"{table}.metrics_tls needs {table}.tls_cert_file")
        if self.admin_transport in ("tls", "mtls") and self.tls_mode == "off":
            raise ConfigError(
                f"{table}.admin_transport={self.admin_transport} needs TLS: set "
                f"{table}.tls_mode (or admin_transport=any)"
            )
        if self.admin_transport == "mtls" and self.tls_client_auth == "none":
            raise ConfigError(
                f"{table}.admin_transport=mtls needs {table}.tls_client_auth optional or required"
            )
        if self.tls_client_auth != "none" and self.tls_mode == "permissive":
            raise ConfigError(
                f"{table}.tls_client_auth needs tls_mode=required: a plaintext client would "
                "bypass it"
            )

    def admin_transport_needed(self) -> str:
        """``any``, ``tls`` or ``mtls``: ``admin_transport`` with ``auto`` resolved."""
        if self.admin_transport == "auto":
            return "any" if self.tls_mode == "off" else "tls"
        return self.admin_transport

    def metrics_tls_options(self) -> dict[str, Any]:
        """Keyword arguments for prometheus_client's ``start_http_server`` (empty: plain)."""
        if not self.metrics_tls:
            return {}
        return {
            "certfile": self.tls_cert_file,
            "keyfile": self.tls_key_file,
            "client_cafile": self.tls_ca_file if self.tls_client_auth == "required" else None,
            "client_auth_required": self.tls_client_auth == "required",
            "tls_min_version": ssl.TLSVersion.TLSv1_2,
        }

    def limits(self) -> Limits:
        return Limits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            new_connections_per_ip_per_s=self.new_connections_per_ip_per_s,
            max_pending_requests=self.max_pending_requests,
            max_pending_bytes=self.max_pending_bytes,
            handshake_timeout_s=self.handshake_timeout_s,
            frame_timeout_s=self.frame_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            exempt_loopback=self.limits_exempt_loopback,
        )

    def tls_source(self) -> ContextSource | None:
        """The server context, reloaded when its files change (None: TLS off)."""
        if self.tls_mode == "off" or not self.tls_cert_file:
            return None
        cert, key, ca, auth = (
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_ca_file,
            self.tls_client_auth,
        )
        return ContextSource(
            lambda: server_context(cert, key, ca_file=ca, client_auth=auth),
            [cert, key or "", ca or ""],
            self.tls_reload_interval_s,
        )

    def ha_server_ssl(self) -> ssl.SSLContext | None:
        """The HA replication port's context: TLS whenever tls_mode is not off (the link has
        no legacy peers, so no permissive mode), mutual with tls_client_auth; a changed
        certificate, key or CA file (or SIGHUP) applies to the next handshake."""
        source = self.tls_source()
        return None if source is None else source.handshake_context()

    def ha_client_ssl(self) -> ssl.SSLContext | None:
        """A slave's context for its master's HA port (None: tls_mode off): verifies the
        master against tls_ca_file and shows tls_cert_file."""
        if self.tls_mode == "off":
            return None
        return client_context(
            ca_file=self.tls_ca_file, cert_file=self.tls_cert_file, key_file=self.tls_key_file
        )

    def outbound_ssl(self) -> ssl.SSLContext | None:
        """The context for this server's own connections to its peers (None: plaintext)."""
        if not self.tls_outbound:
            return None
        return client_context(
            ca_file=self.tls_ca_file, cert_file=self.tls_cert_file, key_file=self.tls_key_file
        )
