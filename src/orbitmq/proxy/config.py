"""ProxyConfig: the gRPC proxy's settings.

Defaults follow the Java proxy (port 8081, 4 MiB bodies, long polling up to 20 s, 60 s invisible
time) so that an application moving from Apache RocketMQ sees the same behaviour; where OrbitMQ
is deliberately more lenient the field says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orbitmq.common.errors import ConfigError
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE

GRPC_OVERHEAD = 256 * 1024
"""Room above the largest body for the rest of a SendMessageRequest (properties, ids, framing):
user properties are capped at 32 KiB encoded, so this is generous on purpose."""


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    namesrv_addrs: tuple[str, ...] = ("127.0.0.1:9876",)
    """NameServers whose routes the proxy follows (it is a client of the brokers)."""
    host: str = "127.0.0.1"
    """Address the gRPC server listens on ("0.0.0.0" for every interface)."""
    port: int = 8081
    """gRPC port (the Java proxy's default); 0 picks a free one."""
    tls_mode: str = "permissive"
    """``permissive`` (the Java proxy's default): TLS and plaintext clients on the same port;
    ``required``: TLS only; ``off``: plaintext only, with no splice in front of gRPC. See
    :mod:`orbitmq.proxy.tls`."""
    tls_cert_file: str | None = None
    """PEM certificate (chain) for TLS clients; with ``tls_key_file``. None: a self-signed
    certificate made at start-up (enough for clients that trust any, like the Java client)."""
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    """Mutual TLS: PEM CA certificate(s); every client must present a certificate they signed.
    Needs ``tls_mode="required"`` (a plaintext client would bypass it). None: no client
    certificate is asked for."""
    acl_enabled: bool = False
    """Verify the MQv2-HMAC-SHA1 Authorization header of every call (off: anonymous allowed)."""
    access_keys: Mapping[str, str] = field(default_factory=dict)
    """access key -> secret key, used when ``acl_enabled``."""
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    """Largest body accepted; advertised to clients as ``publishing.max_body_size``. Keep it equal
    to the brokers' ``max_message_size``."""
    max_delay_s: float = 40 * 24 * 3600.0
    """Furthest ``delivery_timestamp`` accepted (the brokers' timer_max_delay_ms default); beyond it
    ILLEGAL_DELIVERY_TIME. Also what catches a client putting milliseconds where seconds belong."""
    send_timeout_s: float = 3.0
    """Budget of one send to the brokers, retries included (the clients' own deadline is 3 s)."""
    send_max_attempts: int = 3
    """Advertised in the settings as the clients' send retry policy (Java proxy: 3)."""
    long_polling_default_s: float = 20.0
    """Long-polling time for a ReceiveMessage that names none, and advertised to push consumers."""
    long_polling_max_s: float = 20.0
    """Longest a ReceiveMessage is held (longer requests are clamped, not refused)."""
    invisible_default_s: float = 60.0
    """Invisible time of a received message when the request gives none (push consumers)."""
    invisible_min_s: float = 1.0
    """Shortest invisible time accepted (Java: 10 s for simple consumers; OrbitMQ is lenient)."""
    invisible_max_s: float = 12 * 3600.0
    receive_batch_max: int = 32
    """Most messages one ReceiveMessage returns."""
    auto_renew_max_s: float = 3 * 3600.0
    """How long an auto-renewed (push consumer) message stays invisible at most."""
    auto_renew_period_s: float = 5.0
    """How often the proxy looks for auto-renewed messages to extend (Java proxy: 5 s)."""
    auto_renew_ahead_s: float = 10.0
    """A held message is extended when its invisible time ends within this (Java proxy: 10 s)."""
    retry_max_attempts: int = 17
    """Delivery attempts before a message goes to the DLQ (RocketMQ: 16 retries + 1)."""
    transaction_heartbeat_s: float = 10.0
    """How often the proxy tells brokers it stands for the transactional producers it served, so
    their check-backs reach it."""
    member_heartbeat_s: float = 10.0
    """How often the proxy beats to the brokers for each gRPC consumer, so the brokers list it as
    a member of its group (native consumers beat every 10 s; brokers expire after 120 s)."""
    telemetry_idle_s: float = 0.0
    """Reserved: 0 keeps Telemetry streams open as long as the client wants (they live a year)."""

    def __post_init__(self) -> None:
        checks = {
            "port": 0 <= self.port <= 65535,
            "tls_mode": self.tls_mode in ("off", "permissive", "required"),
            "tls_cert_file/tls_key_file": (self.tls_cert_file is None)
            == (self.tls_key_file is None),
            "max_message_size": self.max_message_size >= 1,
            "max_delay_s": self.max_delay_s > 0,
            "send_timeout_s": self.send_timeout_s > 0,
            "send_max_attempts": self.send_max_attempts >= 1,
            "long_polling_default_s": 0 < self.long_polling_default_s <= self.long_polling_max_s,
            "invisible": 0
            < self.invisible_min_s
            <= self.invisible_default_s
            <= self.invisible_max_s,
            "auto_renew_period_s": self.auto_renew_period_s > 0,
            "auto_renew_ahead_s": self.auto_renew_ahead_s >= 0,
            "receive_batch_max": self.receive_batch_max >= 1,
            "retry_max_attempts": self.retry_max_attempts >= 1,
            "transaction_heartbeat_s": self.transaction_heartbeat_s > 0,
            "member_heartbeat_s": self.member_heartbeat_s > 0,
            "namesrv_addrs": bool(self.namesrv_addrs),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"proxy setting out of range: {', '.join(bad)}")
        if self.tls_client_ca_file is not None and self.tls_mode != "required":
            raise ConfigError(
                "tls_client_ca_file (mutual TLS) needs tls_mode=required: "
                "plaintext clients would bypass the client certificate check"
            )
        if self.acl_enabled and not self.access_keys:
            raise ConfigError("acl_enabled needs at least one access key")

    @property
    def grpc_max_receive_bytes(self) -> int:
        """gRPC's receive limit: the largest body plus the rest of a request (gRPC's own default,
        4 MiB, would refuse a 4 MiB body)."""
        return self.max_message_size + GRPC_OVERHEAD
