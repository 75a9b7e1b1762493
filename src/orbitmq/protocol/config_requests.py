"""Runtime configuration requests (RocketMQ's UPDATE/GET_BROKER_CONFIG, UPDATE/GET_NAMESRV_CONFIG)
and the strict decoder of their body.

The body is RocketMQ's: ``key=value`` lines (Java properties, without escapes or
continuations). It is decoded strictly: UTF-8, at most ``MAX_CONFIG_BODY`` bytes and
``MAX_CONFIG_KEYS`` lines, a key of ``[A-Za-z0-9_.]``, no key twice. What a key may be set to is
the server's allowlist (docs/security.md, "Safe admin surface"): a key not on it refuses the
whole request and nothing is applied; a path, a command, a host or a class is never on it.
"""

from __future__ import annotations

import re
from typing import ClassVar

from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError
from orbitmq.protocol.header import Header

MAX_CONFIG_BODY = 16 * 1024
MAX_CONFIG_KEYS = 64
_KEY = re.compile(r"[A-Za-z0-9_.]{1,64}")
CONFIG = "config"


def parse_properties(body: bytes | bytearray | memoryview) -> dict[str, str]:
    """``key=value`` lines -> dict; FieldError (MESSAGE_ILLEGAL) when malformed."""
    data = bytes(body)
    if len(data) > MAX_CONFIG_BODY:
        raise FieldError(f"config body of {len(data)} bytes is over {MAX_CONFIG_BODY}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FieldError("config body is not UTF-8") from None
    out: dict[str, str] = {}
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("#", "!"))]
    if len(lines) > MAX_CONFIG_KEYS:
        raise FieldError(f"config body has {len(lines)} keys, over {MAX_CONFIG_KEYS}")
    for line in lines:
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            raise FieldError(f"config line {line[:60]!r} is not key=value")
        if key in out:
            raise FieldError(f"config key {key} is given twice")
        out[key] = value.strip()
    return out


def format_properties(values: dict[str, str]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items())).encode("utf-8")


class UpdateBrokerConfigRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.UPDATE_BROKER_CONFIG
    section: ClassVar[str] = CONFIG
    body: ClassVar[str] = "key=value lines (only the broker's runtime allowlist)"
    response: ClassVar[str] = (
        "SUCCESS with every change applied; NO_PERMISSION naming a refused key"
    )


class GetBrokerConfigRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_BROKER_CONFIG
    section: ClassVar[str] = CONFIG
    response: ClassVar[str] = "body key=value lines: the runtime-changeable keys and their values"


class UpdateNamesrvConfigRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.UPDATE_NAMESRV_CONFIG
    section: ClassVar[str] = "nameserver"
    body: ClassVar[str] = "key=value lines"
    response: ClassVar[str] = "NO_PERMISSION: the NameServer has no runtime-changeable key"


class GetNamesrvConfigRequest(Header):
    code: ClassVar[RequestCode] = RequestCode.GET_NAMESRV_CONFIG
    section: ClassVar[str] = "nameserver"
    response: ClassVar[str] = "body key=value lines (empty: nothing is changeable at runtime)"
