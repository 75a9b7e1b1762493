"""Typed access to a frame's header fields: a wrong or missing field is MESSAGE_ILLEGAL."""

from __future__ import annotations

from typing import Any

from orbitmq.common.errors import MessageIllegalError
from orbitmq.protocol.frame import Frame

_MISSING: Any = object()


class FieldError(MessageIllegalError):
    """A request field is missing or has the wrong type."""


def get_str(frame: Frame, name: str, default: str | None = _MISSING) -> str:
    value = frame.fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING or default is None:
            raise FieldError(f"field {name!r} is required")
        return default
    if not isinstance(value, str):
        raise FieldError(f"field {name!r} must be a string, not {type(value).__name__}")
    return value


def get_int(
    frame: Frame,
    name: str,
    default: int | None = _MISSING,
    *,
    lo: int = -(2**63),
    hi: int = 2**63 - 1,
) -> int:
    value = frame.fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING or default is None:
            raise FieldError(f"field {name!r} is required")
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"field {name!r} must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise FieldError(f"field {name!r} = {value} is outside [{lo}, {hi}]")
    return value


def get_str_list(frame: Frame, name: str) -> list[str] | None:
    value = frame.fields.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(f"field {name!r} must be a list of strings")
    return value
