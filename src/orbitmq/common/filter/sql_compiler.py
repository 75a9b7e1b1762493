"""A SQL92 parse tree to a tree of small closures (:func:`compile_sql`): the expression is
bounded first (depth, nodes, IN items), literals are typed once, and each predicate becomes
the leanest closure for its operand kinds, with SQL's three-valued logic (None is NULL).
Matching a message calls those closures and never sees the parse tree again.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lark import Token, Tree

from orbitmq.common.errors import FilterExpressionError
from orbitmq.common.filter.limits import MAX_DEPTH, MAX_IN_ITEMS, MAX_NODES, Condition
from orbitmq.common.filter.sql_parser import parse_sql, quote

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
                    f"SQL92 expression {quote(expression)} nests conditions deeper than {MAX_DEPTH}"
                )
            if data in ("in_", "not_in") and len(node.children) - 1 > MAX_IN_ITEMS:
                raise FilterExpressionError(
                    f"SQL92 expression {quote(expression)}: IN list has "
                    f"{len(node.children) - 1} items, the limit is {MAX_IN_ITEMS}"
                )
            stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
        if nodes > MAX_NODES:
            raise FilterExpressionError(
                f"SQL92 expression {quote(expression)} has more than {MAX_NODES} nodes "
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


def compile_sql(expression: str) -> Condition:
    tree = parse_sql(expression)
    _check_size(expression, tree)
    return _Compiler(expression).condition(tree)


class _Compiler:
    """Parse tree → closures. Recursion is safe: :func:`_check_size` bounded the depth."""

    def __init__(self, expression: str) -> None:
        self.expression = expression

    def error(self, message: str) -> FilterExpressionError:
        return FilterExpressionError(f"SQL92 expression {quote(self.expression)}: {message}")

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
