"""Effective configuration: defaults < TOML file < environment < command-line flags.

One TOML file can configure every component, one table each::

    [namesrv]
    port = 9876

    [broker]
    broker_name = "broker-a"
    namesrv_addrs = ["127.0.0.1:9876"]
    auto_create_topic = true

    [store]
    store_path = "orbitmq-data/broker-a"
    flush_disk_type = "SYNC_FLUSH"

    [proxy]
    port = 8081
    tls_mode = "required"

    [controller]
    port = 9878
    raft_port = 9880
    peers = ["10.0.0.1:9878/9880", "10.0.0.2:9878/9880", "10.0.0.3:9878/9880"]

Environment variables are ``ORBITMQ_<TABLE>_<FIELD>`` in upper case, e.g.
``ORBITMQ_BROKER_PORT=10921``, ``ORBITMQ_STORE_FLUSH_DISK_TYPE=SYNC_FLUSH`` or
``ORBITMQ_CONTROLLER_RAFT_SECRET=...``; list values are comma-separated, a table
(``proxy.access_keys``) is ``KEY:VALUE,KEY:VALUE``. Every value is checked against the field's
type; a wrong one is a ConfigError naming where it came from.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from orbitmq.broker.config import BrokerConfig
from orbitmq.common.config import documented
from orbitmq.common.errors import ConfigError
from orbitmq.console.config import ConsoleConfig
from orbitmq.controller.config import ControllerConfig
from orbitmq.kafka.config import KafkaConfig
from orbitmq.mqtt.config import MqttConfig
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.proxy.config import ProxyConfig, parse_access_keys
from orbitmq.store.config import StoreConfig

T = TypeVar("T")
ENV_PREFIX = "ORBITMQ_"
TABLES = ("namesrv", "broker", "store", "proxy", "controller", "kafka", "console", "mqtt")
SECRETS = frozenset(
    {
        "proxy.access_keys",
        "controller.raft_secret",
        "console.users",
        "console.secret",
        "broker.secret_key",
        "proxy.secret_key",
    }
)
"""Settings `config show` prints masked."""


@dataclass(frozen=True)
class Settings:
    namesrv: NamesrvConfig = field(default_factory=NamesrvConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """The gRPC proxy's settings: ``orbitmq proxy``'s, and those of the proxy ``orbitmq up`` and
    ``orbitmq broker --proxy-port`` run beside a broker (which takes the broker's NameServers,
    host and body limit for what the table does not set)."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    """The Kafka gateway's: ``orbitmq kafka``'s, and the one ``orbitmq up`` (port 9092) and
    ``orbitmq broker --kafka-port`` run beside a broker (which takes the broker's NameServers
    and host for what the table does not set)."""
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    """The web console's: ``orbitmq console``'s, and the one ``orbitmq up`` runs on 8088 (with
    the up's NameServer when the table does not name one)."""
    """``orbitmq controller``'s node, and the one ``orbitmq namesrv --controller`` runs beside
    its NameServer."""
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    """The MQTT gateway a broker process runs (docs/mqtt.md; port 0: none)."""
    sources: dict[str, str] = field(default_factory=dict)
    """"table.field" -> where its value came from (file, env, flag), for `config show`."""


def _coerce(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            return None
        return _coerce(value, options[0], where)
    if origin is Mapping:
        if isinstance(value, str):
            try:
                return parse_access_keys(p.strip() for p in value.split(",") if p.strip())
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {value!r} is not a table")
        return {str(k): _coerce(v, str, where) for k, v in value.items()}
    if origin is tuple:
        args = typing.get_args(typ)
        items: list[Any] = value.split(",") if isinstance(value, str) else list(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(
                _coerce(v.strip() if isinstance(v, str) else v, args[0], where)
                for v in items
                if v != ""
            )
        if len(items) != len(args):
            raise ConfigError(f"{where}: expected {len(args)} values, got {items!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(items, args, strict=True))
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if typ is Path:
            return Path(value)
        if isinstance(typ, type) and issubclass(typ, enum.Enum):
            return typ(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{where}: {value!r} is not a valid {getattr(typ, '__name__', typ)}"
        ) from exc
    raise ConfigError(f"{where}: unsupported setting type {typ}")


def _build(
    cls: type[T], values: Mapping[str, tuple[Any, str]], table: str, base: T | None = None
) -> T:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"[{table}] has no setting {', '.join(sorted(unknown))}")
    kwargs = {
        name: _coerce(v, hints[name], f"{table}.{name} ({src})")
        for name, (v, src) in values.items()
    }
    if base is not None:
        return dataclasses.replace(base, **kwargs)  # type: ignore[type-var]
    return cls(**kwargs)


def load_settings(
    config_file: Path | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    base: Settings | None = None,
) -> Settings:
    """Merge file, environment and flags (``{"broker": {"port": 10921}}``) over ``base``."""
    layers: dict[str, dict[str, tuple[Any, str]]] = {t: {} for t in TABLES}
    if config_file is not None:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{config_file}: {exc}") from exc
        for table, content in data.items():
            if table not in layers or not isinstance(content, dict):
                raise ConfigError(
                    f"{config_file}: unknown table [{table}] (known: {', '.join(TABLES)})"
                )
            for k, v in content.items():
                layers[table][k] = (v, str(config_file))
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX) :].lower()
        for table in TABLES:
            if rest.startswith(table + "_"):
                layers[table][rest[len(table) + 1 :]] = (value, f"env {key}")
    for table, content in (flags or {}).items():
        for k, v in content.items():
            if v is not None:
                layers[table][k] = (v, "flag")
    base = base or Settings()
    store = _build(StoreConfig, layers["store"], "store", base.broker.store)
    broker = _build(BrokerConfig, layers["broker"], "broker", base.broker)
    broker = dataclasses.replace(broker, store=store)
    namesrv = _build(NamesrvConfig, layers["namesrv"], "namesrv", base.namesrv)
    proxy = _build(ProxyConfig, layers["proxy"], "proxy", base.proxy)
    controller = _build(ControllerConfig, layers["controller"], "controller", base.controller)
    kafka = _build(KafkaConfig, layers["kafka"], "kafka", base.kafka)
    console = _build(ConsoleConfig, layers["console"], "console", base.console)
    mqtt = _build(MqttConfig, layers["mqtt"], "mqtt", base.mqtt)
    sources = {f"{t}.{k}": src for t in TABLES for k, (_v, src) in layers[t].items()}
    return Settings(
        namesrv=namesrv,
        broker=broker,
        proxy=proxy,
        controller=controller,
        kafka=kafka,
        console=console,
        mqtt=mqtt,
        sources=sources,
    )


def settings_rows(settings: Settings) -> list[tuple[str, str, str]]:
    """(name, value, source) for every setting: what `orbitmq config show` prints."""
    rows: list[tuple[str, str, str]] = []
    for table, obj in (
        ("namesrv", settings.namesrv),
        ("broker", settings.broker),
        ("store", settings.broker.store),
        ("proxy", settings.proxy),
        ("controller", settings.controller),
        ("kafka", settings.kafka),
        ("console", settings.console),
        ("mqtt", settings.mqtt),
    ):
        for f in fields(obj):
            if f.name == "store":
                continue
            value = getattr(obj, f.name)
            shown = value.value if isinstance(value, enum.Enum) else value
            key = f"{table}.{f.name}"
            if key in SECRETS and shown:
                masked = (f"{k}:***" for k in shown) if isinstance(shown, Mapping) else ["***"]
                shown = ", ".join(masked)
            rows.append(
                (
                    key,
                    repr(shown) if not isinstance(shown, str) else shown,
                    settings.sources.get(key, "default"),
                )
            )
    return rows


def _shown(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) if value else "(none)"
    if isinstance(value, Mapping):
        return ", ".join(map(str, value)) if value else "(none)"
    return str(value)


def settings_markdown() -> str:
    """docs/configuration.md, generated from the config classes' field declarations
    (:func:`orbitmq.common.config.setting`; `orbitmq config docs`)."""
    lines = [
        "# Configuration",
        "",
        "Every setting, its default and what it is for. Settings are read, in rising priority,",
        "from the defaults below, a TOML file (`--config`, one table per component), environment",
        "variables `ORBITMQ_<TABLE>_<FIELD>` and command-line flags; `orbitmq config show` prints",
        "the effective values and where each came from. A value outside its valid values is",
        "refused before anything starts, naming the setting and where it came from. Store",
        "settings keep RocketMQ's `MessageStoreConfig` names in snake_case where RocketMQ has them.",
        "",
        "Generated by `orbitmq config docs > docs/configuration.md`; a test keeps it current.",
        "",
    ]
    for table, cls in (
        ("namesrv", NamesrvConfig),
        ("broker", BrokerConfig),
        ("store", StoreConfig),
        ("proxy", ProxyConfig),
        ("controller", ControllerConfig),
        ("kafka", KafkaConfig),
        ("console", ConsoleConfig),
        ("mqtt", MqttConfig),
    ):
        lines += [
            f"## [{table}]",
            "",
            "| setting | default | valid values | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for d in documented(cls):
            valid = d.valid.replace("|", "\\|") or "any"
            doc = d.doc.replace("|", "\\|")
            lines.append(f"| `{d.name}` | `{_shown(d.default)}` | {valid} | {doc} |")
        lines.append("")
    return "\n".join(lines)
