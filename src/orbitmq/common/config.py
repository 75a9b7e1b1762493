"""Config fields documented and validated one way, as Kafka's ``ConfigDef`` does.

Every setting of a config dataclass (``BrokerConfig``, ``NamesrvConfig``, ``StoreConfig``,
``ProxyConfig``; the client's configs later) is declared with :func:`setting`: its default, one
sentence saying what it is for, and optionally a :class:`Check` of its valid values::

    port: int = setting(10911, "RocketMQ's broker port; 0 picks a free one.", between(0, 65535))

The class's ``__post_init__`` calls :func:`check_settings`, so a value out of range is a
:class:`~orbitmq.common.errors.ConfigError` naming the setting, whoever built the config (a TOML
file, an environment variable, a flag, a test); checks across fields stay in ``__post_init__``.
:func:`documented` gives (name, default, doc, valid values) for ``orbitmq config docs``, which
generates docs/configuration.md from these declarations and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orbitmq.common.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """A test of one setting's value and how the docs describe what passes it."""

    test: Callable[[Any], bool]
    describe: str
    """Shown in docs/configuration.md and in the error: ``must be <describe>``."""

    def __call__(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except TypeError:  # a value of the wrong type fails every check
            return False


def at_least(low: float) -> Check:
    return Check(lambda v: v >= low, f">= {low}")


def above(low: float) -> Check:
    return Check(lambda v: v > low, f"> {low}")


def between(low: float, high: float) -> Check:
    """``low <= value <= high``."""
    return Check(lambda v: low <= v <= high, f"{low}..{high}")


def one_of(*values: Any) -> Check:
    return Check(lambda v: v in values, "one of " + ", ".join(map(str, values)))


def non_empty() -> Check:
    return Check(lambda v: len(v) > 0, "not empty")


def optional(check: Check) -> Check:
    """None (the setting is off) or a value passing ``check``."""
    return Check(lambda v: v is None or check(v), f"{check.describe}, or none")


PORT = between(0, 65535)
"""A TCP port; 0 asks the OS for a free one."""


def setting(
    default: Any,
    doc: str,
    check: Check | None = None,
    *,
    factory: Callable[[], Any] | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field with its doc and check in the field's metadata. ``factory`` instead of
    ``default`` for mutable defaults (``factory=dict``). ``secret``: left out of ``repr`` (so a
    logged config never shows it) and masked by ``config show``."""
    metadata = {"doc": " ".join(doc.split()), "check": check, "secret": secret}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata, repr=not secret)
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


def check_settings(config: Any, table: str) -> None:
    """Raise ConfigError for the first field of ``config`` whose value fails its check."""
    for f in dataclasses.fields(config):
        check = f.metadata.get("check")
        if check is None:
            continue
        value = getattr(config, f.name)
        if not check(value):
            raise ConfigError(f"{table}.{f.name} = {value!r}: must be {check.describe}")


@dataclasses.dataclass(frozen=True, slots=True)
class SettingDoc:
    name: str
    default: Any
    doc: str
    valid: str
    """What the check accepts ("" if any value of the type)."""


def documented(cls: type) -> list[SettingDoc]:
    """Every setting of a config dataclass, in declaration order (nested configs excluded)."""
    out: list[SettingDoc] = []
    for f in dataclasses.fields(cls):
        if "doc" not in f.metadata:
            continue  # a nested config (BrokerConfig.store) is a table of its own
        factory = f.default_factory
        default = f.default if factory is dataclasses.MISSING else factory()
        check = f.metadata.get("check")
        out.append(SettingDoc(f.name, default, f.metadata["doc"], check.describe if check else ""))
    return out
