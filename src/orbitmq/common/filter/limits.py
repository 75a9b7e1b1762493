"""The expression types and the bounds on an expression (length, nesting, node count, IN list
size, cache size), shared by the parser, the compiler and the filters; and :data:`Condition`,
the shape of a compiled SQL92 condition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

EXPRESSION_TYPE_TAG: Final = "TAG"
EXPRESSION_TYPE_SQL92: Final = "SQL92"
MAX_EXPRESSION_LENGTH: Final = 4096
"""Characters, before any trimming, for both expression types."""
MAX_DEPTH: Final = 32
"""How deep parentheses and AND / OR / NOT / predicates may nest."""
MAX_NODES: Final = 512
"""Conditions, operators, property names and literals (IN items included) in one expression."""
MAX_IN_ITEMS: Final = 256
CACHE_SIZE: Final = 1024

Condition = Callable[[Mapping[str, str]], bool | None]
"""A compiled condition: TRUE, FALSE, or None for SQL's NULL (unknown)."""
