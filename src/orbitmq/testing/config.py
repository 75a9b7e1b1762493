"""Configurations for tests: small store files, brokers on free ports, TOML for processes.

One definition of "a small store" for every test (they used to define it seven times): the
sizes below, any of which a test overrides (a test that wants files to roll every few records
says so with its own numbers).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orbitmq.broker.config import BrokerConfig
from orbitmq.store.config import StoreConfig

MiB = 1024 * 1024

SMALL_STORE: Mapping[str, Any] = {
    "mapped_file_size_commit_log": 8 * MiB,
    "max_message_size": 1 * MiB,
    "consume_queue_entries_per_file": 1024,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
}
"""The sizes of a small store: 8 MiB CommitLog segments, 1 MiB bodies, 20 KiB ConsumeQueue
files, 20 KiB + 80 KiB IndexFiles."""


def small_store_config(path: Path, **overrides: Any) -> StoreConfig:
    """A StoreConfig at ``path`` with :data:`SMALL_STORE` sizes, then ``overrides``."""
    options: dict[str, Any] = dict(SMALL_STORE)
    options.update(overrides)
    return StoreConfig(store_path=path, **options)


def small_broker_config(path: Path, **overrides: Any) -> BrokerConfig:
    """A broker for a test: a free port, no NameServer, topics created on first send, a
    re-registration every 0.5 s and a small store at ``path``. ``store={...}`` overrides store
    settings, any other keyword a broker setting."""
    store = small_store_config(path, **overrides.pop("store", {}))
    options: dict[str, Any] = {
        "port": 0,
        "namesrv_addrs": (),
        "auto_create_topic": True,
        "register_interval_s": 0.5,
        "store": store,
    }
    options.update(overrides)
    return BrokerConfig(**options)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, enum.Enum):
        return _toml_value(value.value)
    if isinstance(value, str | Path):
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{"
            + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
            + "}"
        )
    raise TypeError(f"no TOML form for {value!r}")


def settings_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """``{"broker": {"port": 0}, "store": {...}}`` as the TOML text ``--config`` reads."""
    lines: list[str] = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)
