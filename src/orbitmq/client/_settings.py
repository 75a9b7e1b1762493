"""Client configs declare their fields with :mod:`orbitmq.common.config` and report bad values
as a ClientError; every client constructor takes its config object, keyword overrides of its
fields, or both.

A setting of ``ProducerConfig``, ``ConsumerConfig``, ... is declared with
:func:`orbitmq.common.config.setting` (default, one sentence of doc, a check of its valid
values), as the servers' configs are. :func:`check_settings` runs those checks when a config is
made; a value out of range raises :class:`ClientConfigError`, which is both the client's
ClientError (what the client always raised for a bad setting) and the common ConfigError.

:func:`resolve_config` is how a constructor turns ``config=`` plus ``**overrides`` into the one
config it uses: wave 1's clients took their settings as keywords (``AsyncProducer(ns,
linger_ms=0)``), and code written for them keeps working. Overrides go through the same checks
(the config is rebuilt), and a keyword that names no field is a TypeError naming it, as a
misspelled keyword argument is in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from orbitmq.common import config as common
from orbitmq.common.errors import ClientError, ConfigError
from orbitmq.protocol.signature import Signer

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ClientConfigError", "check_settings", "resolve_config", "signer_of"]

C = TypeVar("C", bound="DataclassInstance")


class ClientConfigError(ClientError, ConfigError):
    """A client setting is out of range."""


def check_settings(config: Any, kind: str) -> None:
    """ClientConfigError naming the first field of ``config`` whose value fails its check."""
    try:
        common.check_settings(config, kind)
    except ConfigError as exc:
        raise ClientConfigError(str(exc)) from None


def signer_of(config: Any) -> Signer | None:
    """The request signer of a client config's ``access_key``/``secret_key`` (None: unsigned)."""
    access_key = getattr(config, "access_key", None)
    if not access_key:
        return None
    secret = getattr(config, "secret_key", None)
    if not secret:
        raise ClientConfigError(f"{type(config).__name__}.access_key is set without a secret_key")
    return Signer(access_key, secret, version=getattr(config, "signature_version", 2))


def resolve_config(
    cls: type[C], config: C | None, overrides: Mapping[str, Any], owner: str = ""
) -> C:
    """``config`` (default: ``cls()``) with the fields named in ``overrides`` replaced.

    ClientError when ``config`` is not a ``cls``; TypeError naming the first keyword that is not
    a field of ``cls`` (``owner``, the constructor's class name, says whose keyword it was);
    ClientConfigError when a value fails its field's check.
    """
    if config is not None and not isinstance(config, cls):
        raise ClientError(f"config must be a {cls.__name__}, not {type(config).__name__}")
    if not overrides:
        return cls() if config is None else config
    names = {f.name for f in dataclasses.fields(cls)}
    for key in overrides:
        if key not in names:
            who = f"{owner}() got" if owner else "got"
            raise TypeError(
                f"{who} an unexpected keyword argument {key!r} (not a {cls.__name__} field)"
            )
    if config is None:
        return cls(**overrides)
    return dataclasses.replace(config, **overrides)
