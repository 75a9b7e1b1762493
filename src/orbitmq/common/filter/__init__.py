"""Subscription filters: tag expressions and SQL92 conditions over message properties.

Both sides need them: the broker compiles every subscription a heartbeat brings (an invalid one
is refused with SUBSCRIPTION_PARSE_FAILED) and evaluates SQL92 while serving pulls and pops; a
client compiles at ``subscribe()`` so a typo fails at once, not on the first heartbeat.

    compile_filter("TAG", "TagA || TagB")          -> MessageFilter (tags={"TagA", "TagB"})
    compile_filter("SQL92", "a > 5 AND TAGS = 'x'") -> MessageFilter (is_sql=True)
    flt.matches(properties)                         -> bool; never raises

SQL92 text is parsed once with lark (LALR) and compiled into a tree of small closures; matching a
message calls those closures and never sees the parse tree again. Compiled filters are cached
(LRU, :data:`CACHE_SIZE`) by (type, expression), so the many consumers of one group that send the
same subscription share one compiled filter. Expressions are bounded (length, nesting, node count,
IN list size) so that no subscription can make the broker parse or evaluate without limit.
docs/filtering.md has the grammar and the semantics.

This package is the public face: the filters and :func:`compile_filter` live here, on
:mod:`.limits` (types and bounds), :mod:`.sql_parser` (text to parse tree) and
:mod:`.sql_compiler` (parse tree to closures).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from orbitmq.common.errors import FilterExpressionError
from orbitmq.common.filter.limits import (
    CACHE_SIZE,
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    MAX_IN_ITEMS,
    MAX_NODES,
    Condition,
)
from orbitmq.common.filter.sql_compiler import compile_sql
from orbitmq.common.filter.sql_parser import quote
from orbitmq.common.message import PROPERTY_TAGS

__all__ = [
    "CACHE_SIZE",
    "EXPRESSION_TYPE_SQL92",
    "EXPRESSION_TYPE_TAG",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "MAX_IN_ITEMS",
    "MAX_NODES",
    "MessageFilter",
    "compile_filter",
    "parse_tags",
]


# --------------------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """A compiled subscription expression. Shared through the cache: never mutate one.

    This base class is itself the match-all filter (TAG ``*``); the tag and SQL92 filters are
    private subclasses, each with the leanest ``matches`` for its kind.

    ``tags`` is the tag set of a TAG filter (None when it takes every tag: ``*`` or empty); SQL92
    filters have ``tags=None`` and ``is_sql=True``, their TAGS condition is part of the SQL.
    """

    expression_type: str
    expression: str
    tags: frozenset[str] | None
    is_sql: bool

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether a message with these properties (TAGS included) passes. Never raises."""
        return True

    def matches_many(self, batch: Iterable[Mapping[str, str]]) -> list[bool]:
        """:meth:`matches` for each message of a batch, in order."""
        return [True for _ in batch]


@dataclass(frozen=True, slots=True)
class _TagFilter(MessageFilter):
    """Exact tag check; a message without a tag passes only a ``*`` filter (the base class)."""

    tag_set: frozenset[str] = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, str]) -> bool:
        return properties.get(PROPERTY_TAGS) in self.tag_set

    def matches_many(self, batch: Iterable[Mapping[str, str]]) -> list[bool]:
        tag_set = self.tag_set
        return [p.get(PROPERTY_TAGS) in tag_set for p in batch]


@dataclass(frozen=True, slots=True)
class _SqlFilter(MessageFilter):
    """Only an exact TRUE passes: FALSE and NULL (a missing property, say) do not."""

    condition: Condition = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self.condition(properties) is True

    def matches_many(self, batch: Iterable[Mapping[str, str]]) -> list[bool]:
        condition = self.condition
        return [condition(p) is True for p in batch]


def compile_filter(expression_type: str, expression: str) -> MessageFilter:
    """Compile a subscription expression; raises FilterExpressionError when it is not valid.

    ``expression_type`` is "TAG" (also "" as RocketMQ reads a missing type) or "SQL92", in any
    case. The result is cached: equal arguments return the same object.
    """
    if not isinstance(expression_type, str) or not isinstance(expression, str):
        raise FilterExpressionError("expression type and expression must be strings")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise FilterExpressionError(
            f"expression is {len(expression)} characters, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    kind = expression_type.strip().upper() or EXPRESSION_TYPE_TAG
    if kind not in (EXPRESSION_TYPE_TAG, EXPRESSION_TYPE_SQL92):
        raise FilterExpressionError(
            f"unknown expression type {expression_type[:40]!r}: use TAG or SQL92"
        )
    return _compile_cached(kind, expression)


@lru_cache(maxsize=CACHE_SIZE)
def _compile_cached(kind: str, expression: str) -> MessageFilter:
    if kind == EXPRESSION_TYPE_TAG:
        tags = parse_tags(expression)
        if tags is None:
            return MessageFilter(EXPRESSION_TYPE_TAG, expression, None, False)
        return _TagFilter(EXPRESSION_TYPE_TAG, expression, tags, False, tags)
    return _SqlFilter(EXPRESSION_TYPE_SQL92, expression, None, True, compile_sql(expression))


def parse_tags(expression: str) -> frozenset[str] | None:
    """``"TagA || TagB"`` → {"TagA", "TagB"}; ``"*"`` or empty (after trimming) → None (all).

    Each tag is trimmed and empty ones are dropped (RocketMQ's FilterAPI does the same). A ``*``
    among other tags also means all tags. Nothing but separators is an error.
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise FilterExpressionError(
            f"expression is {len(expression)} characters, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = frozenset(t for t in (part.strip() for part in text.split("||")) if t)
    if not tags:
        raise FilterExpressionError(f"tag expression {quote(expression)} names no tag")
    if "*" in tags:
        return None
    return tags
