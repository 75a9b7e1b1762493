"""SQL92 text to a lark parse tree: the grammar (reserved case-insensitive keywords, the
operators RocketMQ supports), one LALR parser built on first use, and error messages that point
at the offending token. Unsupported RocketMQ operators (LIKE, CONTAINS, ...) are refused by name.
"""

from __future__ import annotations

import re
import threading
from functools import cache

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken

from orbitmq.common.errors import FilterExpressionError
from orbitmq.common.filter.limits import MAX_DEPTH

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


def parse_sql(expression: str) -> Tree[Token]:
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
                f"SQL92 expression {quote(expression)}: unterminated string {where}"
            ) from None
        hint = "; use <> for not equal" if expression.startswith("!=", e.pos_in_stream or 0) else ""
        raise FilterExpressionError(
            f"SQL92 expression {quote(expression)}: unexpected character {char!r} {where}{hint}"
        ) from None
    except UnexpectedToken as e:
        raise FilterExpressionError(_token_error(expression, e)) from None
    except LarkError as e:  # anything else lark may raise: still a clear, typed error
        raise FilterExpressionError(f"SQL92 expression {quote(expression)}: {e}") from None


def _token_error(expression: str, e: UnexpectedToken) -> str:
    token = e.token
    expected = sorted({_TERMINAL_NAMES.get(name, name) for name in e.expected})
    hint = f"; expected {', '.join(expected)}" if expected else ""
    if token.type == "$END":
        return f"SQL92 expression {quote(expression)}: ends too early{hint}"
    where = _where(expression, token.line, token.column)
    value = str(token.value)
    if value.upper() in _UNSUPPORTED:
        hint = f"; {value.upper()} is not supported"
    elif token.type.startswith("_") and token.type[1:] in _KEYWORDS:
        hint += f" ({value.upper()} is a reserved word)"
    return f"SQL92 expression {quote(expression)}: unexpected {value[:40]!r} {where}{hint}"


def _where(expression: str, line: int | None, column: int | None) -> str:
    if line is None or column is None:
        return ""
    return f"at column {column}" if "\n" not in expression else f"at line {line}, column {column}"


def quote(expression: str) -> str:
    return repr(expression if len(expression) <= 80 else expression[:77] + "...")
