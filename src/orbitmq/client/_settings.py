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
from orbitmq.protocol.signature import Signer

__all__ = ["ClientConfigError", "check_settings", "signer_of"]


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
