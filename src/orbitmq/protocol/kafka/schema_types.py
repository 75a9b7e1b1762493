"""The shape of a Kafka message definition, as the generated tables describe it.

Kafka describes every request and response in JSON (apiKey, validVersions, flexibleVersions and
a tree of fields with the versions each exists in). `generate.py` turns those files into
`messages_gen.py`, a table of these frozen objects; `codec.py` compiles one (message, version)
into an encoder and a decoder. Version ranges are inclusive pairs; `NONE` is "no version".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_VERSION = 32767
NONE: tuple[int, int] = (1, 0)  # an empty range: lo > hi

PRIMITIVES = frozenset(
    {
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "float64",
        "bool",
        "string",
        "bytes",
        "uuid",
        "records",
    }
)


def in_range(version: int, rng: tuple[int, int]) -> bool:
    return rng[0] <= version <= rng[1]


@dataclass(frozen=True, slots=True)
class Field:
    """One field. `kind` is a primitive name, "struct" or "array"; an array's `elem` is a
    primitive name or "struct"; struct and array-of-struct fields carry `fields`."""

    name: str
    kind: str
    versions: tuple[int, int]
    elem: str = ""
    nullable: tuple[int, int] = NONE
    tagged: tuple[int, int] = NONE
    tag: int = -1
    default: Any = None
    has_default: bool = False
    flexible: tuple[int, int] | None = None  # a field-level override ("none" on ClientId)
    fields: tuple[Field, ...] = ()


@dataclass(frozen=True, slots=True)
class Message:
    """A request, response or header definition."""

    name: str
    api_key: int  # -1 for headers
    type: str  # "request", "response" or "header"
    valid: tuple[int, int]
    flexible: tuple[int, int]
    fields: tuple[Field, ...]
