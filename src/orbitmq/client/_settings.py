"""Client configs declare their fields with :mod:`orbitmq.common.config` and report bad values
as a ClientError.

A setting of ``ProducerConfig``, ``ConsumerConfig``, ... is declared with
:func:`orbitmq.common.config.setting` (default, one sentence of doc, a check of its valid
values), as the servers' configs are. :func:`check_settings` runs those checks when a config is
made; a value out of range raises :class:`ClientConfigError`, which is both the client's
ClientError (what the client always raised for a bad setting) and the common ConfigError.
"""

from __future__ import annotations

from typing import Any

from orbitmq.common import config as common
from orbitmq.common.errors import ClientError, ConfigError

__all__ = ["ClientConfigError", "check_settings"]


class ClientConfigError(ClientError, ConfigError):
    """A client setting is out of range."""


def check_settings(config: Any, kind: str) -> None:
    """ClientConfigError naming the first field of ``config`` whose value fails its check."""
    try:
        common.check_settings(config, kind)
    except ConfigError as exc:
        raise ClientConfigError(str(exc)) from None
