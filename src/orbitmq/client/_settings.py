"""Client settings: one validator per field, checked in one place.

A config dataclass declares each field with :func:`setting`, which carries its default and the
predicate a value must satisfy; :func:`check_settings` (called from ``__post_init__``) runs every
predicate and names all the fields out of range in one ClientError. The default and the rule of
a setting are written once, beside each other, instead of in a constructor's keyword list and a
hand-written ``checks = {...}`` block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orbitmq.common.errors import ClientError

__all__ = ["check_settings", "setting"]

_CHECK = "orbitmq.check"


def setting(default: Any, check: Callable[[Any], bool] | None = None) -> Any:
    """A config field: ``default`` and the predicate a value must pass (None: any value)."""
    return dataclasses.field(default=default, metadata={_CHECK: check} if check else {})


def check_settings(config: Any, kind: str) -> None:
    """Run every field's predicate; ClientError naming each field out of range."""
    bad = [
        f.name
        for f in dataclasses.fields(config)
        if (check := f.metadata.get(_CHECK)) is not None and not check(getattr(config, f.name))
    ]
    if bad:
        raise ClientError(f"{kind} setting out of range: {', '.join(bad)}")
