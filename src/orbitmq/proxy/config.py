"""ProxyConfig: the gRPC proxy's settings (the ``[proxy]`` table; each declared with
:func:`orbitmq.common.config.setting`, which documents and checks it).

Defaults follow the Java proxy (port 8081, 4 MiB bodies, long polling up to 20 s, 60 s invisible
time) so that an application moving from Apache RocketMQ sees the same behaviour; where OrbitMQ
is deliberately more lenient the field says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orbitmq.common.config import (
    PORT,
    above,
    at_least,
    check_settings,
    non_empty,
    one_of,
    optional,
    setting,
)
from orbitmq.common.errors import ConfigError
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE
from orbitmq.net.limits import Limits

_L = Limits()

GRPC_OVERHEAD = 256 * 1024
"""Room above the largest body for the rest of a SendMessageRequest (properties, ids, framing):
user properties are capped at 32 KiB encoded, so this is generous on purpose."""


def parse_access_keys(items: Iterable[str]) -> dict[str, str]:
    """``AK:SK`` pairs (the secret may itself contain ':') -> {access key: secret key}."""
    keys: dict[str, str] = {}
    for item in items:
        ak, sep, sk = item.partition(":")
        if not sep or not ak or not sk:
            raise ValueError(f"access key {item!r} is not AK:SK")
        keys[ak] = sk
    return keys


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",),
        "NameServers whose routes the proxy follows (it is a client of the brokers).",
        non_empty(),
    )
    host: str = setting(
        "127.0.0.1",
        'Address the gRPC server listens on ("0.0.0.0" for every interface).',
    )
    port: int = setting(
        8081,
        "gRPC port (the Java proxy's default); 0 picks a free one.",
        PORT,
    )
    reuse_port: bool = setting(
        False,
        "Listen with SO_REUSEPORT so several proxy processes share ``port`` (the kernel spreads "
        "client connections over them); set by ``orbitmq proxy --workers N``. Every process on "
        "the port must set it.",
    )
    tls_mode: str = setting(
        "permissive",
        "``permissive`` (the Java proxy's default): TLS and plaintext clients on the same port; "
        "``required``: TLS only; ``off``: plaintext only, with no splice in front of gRPC. See "
        ":mod:`orbitmq.proxy.tls`.",
        one_of("off", "permissive", "required"),
    )
    tls_cert_file: str | None = setting(
        None,
        "PEM certificate (chain) for TLS clients; with ``tls_key_file``. None: a self-signed "
        "certificate made at start-up (enough for clients that trust any, like the Java client).",
    )
    tls_key_file: str | None = setting(
        None,
        "PEM private key of tls_cert_file.",
    )
    tls_client_ca_file: str | None = setting(
        None,
        "Mutual TLS: PEM CA certificate(s); every TLS client must present a certificate they "
        "signed, and with acl_enabled a call without a signature is made by the user the "
        'certificate names (docs/security.md). Needs ``tls_mode="required"``, or '
        "``permissive`` with acl_enabled (plaintext clients must then sign). None: no client "
        "certificate is asked for.",
    )
    acl_enabled: bool = setting(
        False,
        "Verify the MQv2-HMAC-SHA1 Authorization header of every call (off: anonymous allowed).",
    )
    access_keys: Mapping[str, str] = setting(
        None,
        "access key -> secret key, used when acl_enabled (TOML: a table; env: AK:SK,AK2:SK2).",
        factory=dict,
    )
    auth_file: str | None = setting(
        None,
        "The users-and-ACLs file the brokers and NameServers use (docs/security.md): with "
        "acl_enabled, a call's access key is a user of it and each RPC is authorized by the "
        "user's ACL (FORBIDDEN otherwise); access_keys is then not needed.",
    )
    audit_file: str | None = setting(
        None, "The hash-chained audit log of refused calls (None: the orbitmq.audit log only)."
    )
    access_key: str | None = setting(
        None,
        "The user the proxy signs its own requests to brokers and NameServers with (their "
        "authentication on): an inner user allowed what the proxy relays.",
    )
    secret_key: str | None = setting(
        None, "That user's secret (or ORBITMQ_PROXY_SECRET_KEY).", secret=True
    )
    max_message_size: int = setting(
        DEFAULT_MAX_MESSAGE_SIZE,
        "Largest body accepted; advertised to clients as ``publishing.max_body_size``. Keep it "
        "equal to the brokers' ``max_message_size``.",
        at_least(1),
    )
    max_delay_s: float = setting(
        40 * 24 * 3600.0,
        "Furthest ``delivery_timestamp`` accepted (the brokers' timer_max_delay_ms default); "
        "beyond it ILLEGAL_DELIVERY_TIME. Also what catches a client putting milliseconds where "
        "seconds belong.",
        above(0),
    )
    send_timeout_s: float = setting(
        3.0,
        "Budget of one send to the brokers, retries included (the clients' own deadline is 3 s).",
        above(0),
    )
    send_batches_in_flight: int = setting(
        2,
        "Batches of sends of one topic to the brokers awaiting an answer at once. Sends of "
        "concurrent calls that arrive meanwhile wait in one open batch and leave together when "
        "an answer comes (without a bound each call would be its own broker request): fewer, "
        "larger requests under load, no wait for a lone send.",
        at_least(1),
    )
    send_linger_ms: float = setting(
        3.0,
        "While a batch of a topic's sends awaits the brokers' answer, how long the next sends "
        "of that topic wait to leave together (0: only until an answer comes). A send while "
        "none of its topic is in flight never waits. Larger broker requests under load: "
        "fewer frames per message for the proxy and the broker (docs/benchmarks.md).",
        at_least(0),
    )
    send_max_attempts: int = setting(
        3,
        "Advertised in the settings as the clients' send retry policy (Java proxy: 3).",
        at_least(1),
    )
    long_polling_default_s: float = setting(
        20.0,
        "Long-polling time for a ReceiveMessage that names none, and advertised to push consumers.",
        above(0),
    )
    long_polling_max_s: float = setting(
        20.0,
        "Longest a ReceiveMessage is held (longer requests are clamped, not refused).",
        above(0),
    )
    invisible_default_s: float = setting(
        60.0,
        "Invisible time of a received message when the request gives none (push consumers).",
        above(0),
    )
    invisible_min_s: float = setting(
        1.0,
        "Shortest invisible time accepted (Java: 10 s for simple consumers; OrbitMQ is lenient).",
        above(0),
    )
    invisible_max_s: float = setting(
        12 * 3600.0,
        "Longest invisible time accepted (Java proxy: 12 h).",
        above(0),
    )
    receive_batch_max: int = setting(
        32,
        "Most messages one ReceiveMessage returns.",
        at_least(1),
    )
    auto_renew_max_s: float = setting(
        3 * 3600.0,
        "How long an auto-renewed (push consumer) message stays invisible at most.",
        above(0),
    )
    auto_renew_period_s: float = setting(
        5.0,
        "How often the proxy looks for auto-renewed messages to extend (Java proxy: 5 s).",
        above(0),
    )
    auto_renew_ahead_s: float = setting(
        10.0,
        "A held message is extended when its invisible time ends within this (Java proxy: 10 s).",
        at_least(0),
    )
    retry_max_attempts: int = setting(
        17,
        "Delivery attempts before a message goes to the DLQ (RocketMQ: 16 retries + 1).",
        at_least(1),
    )
    transaction_heartbeat_s: float = setting(
        10.0,
        "How often the proxy tells brokers it stands for the transactional producers it served, "
        "so their check-backs reach it.",
        above(0),
    )
    member_heartbeat_s: float = setting(
        10.0,
        "How often the proxy beats to the brokers for each gRPC consumer, so the brokers list it"
        " as a member of its group (native consumers beat every 10 s; brokers expire after 120 "
        "s).",
        above(0),
    )
    metrics_port: int | None = setting(
        None,
        "Prometheus endpoint port on ``host`` (None: off; 0: a free port): the RocketMQ proxy "
        "metrics (docs/console.md#metrics).",
        optional(PORT),
    )
    cluster: str = setting(
        "DefaultCluster", "The ``cluster`` label of the proxy's metrics.", non_empty()
    )
    produce_quota_bytes_per_s: float | None = setting(
        None,
        "Byte-rate quota per client (its access key with ACL on, else its IP address) for the "
        "bodies SendMessage carries; over it, the response is delayed (Kafka's model). None: "
        "no quota.",
        optional(above(0)),
    )
    fetch_quota_bytes_per_s: float | None = setting(
        None,
        "The same for the message bodies ReceiveMessage and PullMessage return. None: no quota.",
        optional(above(0)),
    )
    max_connections: int = setting(
        _L.max_connections,
        "Open client connections at most (the front port: always with tls_mode permissive; "
        "with required or off only when limit_connections is on).",
        at_least(1),
    )
    max_connections_per_ip: int = setting(
        _L.max_connections_per_ip, "Open connections from one address at most.", at_least(1)
    )
    new_connections_per_ip_per_s: float = setting(
        _L.new_connections_per_ip_per_s,
        "New connections per second from one address (token bucket).",
        above(0),
    )
    limits_exempt_loopback: bool = setting(
        _L.exempt_loopback,
        "Connections from loopback skip the per-address caps (max_connections still applies).",
    )
    limit_connections: bool = setting(
        False,
        "With tls_mode off or required, put the front port (which counts and caps "
        "connections) before gRPC too; it relays every byte (spliced in the kernel where "
        "os.splice exists), so it is off by default: gRPC then binds the port itself (with its "
        "own TLS in required mode). Permissive mode always has it (it picks TLS or plaintext).",
    )
    telemetry_idle_s: float = setting(
        0.0,
        "Reserved: 0 keeps Telemetry streams open as long as the client wants (they live a year).",
        at_least(0),
    )

    def __post_init__(self) -> None:
        check_settings(self, "proxy")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("proxy.tls_cert_file and proxy.tls_key_file go together")
        if self.long_polling_default_s > self.long_polling_max_s:
            raise ConfigError("proxy.long_polling_default_s must not exceed long_polling_max_s")
        if not self.invisible_min_s <= self.invisible_default_s <= self.invisible_max_s:
            raise ConfigError(
                "proxy invisible times must satisfy min <= default <= max "
                "(invisible_min_s, invisible_default_s, invisible_max_s)"
            )
        if self.tls_client_ca_file is not None and self.tls_mode == "off":
            raise ConfigError(
                "tls_client_ca_file (mutual TLS) needs tls_mode=required or permissive"
            )
        if (
            self.tls_client_ca_file is not None
            and self.tls_mode == "permissive"
            and not self.acl_enabled
        ):
            # With ACL on, a plaintext client must sign every call instead.
            raise ConfigError(
                "tls_client_ca_file (mutual TLS) needs tls_mode=required, or permissive with "
                "acl_enabled: plaintext clients would bypass the client certificate check"
            )
        if self.acl_enabled and not self.access_keys and not self.auth_file:
            raise ConfigError("acl_enabled needs an auth_file or at least one access key")

    def limits(self) -> Limits:
        """The connection caps of the front port (orbitmq.net.limits)."""
        return Limits(
            max_connections=self.max_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            new_connections_per_ip_per_s=self.new_connections_per_ip_per_s,
            exempt_loopback=self.limits_exempt_loopback,
        )

    @property
    def grpc_max_receive_bytes(self) -> int:
        """gRPC's receive limit: the largest body plus the rest of a request (gRPC's own default,
        4 MiB, would refuse a 4 MiB body)."""
        return self.max_message_size + GRPC_OVERHEAD
