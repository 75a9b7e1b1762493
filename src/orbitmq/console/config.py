"""ConsoleConfig: the console's settings (the ``[console]`` table).

Loopback by default; writes (topic create/delete, test sends, offset resets, DLQ resends) and
message bodies can each be switched off; users are optional, the console's own
(``[console.users]``) or the cluster's ACL users (``acl_login``); with neither, anyone who
reaches the port is an admin, which is why the default bind is 127.0.0.1.

HTTPS (issue #16, "TLS on every listener"): off by default, since the default bind is loopback;
with ``tls_cert_file`` the port speaks HTTPS only (TLS 1.2+; a plaintext request gets no
answer), and with ``tls_ca_file`` too it asks every browser or tool for a client certificate
chaining to that CA (mutual TLS: none, no connection). A replaced certificate, key or CA file
is used by the next handshake, without a restart (``tls_source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orbitmq.common.config import PORT, at_least, non_empty, setting
from orbitmq.common.errors import ConfigError
from orbitmq.net.tls import ContextSource, server_context


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",), "NameServers of the cluster shown.", non_empty()
    )
    host: str = setting("127.0.0.1", "HTTP listen address (loopback unless you add users).")
    port: int = setting(8088, "HTTP port; 0 picks a free one.", PORT)
    allow_writes: bool = setting(
        True, "Topic create/delete, test sends, offset resets, DLQ resends (off: every POST 403)."
    )
    allow_message_bodies: bool = setting(
        True, "Show message bodies (off: no body byte reaches the browser)."
    )
    users: Mapping[str, str] = setting(
        None,
        "name -> 'role:pbkdf2_sha256$iterations$salt$hash' with role viewer or admin "
        "(`orbitmq console hash-password`); empty: no login, everyone is admin.",
        factory=dict,
    )
    acl_login: bool = setting(
        False,
        "Also log in the cluster's ACL users (docs/security.md) with their secret key, "
        "checked by a NameServer: a Super user is an admin, a Normal user a viewer.",
    )
    access_key: str | None = setting(
        None, "User the console signs its own requests with (a cluster with auth_enabled)."
    )
    secret_key: str | None = setting(None, "That user's secret key (never logged).", secret=True)
    secret: str | None = setting(
        None, "Key that signs session cookies and CSRF tokens (None: random per start)."
    )
    audit_log: str | None = setting(
        None, "JSON-lines file of every write (None: orbitmq-console-audit.jsonl in the cwd)."
    )
    tls_cert_file: str | None = setting(
        None, "PEM certificate chain to serve HTTPS with (None: plain HTTP, for loopback)."
    )
    tls_key_file: str | None = setting(
        None, "PEM private key of tls_cert_file (None: the key is in tls_cert_file)."
    )
    tls_ca_file: str | None = setting(
        None,
        "PEM CA certificate(s): with it, HTTPS requires a client certificate chaining to them "
        "(mutual TLS); needs tls_cert_file.",
    )
    poll_interval_ms: int = setting(1000, "How often lag and rates are sampled.", at_least(100))
    history_s: int = setting(900, "Seconds of samples kept for the charts.", at_least(10))

    def __post_init__(self) -> None:
        if (self.tls_key_file or self.tls_ca_file) and not self.tls_cert_file:
            raise ConfigError("console.tls_key_file and console.tls_ca_file need tls_cert_file")

    def tls_source(self) -> ContextSource | None:
        """The HTTPS server context (None: plain HTTP), rebuilt when the certificate, key or
        CA file changes: the same ``ContextSource`` the broker, NameServer and HA ports
        reload with (polled every 0.5 s by hash, and at once on SIGHUP)."""
        cert = self.tls_cert_file
        if not cert:
            return None
        key, ca = self.tls_key_file, self.tls_ca_file
        auth = "required" if ca else "none"
        return ContextSource(
            lambda: server_context(cert, key, ca_file=ca, client_auth=auth),
            [cert, key or "", ca or ""],
        )
