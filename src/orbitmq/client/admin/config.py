"""Admin client settings: each default, what it is for and its valid values written once.

``AsyncAdminClient(namesrv, AdminConfig(timeout_s=10))``; BlockingAdminClient takes the
same object.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.client._settings import check_settings
from orbitmq.common.config import above, one_of, setting

__all__ = ["AdminConfig"]


@dataclass(frozen=True, slots=True)
class AdminConfig:
    timeout_s: float = setting(3.0, "Timeout of one request (NameServer or broker).", above(0))
    connect_timeout_s: float = setting(3.0, "Timeout of one connection attempt.", above(0))

    access_key: str | None = setting(
        None, "User to sign every request with (servers with authentication on; docs/security.md)."
    )
    secret_key: str | None = setting(None, "That user's secret key (never logged).", secret=True)
    signature_version: int = setting(
        2,
        "2: OrbitMQ's HMAC-SHA256 with timestamp and nonce; 1: RocketMQ's HMAC-SHA1.",
        one_of(1, 2),
    )

    def __post_init__(self) -> None:
        check_settings(self, "admin")
