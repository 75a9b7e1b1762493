"""KafkaConfig: the Kafka gateway's settings (the ``[kafka]`` table).

Defaults follow Apache Kafka's where a Kafka client would notice (port 9092, 100 MiB requests,
session timeouts 6 s - 30 min); the initial rebalance delay is shorter than Kafka's 3 s so a
single consumer starts at once.

Security (docs/kafka.md#security): ``tls_*`` as on the MQTT gateway (``off`` / ``permissive`` /
``required``, mutual TLS, certificates reloaded on change or SIGHUP); ``auth_enabled`` asks every
client to authenticate with SASL (PLAIN, SCRAM-SHA-256/512) as an ACL user of ``auth_file`` (the
brokers' users) and authorizes every request by that user's policies; ``access_key`` is who the
gateway itself is toward brokers that authenticate.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.auth.scram import HASHES
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
from orbitmq.net.tls import CLIENT_AUTH, TLS_MODES, ContextSource, server_context

MECHANISMS = ("PLAIN", *HASHES)
"""The SASL mechanisms the listener can offer."""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",),
        "NameServers whose routes the gateway follows (it is a client of the brokers).",
        non_empty(),
    )
    host: str = setting("127.0.0.1", 'Listen address ("0.0.0.0" for every interface).')
    port: int = setting(9092, "Kafka listener port; 0 picks a free one.", PORT)
    advertised_host: str | None = setting(
        None,
        "Host clients are told to connect to (Metadata); None: the listen host. Set it when "
        "clients reach the gateway through another name (a wrong one is the classic 'bootstraps, "
        "then hangs').",
    )
    advertised_port: int | None = setting(None, "Port clients are told; None: the bound port.")
    node_id: int = setting(0, "This gateway's Kafka node id.", at_least(0))
    cluster_id: str = setting("orbitmq", "Cluster id reported in Metadata.", non_empty())
    auto_create_topics: bool = setting(
        True,
        "Create a topic a producer's Metadata asks for when it does not exist (Kafka's "
        "auto.create.topics.enable).",
    )
    default_partitions: int = setting(
        4, "Queues of a topic created automatically or with num_partitions -1.", at_least(1)
    )
    max_request_bytes: int = setting(
        100 * 1024 * 1024,
        "Largest request frame (Kafka's socket.request.max.bytes).",
        at_least(1024),
    )
    group_min_session_timeout_ms: int = setting(6000, "Smallest session timeout a member may ask.")
    group_max_session_timeout_ms: int = setting(
        1_800_000, "Largest session timeout a member may ask."
    )
    group_initial_rebalance_delay_ms: int = setting(
        300,
        "How long the first rebalance of an empty group waits for more members (Kafka: 3000).",
        at_least(0),
    )
    max_inflight_produce: int = setting(
        5,
        "Produce requests of one connection worked on at once (librdkafka sends up to "
        "max.in.flight=5); answers still go out in request order and each partition's batches "
        "are appended in request order. 1: one at a time, as before.",
        at_least(1),
    )
    idempotence_scan: int = setting(
        64,
        "Messages read back from a queue's end to rebuild an idempotent producer's last batches "
        "after a restart.",
        at_least(5),
    )
    tls_mode: str = setting(
        "off",
        "TLS of the Kafka listener, as on the other listeners: ``off`` (plaintext: PLAINTEXT / "
        "SASL_PLAINTEXT clients); ``permissive`` (TLS and plaintext on the one port, told apart "
        "by the first byte); ``required`` (SSL / SASL_SSL only: a plaintext connection is closed "
        "before any Kafka byte is read). TLS 1.2+.",
        one_of(*TLS_MODES),
    )
    tls_cert_file: str | None = setting(
        None, "PEM certificate chain the listener shows (needed unless tls_mode is off)."
    )
    tls_key_file: str | None = setting(
        None, "PEM private key of tls_cert_file (None: the key is in tls_cert_file)."
    )
    tls_ca_file: str | None = setting(
        None, "PEM CA certificate(s) client certificates must chain to (tls_client_auth)."
    )
    tls_client_auth: str = setting(
        "none",
        "Client certificates (Kafka's ssl.client.auth): ``none``, ``optional`` (verified if "
        "shown) or ``required`` (no certificate, no connection). With auth_enabled, a verified "
        "certificate's principal (first DNS/URI subjectAltName, else CN) that names an enabled "
        "ACL user authenticates the connection without SASL (Kafka's SSL principal).",
        one_of(*CLIENT_AUTH),
    )
    tls_reload_interval_s: float = setting(
        0.5,
        "How often the certificate, key and CA files are checked for changes (SHA-256); a "
        "change (or SIGHUP) applies to new connections without a restart.",
        above(0),
    )
    auth_enabled: bool = setting(
        False,
        "Authenticate every connection with SASL against the ACL users of auth_file (user name "
        "= the user, password = its secret key) and authorize every request by the user's "
        "policies (docs/kafka.md#security). Before authentication only ApiVersions, "
        "SaslHandshake and SaslAuthenticate are served.",
    )
    sasl_mechanisms: tuple[str, ...] = setting(
        MECHANISMS,
        "SASL mechanisms offered (Kafka's sasl.enabled.mechanisms), of PLAIN, SCRAM-SHA-256 and "
        "SCRAM-SHA-512. PLAIN sends the secret itself: use it over TLS.",
        non_empty(),
    )
    auth_file: str | None = setting(
        None,
        "The users-and-ACLs file the brokers and NameServers use (docs/security.md); needed by "
        "auth_enabled. Re-read when it changes: a revoked user is refused within a second.",
    )
    audit_file: str | None = setting(
        None,
        "The hash-chained audit log of refused Kafka requests (None: the orbitmq.audit log only).",
    )
    access_key: str | None = setting(
        None,
        "The user the gateway signs its own requests to brokers and NameServers with (their "
        "authentication on): an inner user allowed what the gateway relays.",
    )
    secret_key: str | None = setting(
        None, "That user's secret (or ORBITMQ_KAFKA_SECRET_KEY).", secret=True
    )
    produce_quota_bytes_per_s: float | None = setting(
        None,
        "Byte-rate quota per Kafka user (its SASL or certificate user, else its IP address) for "
        "the Produce requests it sends; over it, the answer carries throttle_time_ms and is held "
        "that long (Kafka's quota model). None: no quota.",
        optional(above(0)),
    )
    fetch_quota_bytes_per_s: float | None = setting(
        None,
        "The same for the Fetch answers a user receives. None: no quota.",
        optional(above(0)),
    )

    def __post_init__(self) -> None:
        check_settings(self, "kafka")
        if self.tls_mode != "off" and not self.tls_cert_file:
            raise ConfigError(f"kafka.tls_mode={self.tls_mode} needs kafka.tls_cert_file")
        if self.tls_client_auth != "none" and not self.tls_ca_file:
            raise ConfigError("kafka.tls_client_auth needs kafka.tls_ca_file")
        if self.tls_client_auth == "required" and self.tls_mode == "permissive":
            raise ConfigError(
                "kafka.tls_client_auth=required needs tls_mode=required: a plaintext client "
                "would bypass it"
            )
        if self.auth_enabled and not self.auth_file:
            raise ConfigError("kafka.auth_enabled needs kafka.auth_file (the ACL users)")
        unknown = [m for m in self.sasl_mechanisms if m not in MECHANISMS]
        if unknown:
            raise ConfigError(f"kafka.sasl_mechanisms: {unknown} not of {list(MECHANISMS)}")

    def tls_source(self) -> ContextSource | None:
        """The listener's server context, rebuilt when its files change (None: TLS off)."""
        if self.tls_mode == "off" or not self.tls_cert_file:
            return None
        cert, key, ca, auth = (
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_client_auth
        )  # fmt: skip
        return ContextSource(
            lambda: server_context(cert, key, ca_file=ca, client_auth=auth),
            [cert, key or "", ca or ""],
            self.tls_reload_interval_s,
        )
