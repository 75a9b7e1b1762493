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
"""

from __future__ import annotations

import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any, Final, Literal

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken

from orbitmq.common.errors import FilterExpressionError
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
    return _SqlFilter(EXPRESSION_TYPE_SQL92, expression, None, True, _compile_sql(expression))


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
        raise FilterExpressionError(f"tag expression {_quote(expression)} names no tag")
    if "*" in tags:
        return None
    return tags


# --------------------------------------------------------------------------- SQL92 parsing

# Keywords are regexes (not strings) so they can be case-insensitive and win over IDENT only as
# whole words: "notes" and "a.in" are property names. They are reserved: no property may be
# called "and". The basic lexer (not the contextual one) keeps them reserved in every position.
_KW_END = r"(?![A-Za-z0-9_.])"
_KEYWORDS = ("AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE")
_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr                                   -> not_
         | predicate
?predicate: operand CMP operand                            -> compare
          | operand _BETWEEN operand _AND operand          -> between
          | operand _NOT _BETWEEN operand _AND operand     -> not_between
          | operand _IN "(" operand ("," operand)* ")"     -> in_
          | operand _NOT _IN "(" operand ("," operand)* ")" -> not_in
          | operand _IS _NULL                              -> is_null
          | operand _IS _NOT _NULL                         -> is_not_null
          | "(" or_expr ")"
          | operand                                        -> bare
operand: IDENT                                             -> ident
       | STRING                                            -> string
       | NUMBER                                            -> number
       | "+" NUMBER                                        -> number
       | "-" NUMBER                                        -> negative
       | _TRUE                                             -> true
       | _FALSE                                            -> false
CMP: "<>" | "<=" | ">=" | "=" | "<" | ">"
IDENT: /[A-Za-z_][A-Za-z0-9_.]*/
NUMBER: /(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?/
STRING: /'(?:[^']|'')*'/
%ignore /[ \t\r\n\f]+/
""" + "".join(f"_{kw}.2: /{kw.lower()}{_KW_END}/i\n" for kw in _KEYWORDS)

_TERMINAL_NAMES = {
    "IDENT": "a property name",
    "STRING": "a 'string'",
    "NUMBER": "a number",
    "CMP": "a comparison (= <> < <= > >=)",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "MINUS": "'-'",
    "PLUS": "'+'",
    "$END": "the end",
    **{f"_{kw}": kw for kw in _KEYWORDS},
}
_UNSUPPORTED = frozenset({"LIKE", "ESCAPE", "CONTAINS", "STARTSWITH", "ENDSWITH"})

# One shared parser; parses are rare (compiles are cached), so serialise them rather than rely on
# lark being thread-safe.
_parse_lock = threading.Lock()


@cache
def _parser() -> Lark:
    """Built on first use: a process that only ever sees tag filters does not pay for it."""
    return Lark(_GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True)


_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")


def _parse(expression: str) -> Tree[Token]:
    if not expression.strip():
        raise FilterExpressionError("SQL92 expression is empty")
    # Cheap bound before lark sees the text: parentheses outside string literals.
    depth = deepest = 0
    for ch in _STRING_LITERAL.sub("", expression):
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise FilterExpressionError(
            f"SQL92 expression nests parentheses {deepest} deep, the limit is {MAX_DEPTH}"
        )
    try:
        with _parse_lock:
            return _parser().parse(expression)
    except UnexpectedCharacters as e:
        where = _where(expression, e.line, e.column)
        char = expression[e.pos_in_stream or 0]
        if char == "'":
            raise FilterExpressionError(
                f"SQL92 expression {_quote(expression)}: unterminated string {where}"
            ) from None
        hint = "; use <> for not equal" if expression.startswith("!=", e.pos_in_stream or 0) else ""
        raise FilterExpressionError(
            f"SQL92 expression {_quote(expression)}: unexpected character {char!r} {where}{hint}"
        ) from None
    except UnexpectedToken as e:
        raise FilterExpressionError(_token_error(expression, e)) from None
    except LarkError as e:  # anything else lark may raise: still a clear, typed error
        raise FilterExpressionError(f"SQL92 expression {_quote(expression)}: {e}") from None


def _token_error(expression: str, e: UnexpectedToken) -> str:
    token = e.token
    expected = sorted({_TERMINAL_NAMES.get(name, name) for name in e.expected})
    hint = f"; expected {', '.join(expected)}" if expected else ""
    if token.type == "$END":
        return f"SQL92 expression {_quote(expression)}: ends too early{hint}"
    where = _where(expression, token.line, token.column)
    value = str(token.value)
    if value.upper() in _UNSUPPORTED:
        hint = f"; {value.upper()} is not supported"
    elif token.type.startswith("_") and token.type[1:] in _KEYWORDS:
        hint += f" ({value.upper()} is a reserved word)"
    return f"SQL92 expression {_quote(expression)}: unexpected {value[:40]!r} {where}{hint}"


def _where(expression: str, line: int | None, column: int | None) -> str:
    if line is None or column is None:
        return ""
    return f"at column {column}" if "\n" not in expression else f"at line {line}, column {column}"


def _quote(expression: str) -> str:
    return repr(expression if len(expression) <= 80 else expression[:77] + "...")


# --------------------------------------------------------------------------- SQL92 compiling

_LOGICAL = frozenset({"or_expr", "and_expr", "not_"})
_PREDICATES = frozenset(
    {"compare", "between", "not_between", "in_", "not_in", "is_null", "is_not_null", "bare"}
)
_OPERANDS = frozenset({"ident", "string", "number", "negative", "true", "false"})


def _check_size(expression: str, tree: Tree[Token]) -> None:
    """Depth and node bounds, walked without recursion (the tree is not yet known to be shallow)."""
    nodes = 0
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        data = node.data
        nodes += 1
        if data in _LOGICAL or data in _PREDICATES:
            if depth > MAX_DEPTH:
                raise FilterExpressionError(
                    f"SQL92 expression {_quote(expression)} nests conditions deeper than "
                    f"{MAX_DEPTH}"
                )
            if data in ("in_", "not_in") and len(node.children) - 1 > MAX_IN_ITEMS:
                raise FilterExpressionError(
                    f"SQL92 expression {_quote(expression)}: IN list has "
                    f"{len(node.children) - 1} items, the limit is {MAX_IN_ITEMS}"
                )
            stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
        if nodes > MAX_NODES:
            raise FilterExpressionError(
                f"SQL92 expression {_quote(expression)} has more than {MAX_NODES} nodes "
                "(conditions, operators, names and literals)"
            )


Kind = Literal["prop", "num", "str", "bool"]
_KIND_NAMES = {"prop": "a property", "num": "a number", "str": "a string", "bool": "a boolean"}


@dataclass(frozen=True, slots=True)
class _Operand:
    kind: Kind
    value: object  # property name, int | float, str, bool
    text: str
    column: int


def _operand(node: Tree[Token]) -> _Operand:
    data = node.data
    column = node.meta.column if not node.meta.empty else 0
    if data in ("true", "false"):
        return _Operand("bool", data == "true", data.upper(), column)
    text = str(node.children[0])
    if data == "ident":
        return _Operand("prop", text, text, column)
    if data == "string":
        return _Operand("str", text[1:-1].replace("''", "'"), text, column)
    number = _literal_number(text)
    if data == "negative":
        return _Operand("num", -number, "-" + text, column)
    return _Operand("num", number, text, column)


def _literal_number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        return float(text)
    try:
        return int(text)
    except ValueError:  # more digits than int() converts: a float (inf beyond its range)
        return float(text)


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_int_match = _INTEGER.fullmatch
_decimal_match = _DECIMAL.fullmatch


def _to_number(value: str) -> int | float | None:
    """A property value as a number: ASCII decimal, optional sign and exponent; else None."""
    if _int_match(value):
        try:
            return int(value)
        except ValueError:  # beyond int()'s digit limit
            return float(value)
    if _decimal_match(value):
        return float(value)
    return None


_CMP_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _always_true(_: Mapping[str, str]) -> bool | None:
    return True


def _always_false(_: Mapping[str, str]) -> bool | None:
    return False


def _constant(value: bool) -> Condition:
    return _always_true if value else _always_false


def _compile_sql(expression: str) -> Condition:
    tree = _parse(expression)
    _check_size(expression, tree)
    return _Compiler(expression).condition(tree)


class _Compiler:
    """Parse tree → closures. Recursion is safe: :func:`_check_size` bounded the depth."""

    def __init__(self, expression: str) -> None:
        self.expression = expression

    def error(self, message: str) -> FilterExpressionError:
        return FilterExpressionError(f"SQL92 expression {_quote(self.expression)}: {message}")

    def condition(self, node: Tree[Token]) -> Condition:
        data = node.data
        children = [c for c in node.children if isinstance(c, Tree)]
        if data in ("or_expr", "and_expr"):
            return self.junction(data, node)
        if data == "not_":
            return _not(self.condition(children[0]))
        if data == "compare":
            op = str(node.children[1])
            return self.compare(_operand(children[0]), op, _operand(children[1]))
        if data in ("between", "not_between"):
            cond = self.between(*(_operand(c) for c in children))
            return cond if data == "between" else _not(cond)
        if data in ("in_", "not_in"):
            return self.in_list(_operand(children[0]), [_operand(c) for c in children[1:]], data)
        if data in ("is_null", "is_not_null"):
            return _is_null(_operand(children[0]), data == "is_null")
        if data == "bare":
            value = _operand(children[0])
            if value.kind == "prop":
                raise self.error(
                    f"{value.text[:40]} at column {value.column} is not a condition: compare "
                    f"it (e.g. {value.text[:40]} = 'x') or test it with IS NOT NULL"
                )
            if value.kind != "bool":
                raise self.error(
                    f"{value.text[:40]} at column {value.column} is {_KIND_NAMES[value.kind]}, "
                    "not a condition"
                )
            return _constant(value.value is True)
        raise self.error(f"unsupported construct {data}")  # unreachable with this grammar

    def junction(self, data: str, node: Tree[Token]) -> Condition:
        # Flatten nested chains of the same operator: "(a AND b) AND c" is one AND of three.
        parts: list[Condition] = []

        def collect(current: Tree[Token]) -> None:
            for child in current.children:
                if isinstance(child, Tree):
                    if child.data == data:
                        collect(child)
                    else:
                        parts.append(self.condition(child))

        collect(node)
        return _and(tuple(parts)) if data == "and_expr" else _or(tuple(parts))

    def compare(self, left: _Operand, op: str, right: _Operand) -> Condition:
        relational = op not in ("=", "<>")
        if relational:
            for side in (left, right):
                if side.kind in ("str", "bool"):
                    raise self.error(
                        f"{op} compares numbers, but {side.text[:40]} at column {side.column} "
                        f"is {_KIND_NAMES[side.kind]}"
                    )
            mode: Kind = "num"
        else:
            kinds = {left.kind, right.kind} - {"prop"}
            if len(kinds) > 1:
                raise self.error(
                    f"cannot compare {left.text[:40]} ({_KIND_NAMES[left.kind]}) with "
                    f"{right.text[:40]} ({_KIND_NAMES[right.kind]}) at column {left.column}"
                )
            mode = kinds.pop() if kinds else "str"
        if left.kind != "prop" and right.kind == "prop":
            left, op, right = right, _MIRROR[op], left
        fn = _CMP_OPS[op]
        if left.kind != "prop":  # two literals: decided now
            return _constant(fn(_literal(left, mode), _literal(right, mode)))
        name = str(left.value)
        if right.kind != "prop":
            return _prop_vs_literal(name, fn, _literal(right, mode), mode)
        return _prop_vs_prop(name, fn, str(right.value), mode)

    def between(self, value: _Operand, low: _Operand, high: _Operand) -> Condition:
        # SQL defines x BETWEEN lo AND hi as x >= lo AND x <= hi, NULL logic included.
        for side in (value, low, high):
            if side.kind in ("str", "bool"):
                raise self.error(
                    f"BETWEEN compares numbers, but {side.text[:40]} at column {side.column} "
                    f"is {_KIND_NAMES[side.kind]}"
                )
        if value.kind == "prop" and low.kind == "num" and high.kind == "num":
            return _prop_between(str(value.value), low.value, high.value)
        return _and((self.compare(value, ">=", low), self.compare(value, "<=", high)))

    def in_list(self, value: _Operand, items: list[_Operand], data: str) -> Condition:
        keyword = "IN" if data == "in_" else "NOT IN"
        for item in items:
            if item.kind != "str":
                raise self.error(
                    f"{keyword} takes 'string' literals, but {item.text[:40]} at column "
                    f"{item.column} is {_KIND_NAMES[item.kind]} (quote it to match the text)"
                )
        if value.kind not in ("prop", "str"):
            raise self.error(
                f"{keyword} compares strings, but {value.text[:40]} at column {value.column} "
                f"is {_KIND_NAMES[value.kind]}"
            )
        values = frozenset(str(item.value) for item in items)
        wanted = data == "in_"
        if value.kind == "str":
            return _constant((value.value in values) is wanted)
        return _prop_in(str(value.value), values, wanted)


def _literal(operand: _Operand, mode: Kind) -> object:
    """A literal as compared in ``mode``: booleans compare as the text "true" / "false"."""
    if mode == "bool":
        return "true" if operand.value is True else "false"
    return operand.value


# Closure factories. Each returns the leanest function for its shape: on the hot path a
# comparison is one dict lookup, at most one number conversion and one comparison.


def _prop_vs_literal(
    name: str, fn: Callable[[Any, Any], bool], literal: object, mode: Kind
) -> Condition:
    if mode == "num":

        def numeric(props: Mapping[str, str]) -> bool | None:
            raw = props.get(name)
            if raw is None:
                return None
            number = _to_number(raw)
            return None if number is None else fn(number, literal)

        return numeric
    if mode == "bool":

        def boolean(props: Mapping[str, str]) -> bool | None:
            raw = props.get(name)
            return None if raw is None else fn(raw.lower(), literal)

        return boolean

    def text(props: Mapping[str, str]) -> bool | None:
        raw = props.get(name)
        return None if raw is None else fn(raw, literal)

    return text


def _prop_vs_prop(left: str, fn: Callable[[Any, Any], bool], right: str, mode: Kind) -> Condition:
    if mode == "num":

        def numeric(props: Mapping[str, str]) -> bool | None:
            a, b = props.get(left), props.get(right)
            if a is None or b is None:
                return None
            x, y = _to_number(a), _to_number(b)
            return None if x is None or y is None else fn(x, y)

        return numeric

    def text(props: Mapping[str, str]) -> bool | None:
        a, b = props.get(left), props.get(right)
        return None if a is None or b is None else fn(a, b)

    return text


def _as_number(value: object) -> int | float:
    assert isinstance(value, int | float)
    return value


def _prop_between(name: str, low: object, high: object) -> Condition:
    lo, hi = _as_number(low), _as_number(high)

    def between(props: Mapping[str, str]) -> bool | None:
        raw = props.get(name)
        if raw is None:
            return None
        number = _to_number(raw)
        return None if number is None else lo <= number <= hi

    return between


def _prop_in(name: str, values: frozenset[str], wanted: bool) -> Condition:
    if wanted:

        def in_(props: Mapping[str, str]) -> bool | None:
            raw = props.get(name)
            return None if raw is None else raw in values

        return in_

    def not_in(props: Mapping[str, str]) -> bool | None:
        raw = props.get(name)
        return None if raw is None else raw not in values

    return not_in


def _is_null(operand: _Operand, wanted_null: bool) -> Condition:
    if operand.kind != "prop":
        return _constant(not wanted_null)  # a literal is never NULL
    name = str(operand.value)
    if wanted_null:

        def is_null(props: Mapping[str, str]) -> bool | None:
            return props.get(name) is None

        return is_null

    def is_not_null(props: Mapping[str, str]) -> bool | None:
        return props.get(name) is not None

    return is_not_null


def _not(cond: Condition) -> Condition:
    def not_(props: Mapping[str, str]) -> bool | None:
        value = cond(props)
        return None if value is None else not value

    return not_


def _and(conds: tuple[Condition, ...]) -> Condition:
    if len(conds) == 1:
        return conds[0]

    def and_(props: Mapping[str, str]) -> bool | None:
        result: bool | None = True
        for cond in conds:
            value = cond(props)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return and_


def _or(conds: tuple[Condition, ...]) -> Condition:
    if len(conds) == 1:
        return conds[0]

    def or_(props: Mapping[str, str]) -> bool | None:
        result: bool | None = False
        for cond in conds:
            value = cond(props)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return or_
