"""NamesrvConfig: the NameServer's settings (the ``[namesrv]`` table; declared with
:func:`orbitmq.common.config.setting`, which documents and checks each one)."""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.config import PORT, above, check_settings, optional, setting
from orbitmq.common.errors import ConfigError
from orbitmq.net.settings import ListenerSettings


@dataclass(frozen=True, slots=True)
class NamesrvConfig(ListenerSettings):
    host: str = setting(
        "127.0.0.1",
        "Address to listen on (tests and `make up` use loopback).",
    )
    port: int = setting(
        9876,
        "RocketMQ's NameServer port; 0 picks a free one.",
        PORT,
    )
    broker_channel_expired_s: float = setting(
        120.0,
        "A broker that has not registered for this long is removed from the routes.",
        above(0),
    )
    scan_not_active_broker_interval_s: float = setting(
        5.0,
        "How often expired brokers are looked for.",
        above(0),
    )
    metrics_port: int | None = setting(
        None,
        "Prometheus endpoint port (None: off; 0: a free port).",
        optional(PORT),
    )
    auth_enabled: bool = setting(
        False,
        "Every request must be signed by a user (AK/SK) or come with a client certificate, and "
        "is authorized by that user's ACL (brokers register with Cluster Update).",
    )
    auth_file: str | None = setting(
        None,
        "The users-and-ACLs file shared with the brokers (required when auth_enabled).",
    )
    audit_file: str | None = setting(
        None,
        "The hash-chained audit log of admin changes and refusals (None: the log only).",
    )
    auth_controller_addrs: tuple[str, ...] = setting(
        (),
        """Controller nodes ("host:port") whose replicated users and ACLs this NameServer
        follows (`auth_store = "raft"` there), signing as access_key; auth_file then caches
        them. Empty: the auth_file store.""",
    )
    access_key: str | None = setting(
        None, "The user this NameServer signs its requests to controllers with."
    )
    secret_key: str | None = setting(
        None,
        "That user's secret (keep the config file private; or ORBITMQ_NAMESRV_SECRET_KEY).",
        secret=True,
    )
    cluster: str = setting(
        "DefaultCluster",
        "The cluster name Cluster resources of this NameServer's admin requests are checked on.",
    )

    def __post_init__(self) -> None:
        check_settings(self, "namesrv")
        if self.auth_enabled and not self.auth_file:
            raise ConfigError("namesrv.auth_enabled needs namesrv.auth_file (the users and ACLs)")
        self.check_listener("namesrv")
