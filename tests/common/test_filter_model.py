"""Model test of the SQL92 filter: hypothesis builds random expression trees, renders them as SQL
text (random keyword case, spacing and redundant parentheses, minimal parentheses elsewhere so
precedence is exercised) and compares the compiled filter with a reference evaluator written
here, independently of orbitmq.common.filter: it walks the generated tree with explicit
three-valued logic and converts numbers with fractions.Fraction, not int/float and regexes.

Plus fuzzing: arbitrary text and token soup may only ever raise FilterExpressionError, and a
filter that compiles never raises while matching.

Hypothesis prints the falsifying example and keeps it in its example database; replay a failure
with the ``@seed(...)`` it reports (``--hypothesis-seed=N`` on the command line).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.common.errors import FilterExpressionError
from orbitmq.common.filter import compile_filter

# --------------------------------------------------------------------------- the model's AST


@dataclass(frozen=True)
class Prop:
    name: str


@dataclass(frozen=True)
class Num:
    text: str  # as rendered, sign included ("-2.5", "+3", "1e1")


@dataclass(frozen=True)
class Str:
    value: str


@dataclass(frozen=True)
class Bool:
    value: bool


Operand = Prop | Num | Str | Bool


@dataclass(frozen=True)
class Cmp:
    left: Operand
    op: str
    right: Operand


@dataclass(frozen=True)
class Between:
    negated: bool
    value: Operand
    low: Operand
    high: Operand


@dataclass(frozen=True)
class In:
    negated: bool
    value: Operand
    items: tuple[Str, ...]


@dataclass(frozen=True)
class IsNull:
    negated: bool
    value: Operand


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Not:
    child: Node


@dataclass(frozen=True)
class Junction:
    op: str  # "AND" | "OR"
    children: tuple[Node, ...]


Node = Cmp | Between | In | IsNull | Const | Not | Junction

NAMES = ["a", "b", "c", "TAGS", "x.y"]
STRINGS = ["x", "", "true", "TRUE", "False", "1", "10", "it's", "ü", "1.0"]
# Few distinct values, so that equal numbers (and BETWEEN bounds) come up often.
NUMBERS = ["0", "1", "2", "10", "0.5", "2.5", "1e1", ".5", "3.", "10.0", "25e-1", "007"]
VALUES = [*STRINGS, *NUMBERS, "-2", "+1", "-0.5", " 1", "1 ", "0x10", "1_0", "٣", "nan", "1e"]

props_st = st.sampled_from(NAMES).map(Prop)
num_st = st.one_of(
    st.integers(-3, 3).map(str),
    st.builds(
        lambda sign, text: sign + text, st.sampled_from(["", "-", "+"]), st.sampled_from(NUMBERS)
    ),
)
nums_st = num_st.map(Num)
strs_st = st.sampled_from(STRINGS).map(Str)
bools_st = st.booleans().map(Bool)
numeric_operand = st.one_of(props_st, nums_st)

REL = ["<", "<=", ">", ">="]
EQ = ["=", "<>"]
ALL_OPS = EQ + REL


@st.composite
def comparisons(draw: st.DrawFn) -> Cmp:
    shape = draw(st.sampled_from(["numeric"] * 3 + ["text", "bool", "bool", "props", "consts"]))
    if shape == "numeric":  # a number or a property on either side, any operator
        left, right = draw(numeric_operand), draw(numeric_operand)
        return Cmp(left, draw(st.sampled_from(ALL_OPS)), right)
    if shape == "props":
        return Cmp(draw(props_st), draw(st.sampled_from(ALL_OPS)), draw(props_st))
    literals: st.SearchStrategy[Operand]
    if shape == "text":
        literals = strs_st
    elif shape == "bool":
        literals = bools_st
    else:
        literals = draw(st.sampled_from([strs_st, bools_st]))
    literal = draw(literals)
    other = draw(props_st if shape != "consts" else literals)
    left, right = (literal, other) if draw(st.booleans()) else (other, literal)
    return Cmp(left, draw(st.sampled_from(EQ)), right)


predicates = st.one_of(
    comparisons(),
    comparisons(),
    comparisons(),
    st.builds(Between, st.booleans(), numeric_operand, numeric_operand, numeric_operand),
    st.builds(
        In,
        st.booleans(),
        st.one_of(props_st, strs_st),
        st.lists(strs_st, min_size=1, max_size=4).map(tuple),
    ),
    st.builds(IsNull, st.booleans(), st.one_of(props_st, st.one_of(nums_st, strs_st, bools_st))),
    st.builds(Const, st.booleans()),
)

expressions = st.recursive(
    predicates,
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.builds(
            Junction,
            st.sampled_from(["AND", "OR"]),
            st.lists(inner, min_size=2, max_size=4).map(tuple),
        ),
    ),
    max_leaves=12,
)


def depth(node: Node) -> int:
    if isinstance(node, Not):
        return 1 + depth(node.child)
    if isinstance(node, Junction):
        return 1 + max(depth(child) for child in node.children)
    return 1


# Unary NOT chains are not bounded by max_leaves; keep well inside the depth limit.
expressions = expressions.filter(lambda tree: depth(tree) <= 12)

SIGNED = [sign + n for sign in ("", "-", "+") for n in NUMBERS]
BOOLISH = ["true", "TRUE", "False", "false", "yes"]
# One flat pool (cheap to draw): numbers twice as likely as the rest.
values_st = st.sampled_from([*VALUES, *SIGNED, *SIGNED, *BOOLISH, *(str(i) for i in range(-3, 4))])


@st.composite
def property_maps(draw: st.DrawFn) -> dict[str, str]:
    """Each name is present three times in four: NULLs are common, but not the rule."""
    present = draw(st.integers(0, 2 ** len(NAMES) - 1)) | draw(st.integers(0, 2 ** len(NAMES) - 1))
    return {name: draw(values_st) for i, name in enumerate(NAMES) if present >> i & 1}


# --------------------------------------------------------------------------- the reference

Truth = bool | None


def ref_number(text: str) -> Fraction | None:
    """Digits, one optional sign, a decimal point, an exponent: ASCII only, no spaces."""
    if not text or any(ch not in "0123456789+-.eE" for ch in text):
        return None
    try:
        return Fraction(text)
    except ValueError:
        return None


def ref_literal_number(text: str) -> Fraction:
    value = ref_number(text.replace(" ", ""))
    assert value is not None, text
    return value


def ref_numeric(operand: Operand, props: Mapping[str, str]) -> Fraction | None:
    if isinstance(operand, Prop):
        raw = props.get(operand.name)
        return None if raw is None else ref_number(raw)
    assert isinstance(operand, Num)
    return ref_literal_number(operand.text)


def ref_text(operand: Operand, props: Mapping[str, str], fold: bool) -> str | None:
    if isinstance(operand, Prop):
        raw = props.get(operand.name)
        return raw.lower() if fold and raw is not None else raw
    if isinstance(operand, Bool):
        return "true" if operand.value else "false"
    assert isinstance(operand, Str)
    return operand.value


def ref_compare(left: Operand, op: str, right: Operand, props: Mapping[str, str]) -> Truth:
    sides = (left, right)
    x: object
    y: object
    if op in REL or any(isinstance(s, Num) for s in sides):
        x, y = ref_numeric(left, props), ref_numeric(right, props)
    else:
        fold = any(isinstance(s, Bool) for s in sides)
        x, y = ref_text(left, props, fold), ref_text(right, props, fold)
    if x is None or y is None:
        return None
    if op == "=":
        return x == y
    if op == "<>":
        return x != y
    assert isinstance(x, Fraction)
    assert isinstance(y, Fraction)
    return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


def ref_and(values: list[Truth]) -> Truth:
    if any(v is False for v in values):
        return False
    if any(v is None for v in values):
        return None
    return True


def ref_or(values: list[Truth]) -> Truth:
    if any(v is True for v in values):
        return True
    if any(v is None for v in values):
        return None
    return False


def ref_not(value: Truth) -> Truth:
    return None if value is None else not value


def evaluate(node: Node, props: Mapping[str, str]) -> Truth:
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Cmp):
        return ref_compare(node.left, node.op, node.right, props)
    if isinstance(node, Between):
        result = ref_and(
            [
                ref_compare(node.value, ">=", node.low, props),
                ref_compare(node.value, "<=", node.high, props),
            ]
        )
        return ref_not(result) if node.negated else result
    if isinstance(node, In):
        text = ref_text(node.value, props, fold=False)
        if text is None:
            return None
        found = text in [item.value for item in node.items]
        return not found if node.negated else found
    if isinstance(node, IsNull):
        missing = isinstance(node.value, Prop) and node.value.name not in props
        return not missing if node.negated else missing
    if isinstance(node, Not):
        return ref_not(evaluate(node.child, props))
    values = [evaluate(child, props) for child in node.children]
    return ref_and(values) if node.op == "AND" else ref_or(values)


# --------------------------------------------------------------------------- rendering


class Renderer:
    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd

    def kw(self, word: str) -> str:
        style = self.rnd.randrange(4)
        if style == 0:
            return word.lower()
        if style == 1:
            return "".join(c.upper() if self.rnd.random() < 0.5 else c.lower() for c in word)
        return word

    def sp(self) -> str:
        return self.rnd.choice([" ", " ", " ", "  ", "\n", "\t "])

    def operand(self, operand: Operand) -> str:
        if isinstance(operand, Prop):
            return operand.name
        if isinstance(operand, Num):
            if operand.text.startswith("-") and self.rnd.random() < 0.3:
                return "- " + operand.text[1:]
            return operand.text
        if isinstance(operand, Str):
            return "'" + operand.value.replace("'", "''") + "'"
        return self.kw("TRUE" if operand.value else "FALSE")

    def maybe_wrap(self, text: str, must: bool = False) -> str:
        if must or self.rnd.random() < 0.15:
            return "(" + self.sp() + text + self.sp() + ")"
        return text

    def node(self, node: Node) -> str:
        sp, kw = self.sp, self.kw
        if isinstance(node, Const):
            return kw("TRUE" if node.value else "FALSE")
        if isinstance(node, Cmp):
            gap = sp() if self.rnd.random() < 0.8 else ""
            return f"{self.operand(node.left)}{gap}{node.op}{gap}{self.operand(node.right)}"
        if isinstance(node, Between):
            neg = kw("NOT") + sp() if node.negated else ""
            return (
                f"{self.operand(node.value)}{sp()}{neg}{kw('BETWEEN')}{sp()}"
                f"{self.operand(node.low)}{sp()}{kw('AND')}{sp()}{self.operand(node.high)}"
            )
        if isinstance(node, In):
            neg = kw("NOT") + sp() if node.negated else ""
            items = ("," + sp()).join(self.operand(i) for i in node.items)
            return f"{self.operand(node.value)}{sp()}{neg}{kw('IN')}{sp()}({items})"
        if isinstance(node, IsNull):
            neg = kw("NOT") + sp() if node.negated else ""
            return f"{self.operand(node.value)}{sp()}{kw('IS')}{sp()}{neg}{kw('NULL')}"
        if isinstance(node, Not):
            child = self.maybe_wrap(self.node(node.child), must=isinstance(node.child, Junction))
            return f"{kw('NOT')}{sp()}{child}"
        parts = []
        for child in node.children:
            # AND binds tighter than OR: an OR under an AND needs its parentheses
            must = node.op == "AND" and isinstance(child, Junction) and child.op == "OR"
            parts.append(self.maybe_wrap(self.node(child), must=must))
        joiner = sp() + kw(node.op) + sp()
        return joiner.join(parts)

    def render(self, node: Node) -> str:
        return self.sp() + self.maybe_wrap(self.node(node)) + self.sp()


# --------------------------------------------------------------------------- the tests

MODEL_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# Added to every drawn batch: every name missing, or every name set to one telling value.
CORNER_MAPS = [{}] + [
    dict.fromkeys(NAMES, value) for value in ("", "1", "TRUE", "false", "2.5", "x", "-1", "10.0")
]


def subtrees(node: Node) -> list[Node]:
    found = [node]
    if isinstance(node, Not):
        found += subtrees(node.child)
    elif isinstance(node, Junction):
        for child in node.children:
            found += subtrees(child)
    return found


@MODEL_SETTINGS
@given(
    tree=expressions,
    render_seed=st.integers(0, 2**32 - 1),
    batch=st.lists(property_maps(), min_size=4, max_size=12),
)
def test_filter_agrees_with_reference(
    tree: Node, render_seed: int, batch: list[dict[str, str]]
) -> None:
    # Every subtree is checked on its own too: in a big AND / OR one wrong predicate is
    # usually masked by its siblings.
    renderer = Renderer(random.Random(render_seed))
    batch = batch + CORNER_MAPS
    for node in subtrees(tree):
        text = renderer.render(node)
        expected = [evaluate(node, props) for props in batch]
        flt = compile_filter("SQL92", text)
        got = flt.matches_many(batch)
        assert got == [e is True for e in expected], (text, expected, batch)
        assert [flt.matches(props) for props in batch] == got
        # NOT e matches exactly when e is FALSE: a NULL is told apart from FALSE
        negated = compile_filter("SQL92", f"NOT ({text})")
        assert negated.matches_many(batch) == [e is False for e in expected], (text, batch)


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.text(alphabet="0123456789+-.eE", max_size=6), st.text(max_size=4), values_st
    ),
    literal=num_st,
    other=num_st,
)
def test_number_conversion_agrees_with_reference(value: str, literal: str, other: str) -> None:
    """Which property values are numbers, and their value, against Fraction's reading."""
    props = {"v": value}
    renderer = Renderer(random.Random(0))
    cases: list[Node] = [Cmp(Prop("v"), op, Num(literal)) for op in ALL_OPS]
    cases += [
        Between(negated, Prop("v"), Num(low), Num(high))
        for negated in (False, True)
        for low, high in ((literal, other), (other, literal))
    ]
    for node in cases:
        expected = evaluate(node, props)
        text = renderer.node(node)
        assert compile_filter("SQL92", text).matches(props) is (expected is True), text
        assert compile_filter("SQL92", f"NOT ({text})").matches(props) is (expected is False)


def test_reference_sanity() -> None:
    """The reference itself, on hand-checked cases (a wrong model proves nothing)."""
    props = {"a": "10", "b": "x", "c": "TRUE"}
    assert evaluate(Cmp(Prop("a"), ">", Num("9.5")), props) is True
    assert evaluate(Cmp(Prop("b"), ">", Num("1")), props) is None
    assert evaluate(Cmp(Prop("c"), "=", Bool(True)), props) is True
    assert evaluate(Cmp(Prop("a"), "=", Str("10")), props) is True
    assert evaluate(Junction("AND", (Cmp(Prop("z"), "=", Num("1")), Const(False))), props) is False
    assert evaluate(Junction("OR", (Cmp(Prop("z"), "=", Num("1")), Const(False))), props) is None
    assert evaluate(Not(Cmp(Prop("z"), "=", Num("1"))), props) is None
    assert ref_number(" 1") is None
    assert ref_number("1/2") is None
    assert ref_number("+.5") == Fraction(1, 2)


SQL_TOKENS = [
    "a", "b", "TAGS", "x.y", "AND", "or", "Not", "BETWEEN", "in", "IS", "NULL", "TRUE", "false",
    "(", ")", ",", "=", "<>", "<", "<=", ">", ">=", "-", "+", "1", "-2", "2.5", "1e3", "'x'",
    "''", "'it''s'", "'", "!", "==", "é", "LIKE", "\n", "0x1", ".", "*", "||",
]  # fmt: skip


def _assert_safe(expression_type: str, text: str, props: dict[str, str]) -> None:
    try:
        flt = compile_filter(expression_type, text)
    except FilterExpressionError as e:
        assert str(e)
        return
    assert isinstance(flt.matches(props), bool)
    assert flt.matches_many([props, {}]) == [flt.matches(props), flt.matches({})]


FUZZ_SETTINGS = settings(max_examples=300, deadline=None)


@FUZZ_SETTINGS
@given(text=st.text(max_size=200), props=property_maps())
def test_fuzz_arbitrary_text(text: str, props: dict[str, str]) -> None:
    _assert_safe("SQL92", text, props)
    _assert_safe("TAG", text, props)


@FUZZ_SETTINGS
@given(
    tokens=st.lists(st.sampled_from(SQL_TOKENS), max_size=30),
    joiner=st.sampled_from([" ", "", "  "]),
    props=property_maps(),
)
def test_fuzz_token_soup(tokens: list[str], joiner: str, props: dict[str, str]) -> None:
    _assert_safe("SQL92", joiner.join(tokens), props)


@settings(max_examples=50, deadline=None)
@given(
    prefix=st.text(alphabet="(NOT ", max_size=300),
    middle=st.sampled_from(["a = 1", "TRUE", "a IN ('x')", ""]),
    suffix=st.text(alphabet=") ANDOR", max_size=300),
)
def test_fuzz_nesting(prefix: str, middle: str, suffix: str) -> None:
    _assert_safe("SQL92", prefix + middle + suffix, {"a": "1"})


@settings(max_examples=50, deadline=None)
@given(expression_type=st.text(max_size=10), text=st.text(max_size=20))
def test_fuzz_expression_type(expression_type: str, text: str) -> None:
    _assert_safe(expression_type, text, {})
