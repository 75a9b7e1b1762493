"""Admin client settings: each default, what it is for and its valid values written once.

``AsyncAdminClient(namesrv, AdminConfig(timeout_s=10))``; BlockingAdminClient takes the
same object.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.client._settings import check_settings
from orbitmq.common.config import above, setting

__all__ = ["AdminConfig"]


@dataclass(frozen=True, slots=True)
class AdminConfig:
    timeout_s: float = setting(3.0, "Timeout of one request (NameServer or broker).", above(0))
    connect_timeout_s: float = setting(3.0, "Timeout of one connection attempt.", above(0))

    def __post_init__(self) -> None:
        check_settings(self, "admin")
