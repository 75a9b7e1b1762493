"""UPDATE_BROKER_CONFIG and GET_BROKER_CONFIG: the broker's typed allowlist of runtime settings.

RocketMQ's two worst CVEs came from this request: CVE-2023-33246 set ``rocketmqHome`` and
``filterServerNums`` and the broker started a shell script from there; CVE-2023-37582 set a
config path the server then wrote to. RocketMQ fixed them with a blocklist. OrbitMQ answers with
an allowlist, :data:`RUNTIME_KEYS`: a few settings that are safe to change live and that the
broker reads at request time, each parsed by its type and checked by the setting's own check.
Everything else (paths, hosts, ports, the store, TLS, auth, the cluster's identity) refuses the
whole request with NO_PERMISSION and nothing is applied; no setting names a file, a command or
a class, and nothing in OrbitMQ starts a process. The Guard asks Cluster Update for it (Get to
read), and the change goes to the audit log with before and after.

A change is applied by the controller's ``apply`` callback (it hands the new BrokerConfig to the
objects that read these settings); a restart returns to the configured values (nothing is
persisted, so nothing is written anywhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orbitmq.auth.audit import AuditLog
from orbitmq.broker.config import BrokerConfig
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ConfigError
from orbitmq.protocol.config_requests import format_properties, parse_properties
from orbitmq.protocol.frame import Frame

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low not in ("true", "false"):
        raise ValueError("must be true or false")
    return low == "true"


def _int(text: str) -> int:
    if not text.strip().lstrip("-").isdigit() or len(text) > 19:
        raise ValueError("must be an integer")
    return int(text)


RUNTIME_KEYS: dict[str, Callable[[str], object]] = {
    "auto_create_topic": _bool,
    "long_polling_max_ms": _int,
    "pop_max_inflight_per_group": _int,
    "enforce_topic_message_type": _bool,
}
"""setting -> parser of its text. Only these can change while the broker runs."""

ALIASES = {
    "autoCreateTopicEnable": "auto_create_topic",
    "longPollingMaxMs": "long_polling_max_ms",
}
"""RocketMQ's names of the same settings, accepted too."""


class RuntimeConfigProcessor:
    def __init__(
        self,
        config: Callable[[], BrokerConfig],
        apply: Callable[[BrokerConfig], None],
        audit: AuditLog,
    ) -> None:
        self._config = config
        self._apply = apply
        self.audit = audit

    def _values(self, config: BrokerConfig) -> dict[str, str]:
        out = {}
        for key in RUNTIME_KEYS:
            value = getattr(config, key)
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    async def get(self, frame: Frame, _conn: Connection) -> Frame:
        return frame.reply(
            ResponseCode.SUCCESS, body=format_properties(self._values(self._config()))
        )

    async def update(self, frame: Frame, conn: Connection) -> Frame:
        wanted = parse_properties(frame.body)
        current = self._config()
        changes: dict[str, Any] = {}  # values parsed per key by RUNTIME_KEYS
        for raw_key, text in wanted.items():
            key = ALIASES.get(raw_key, raw_key)
            parse = RUNTIME_KEYS.get(key)
            if parse is None:
                return self._refuse(frame, conn, raw_key, "cannot be changed at runtime")
            try:
                changes[key] = parse(text)
            except ValueError as exc:
                return self._refuse(frame, conn, raw_key, str(exc))
        try:
            new = dataclasses.replace(current, **changes)  # the settings' own checks run here
        except ConfigError as exc:
            return self._refuse(frame, conn, ",".join(changes), str(exc))
        self._apply(new)
        self.audit.admin(
            principal=str(frame.fields.get("AccessKey", "-")),
            source=str(getattr(conn, "peer", "?")),
            code=frame.code,
            resource="broker config",
            action="UPDATE_BROKER_CONFIG",
            result="done",
            before={k: v for k, v in self._values(current).items() if k in changes},
            after={k: v for k, v in self._values(new).items() if k in changes},
        )
        return frame.reply(ResponseCode.SUCCESS)

    def _refuse(self, frame: Frame, conn: Connection, key: str, why: str) -> Frame:
        reason = f"config key {key[:64]!r} {why}; nothing was changed"
        self.audit.admin(
            principal=str(frame.fields.get("AccessKey", "-")),
            source=str(getattr(conn, "peer", "?")),
            code=frame.code,
            resource="broker config",
            action="UPDATE_BROKER_CONFIG",
            result="refused",
            reason=reason,
        )
        return frame.reply(ResponseCode.NO_PERMISSION, reason)
