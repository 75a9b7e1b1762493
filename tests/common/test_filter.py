"""Unit tests of the subscription filters: tag expressions, every SQL92 operator, NULL logic,
number conversion, limits and error messages. The model test is in test_filter_model.py."""

from __future__ import annotations

import pytest

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import FilterExpressionError
from orbitmq.common.filter import (
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    MAX_IN_ITEMS,
    MAX_NODES,
    MessageFilter,
    compile_filter,
    parse_tags,
)


def sql(expression: str) -> MessageFilter:
    return compile_filter("SQL92", expression)


def check(expression: str, props: dict[str, str]) -> bool:
    return sql(expression).matches(props)


# --------------------------------------------------------------------------- tags


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("*", None),
        ("", None),
        ("   ", None),
        (" * ", None),
        ("TagA", {"TagA"}),
        (" TagA || TagB ", {"TagA", "TagB"}),
        ("TagA||TagB||TagA", {"TagA", "TagB"}),
        ("TagA ||", {"TagA"}),
        ("|| TagA || ", {"TagA"}),
        ("Tag A || b", {"Tag A", "b"}),
        ("TagA || *", None),
        ("ünï || 标签", {"ünï", "标签"}),
    ],
)
def test_parse_tags(expression: str, expected: set[str] | None) -> None:
    tags = parse_tags(expression)
    assert tags == (frozenset(expected) if expected is not None else None)
    flt = compile_filter("TAG", expression)
    assert flt.tags == tags
    assert not flt.is_sql
    assert flt.expression_type == "TAG"
    assert flt.expression == expression


@pytest.mark.parametrize("expression", ["||", " || || ", "|| ||"])
def test_tag_expression_without_tags(expression: str) -> None:
    with pytest.raises(FilterExpressionError, match="names no tag"):
        parse_tags(expression)
    with pytest.raises(FilterExpressionError):
        compile_filter("TAG", expression)


def test_tag_matching_is_exact() -> None:
    flt = compile_filter("TAG", "TagA || TagB")
    assert flt.matches({"TAGS": "TagA"})
    assert flt.matches({"TAGS": "TagB", "a": "1"})
    assert not flt.matches({"TAGS": "taga"})
    assert not flt.matches({"TAGS": "TagA || TagB"})
    assert not flt.matches({"TAGS": ""})
    assert not flt.matches({})
    assert flt.matches_many([{"TAGS": "TagA"}, {}, {"TAGS": "TagC"}]) == [True, False, False]


def test_star_matches_everything_including_untagged() -> None:
    for expression in ("*", ""):
        flt = compile_filter("TAG", expression)
        assert flt.tags is None
        assert flt.matches({})
        assert flt.matches({"TAGS": "x"})
        assert flt.matches_many([{}, {"TAGS": "y"}]) == [True, True]


def test_expression_types() -> None:
    assert compile_filter("tag", "a").tags == {"a"}
    assert compile_filter("", "a").expression_type == "TAG"
    assert compile_filter("sql92", "a = 1").is_sql
    assert compile_filter(" SQL92 ", "a = 1").expression_type == "SQL92"
    with pytest.raises(FilterExpressionError, match="unknown expression type"):
        compile_filter("XPATH", "a")
    with pytest.raises(FilterExpressionError, match="strings"):
        compile_filter("TAG", None)  # type: ignore[arg-type]
    with pytest.raises(FilterExpressionError, match="strings"):
        compile_filter(["SQL92"], "a = 1")  # type: ignore[arg-type]


def test_compile_is_cached() -> None:
    assert compile_filter("SQL92", "a = 1") is compile_filter("sql92", "a = 1")
    assert compile_filter("TAG", "x || y") is compile_filter("TAG", "x || y")
    flt = sql("b > 2")
    assert flt.tags is None
    assert flt.is_sql
    assert "b > 2" in repr(flt)


def test_error_type_and_code() -> None:
    with pytest.raises(FilterExpressionError) as info:
        sql("a = ")
    assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- SQL92 operators

PROPS = {"n": "10", "f": "2.5", "neg": "-3", "s": "abc", "e": "", "b": "true", "TAGS": "TagA"}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # = and <> against numbers: numeric
        ("n = 10", True),
        ("n = 10.0", True),
        ("n = 1e1", True),
        ("n <> 10", False),
        ("n <> 11", True),
        ("f = 2.5", True),
        ("neg = -3", True),
        ("neg = - 3", True),
        ("neg = +3", False),
        ("n = +10", True),
        # relational
        ("n > 9", True),
        ("n > 10", False),
        ("n >= 10", True),
        ("n < 10.5", True),
        ("n <= 9.99", False),
        ("f < 3", True),
        ("neg < -2", True),
        ("neg >= -3", True),
        ("9 < n", True),
        ("10 >= n", True),
        ("11 <= n", False),
        # = and <> against strings: text
        ("s = 'abc'", True),
        ("s = 'ABC'", False),
        ("s <> 'abd'", True),
        ("n = '10'", True),
        ("n = '10.0'", False),
        ("e = ''", True),
        ("'abc' = s", True),
        ("TAGS = 'TagA'", True),
        ("TAGS <> 'TagA'", False),
        # booleans: case-insensitive text "true" / "false"
        ("b = TRUE", True),
        ("b = true", True),
        ("b <> FALSE", True),
        ("b = FALSE", False),
        ("TRUE = b", True),
        ("s = TRUE", False),
        ("s <> TRUE", True),
        # property against property
        ("n = n", True),
        ("s = s", True),
        ("n > neg", True),
        ("neg > n", False),
        ("n = s", False),
        ("n > s", None),
        # BETWEEN
        ("n BETWEEN 1 AND 10", True),
        ("n BETWEEN 10 AND 10", True),
        ("n BETWEEN 11 AND 20", False),
        ("n BETWEEN 20 AND 1", False),
        ("f BETWEEN 2.5 AND 2.5", True),
        ("neg BETWEEN -5 AND -3", True),
        ("n NOT BETWEEN 1 AND 10", False),
        ("n NOT BETWEEN 11 AND 20", True),
        ("n BETWEEN neg AND 10", True),
        ("5 BETWEEN neg AND n", True),
        ("5 BETWEEN 1 AND 4", False),
        # IN
        ("s IN ('abc')", True),
        ("s IN ('x', 'abc', 'y')", True),
        ("s IN ('x', 'y')", False),
        ("s NOT IN ('x', 'y')", True),
        ("s NOT IN ('abc')", False),
        ("n IN ('10')", True),
        ("n IN ('10.0')", False),
        ("TAGS IN ('TagA', 'TagB')", True),
        ("'x' IN ('x')", True),
        ("'x' NOT IN ('x')", False),
        # IS NULL
        ("missing IS NULL", True),
        ("missing IS NOT NULL", False),
        ("e IS NULL", False),
        ("e IS NOT NULL", True),
        ("1 IS NULL", False),
        ("'x' IS NOT NULL", True),
        # literals
        ("TRUE", True),
        ("FALSE", False),
        ("1 = 1", True),
        ("1 = 1.0", True),
        ("1 <> 1", False),
        ("2 > 1", True),
        ("'a' = 'a'", True),
        ("'a' <> 'b'", True),
        ("TRUE = FALSE", False),
        ("TRUE <> FALSE", True),
        # logic
        ("n = 10 AND s = 'abc'", True),
        ("n = 10 AND s = 'x'", False),
        ("n = 1 OR s = 'abc'", True),
        ("n = 1 OR s = 'x'", False),
        ("NOT n = 1", True),
        ("NOT NOT n = 1", False),
        ("NOT (n = 1 OR s = 'x')", True),
        ("n = 1 OR s = 'abc' AND f = 2.5", True),
        ("(n = 1 OR s = 'abc') AND f = 3", False),
        ("n = 10 AND (s = 'x' OR (f > 2 AND b = TRUE))", True),
        ("((((n = 10))))", True),
    ],
)
def test_operators(expression: str, expected: bool | None) -> None:
    """``expected`` None means NULL: neither the expression nor its negation matches."""
    assert check(expression, PROPS) is (expected is True)
    assert check(f"NOT ({expression})", PROPS) is (expected is False)


def test_strings_with_quotes_and_unicode() -> None:
    assert check("q = 'it''s'", {"q": "it's"})
    assert check("q = ''''", {"q": "'"})
    assert check("q = ''", {"q": ""})
    assert check("q = 'ünï 标签 🎉'", {"q": "ünï 标签 🎉"})
    assert check("q IN ('a''b', 'c')", {"q": "a'b"})
    assert check("q = 'two\nlines'", {"q": "two\nlines"})
    assert check("q = 'AND OR ( )'", {"q": "AND OR ( )"})


def test_keywords_are_case_insensitive_identifiers_are_not() -> None:
    props = {"a": "1", "A": "2"}
    assert check("a is not null and A between 2 AnD 3", props)
    assert check("NoT a In ('2') oR FALSE", props)
    assert check("a = 1 AND A = 2", props)
    assert not check("A = 1", props)
    assert check("a Is NuLl", {})


def test_identifiers() -> None:
    assert check("_x.y_z9 = 'v'", {"_x.y_z9": "v"})
    assert check(
        "notes = 1 AND isx = 2 AND nullable = 3", {"notes": "1", "isx": "2", "nullable": "3"}
    )
    assert check("a.in = 'x'", {"a.in": "x"})
    assert check("n>1AND n<3", {"n": "2"})  # a keyword may follow a number directly
    with pytest.raises(FilterExpressionError):
        sql("n > 1 ANDn < 3")


@pytest.mark.parametrize("keyword", ["and", "OR", "Not", "between", "in", "IS", "null"])
def test_keywords_are_reserved(keyword: str) -> None:
    with pytest.raises(FilterExpressionError, match=r"reserved word|unexpected"):
        sql(f"{keyword} = 'x'")


def test_true_and_false_are_literals_not_names() -> None:
    with pytest.raises(FilterExpressionError, match=r"cannot compare TRUE \(a boolean\)"):
        sql("true = 'x'")
    assert check("false = FALSE", {"false": "no"})


def test_whitespace() -> None:
    assert check("\n\ta\t=\r\n1  AND\nb='x'\n", {"a": "1", "b": "x"})
    assert check("a=1", {"a": "1"})
    assert check("a>=-1", {"a": "0"})


# --------------------------------------------------------------------------- NULL logic

# Three atoms whose value is TRUE, FALSE or NULL depending on the properties.
T, F, N = "t = 1", "t = 2", "u = 1"  # t="1"; u missing
TRUTH = {T: True, F: False, N: None}


@pytest.mark.parametrize("left", [T, F, N])
@pytest.mark.parametrize("right", [T, F, N])
def test_three_valued_and_or(left: str, right: str) -> None:
    a, b = TRUTH[left], TRUTH[right]
    and_ = False if False in (a, b) else (None if None in (a, b) else True)
    or_ = True if True in (a, b) else (None if None in (a, b) else False)
    props = {"t": "1"}
    for expression, expected in ((f"{left} AND {right}", and_), (f"{left} OR {right}", or_)):
        assert check(expression, props) is (expected is True), expression
        assert check(f"NOT ({expression})", props) is (expected is False), expression


def test_null_cases() -> None:
    assert not check("x = 1", {})
    assert not check("NOT x = 1", {})
    assert not check("x <> 1", {})
    assert not check("x IN ('a')", {})
    assert not check("x NOT IN ('a')", {})
    assert not check("x BETWEEN 1 AND 2", {})
    assert not check("x NOT BETWEEN 1 AND 2", {})
    assert not check("x = y", {"x": "1"})
    assert not check("NOT x = y", {"x": "1"})
    assert check("x IS NULL OR x = 1", {})
    assert check("u = 1 OR TRUE", {})
    assert not check("u = 1 AND TRUE", {})
    assert check("NOT (u = 1 AND FALSE)", {})
    # BETWEEN is x >= lo AND x <= hi: a NULL bound still decides when the other side is FALSE
    assert check("NOT (5 BETWEEN lo AND 4)", {})
    assert not check("5 BETWEEN lo AND 6", {})
    assert not check("NOT (5 BETWEEN lo AND 6)", {})


# --------------------------------------------------------------------------- number conversion


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("10", 10),
        ("-3", -3),
        ("+4", 4),
        ("007", 7),
        ("2.5", 2.5),
        ("5.", 5),
        (".5", 0.5),
        ("1e2", 100),
        ("1E+2", 100),
        ("25e-1", 2.5),
        ("-0", 0),
        ("9" * 5000, float("inf")),  # beyond int()'s digit limit: compares as a float
        ("1e999", float("inf")),
    ],
)
def test_numeric_property_values(value: str, number: float) -> None:
    props = {"v": value}
    if number == float("inf"):
        assert check("v > 1e300", props)
        return
    assert check(f"v = {number!r}", props)
    assert check(f"v BETWEEN {number!r} AND {number!r}", props)
    assert not check(f"v <> {number!r}", props)


@pytest.mark.parametrize(
    "value",
    [
        "",
        " 5",
        "5 ",
        "0x10",
        "1_000",
        "١٢",
        "nan",
        "inf",
        "Infinity",
        "1e",
        "e5",
        ".",
        "--1",
        "1.2.3",
        "5,0",
        "abc",
    ],
)
def test_non_numeric_values_compare_as_null(value: str) -> None:
    props = {"v": value, "w": "5"}
    for expression in ("v = 5", "v <> 5", "v > 0", "v < 0", "v BETWEEN -100 AND 100", "v < w"):
        assert not check(expression, props), expression
        assert not check(f"NOT ({expression})", props), expression
    assert check(f"v = '{value}'", props)  # as text it is still itself
    assert check("v <> w", props)  # two properties with = / <> compare as text


def test_rocketmq_sample_expression() -> None:
    flt = sql(
        "(TAGS is not null and TAGS in ('TagA', 'TagB'))and (a is not null and a between 0 and 3)"
    )
    assert flt.matches({"TAGS": "TagB", "a": "3"})
    assert not flt.matches({"TAGS": "TagB", "a": "4"})
    assert not flt.matches({"TAGS": "TagC", "a": "1"})
    assert not flt.matches({"a": "1"})


def test_large_numbers_are_exact() -> None:
    assert not check("v = 9007199254740992", {"v": "9007199254740993"})
    big = str(2**63 + 1)
    assert check(f"v = {big}", {"v": big})
    assert not check(f"v = {2**63}", {"v": big})
    assert check(f"v > {2**63}", {"v": big})
    assert check("v > 1e300", {"v": "9" * 400})


def test_evaluation_never_raises_on_odd_values() -> None:
    flt = sql(
        "a > 1 OR a = 'x' OR a = TRUE OR a IN ('y') OR a BETWEEN b AND c OR a = b OR a < b "
        "OR NOT a IS NULL"
    )
    odd = ["", "\x00", "9" * 6000, "1e999999", "-1e999999", "ü" * 100, "'", "NULL", "\ud800"]
    for a in odd:
        for b in odd:
            flt.matches({"a": a, "b": b, "c": b})
    assert flt.matches_many([{"a": o} for o in odd]) == [flt.matches({"a": o}) for o in odd]


# --------------------------------------------------------------------------- errors and limits


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("a = ", "ends too early"),
        ("a =", "ends too early; expected"),
        ("(a = 1", "ends too early"),
        ("a = 1)", "unexpected ')' at column 6"),
        ("a == 1", "unexpected '=' at column 4"),
        ("a = 1 b", "unexpected 'b' at column 7"),
        ("a = 'abc", "unterminated string at column 5"),
        ("a = 'it''s", "unterminated string"),
        ("a IN ('x', 'y)", "unterminated string"),
        ("é = 1", "unexpected character 'é' at column 1"),
        ("a = 1 AND ñ = 2", "unexpected character 'ñ' at column 11"),
        ('a = "x"', "unexpected character '\"'"),
        ("a != 1", "unexpected character '!' at column 3; use <> for not equal"),
        ("a LIKE 'x%'", "LIKE is not supported"),
        ("a CONTAINS 'x'", "CONTAINS is not supported"),
        ("a AND", "ends too early"),
        ("AND a = 1", "unexpected 'AND' at column 1"),
        ("a = 1 AND OR b = 2", "unexpected 'OR'"),
        ("a IN ()", "unexpected ')'"),
        ("a IN 'x'", "unexpected"),
        ("a BETWEEN 1", "ends too early"),
        ("a BETWEEN 1 OR 2", "unexpected 'OR'"),
        ("a IS 1", "unexpected '1'"),
        ("a = 1\nAND b = = 2", "at line 2, column 9"),
        ("a", "a at column 1 is not a condition"),
        ("a AND b = 1", "a at column 1 is not a condition"),
        ("5", "is a number, not a condition"),
        ("'x'", "is a string, not a condition"),
        ("a > 'x'", "> compares numbers, but 'x' at column 5 is a string"),
        ("TRUE < a", "< compares numbers, but TRUE at column 1 is a boolean"),
        ("a BETWEEN 'a' AND 'z'", "BETWEEN compares numbers"),
        ("1 = 'a'", "cannot compare 1 (a number) with 'a' (a string)"),
        ("a = 1 OR TRUE = 'true'", "cannot compare TRUE (a boolean)"),
        ("a IN (1, 2)", "IN takes 'string' literals, but 1 at column 7 is a number"),
        ("a NOT IN ('x', TRUE)", "NOT IN takes 'string' literals"),
        ("5 IN ('5')", "IN compares strings, but 5"),
        ("a IN (b)", "IN takes 'string' literals, but b"),
        ("a = 0x10", "unexpected"),
        ("a = 1.2.3", "unexpected"),
        ("a = -'x'", "unexpected"),
        ("a = 1 ; DROP TABLE t", "unexpected character ';'"),
    ],
)
def test_errors(expression: str, message: str) -> None:
    with pytest.raises(
        FilterExpressionError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        sql(expression)


def test_error_message_names_the_expression_shortened() -> None:
    with pytest.raises(FilterExpressionError) as info:
        sql("a = 1 AND " * 20 + "=")
    text = str(info.value)
    assert "..." in text
    assert len(text) < 400


def test_length_limit() -> None:
    fits = "a = '" + "x" * (MAX_EXPRESSION_LENGTH - 6) + "'"
    assert len(fits) == MAX_EXPRESSION_LENGTH
    assert sql(fits).matches({"a": "x" * (MAX_EXPRESSION_LENGTH - 6)})
    for kind in ("SQL92", "TAG"):
        with pytest.raises(FilterExpressionError, match="4097 characters, the limit is 4096"):
            compile_filter(kind, fits + " ")
    with pytest.raises(FilterExpressionError, match="limit is 4096"):
        parse_tags("t" * 5000)


def test_depth_limit() -> None:
    ok = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    assert check(ok, {"a": "1"})
    with pytest.raises(FilterExpressionError, match="parentheses 33 deep, the limit is 32"):
        sql("(" + ok + ")")
    # parentheses inside strings do not count
    assert check("a = '" + "(" * 100 + "'", {"a": "(" * 100})
    nots = "NOT " * (MAX_DEPTH - 1) + "a = 1"
    assert check(nots, {"a": "2"}) is ((MAX_DEPTH - 1) % 2 == 1)
    with pytest.raises(FilterExpressionError, match="deeper than 32"):
        sql("NOT " + nots)
    with pytest.raises(FilterExpressionError, match="deeper than 32"):
        sql("NOT " * 1000 + "a = 1")
    nested = "a = 1 AND (" * 31 + "b = 1" + ")" * 31
    assert check(nested, {"a": "1", "b": "1"})
    with pytest.raises(FilterExpressionError, match="deeper than 32"):
        sql("a = 1 AND (" + nested + ")")


def test_long_flat_chains_are_fine() -> None:
    # 170 comparisons joined by OR: flat, 511 nodes (170 * 3 + the OR)
    chain = " OR ".join(f"a = {i}" for i in range(170))
    flt = sql(chain)
    assert flt.matches({"a": "169"})
    assert not flt.matches({"a": "170"})
    chain_and = " AND ".join(f"a <> {i}" for i in range(170))
    assert sql(chain_and).matches({"a": "170"})


def test_node_limit() -> None:
    chain = " OR ".join(f"a = {i}" for i in range(171))  # 171 * 3 + 1 = 514
    with pytest.raises(FilterExpressionError, match=f"more than {MAX_NODES} nodes"):
        sql(chain)
    with pytest.raises(FilterExpressionError, match="nodes"):
        sql(" OR ".join(f"a = {i}" for i in range(580))[:MAX_EXPRESSION_LENGTH].rsplit(" OR", 1)[0])


def test_in_list_limit() -> None:
    items = ", ".join(f"'v{i}'" for i in range(MAX_IN_ITEMS))
    flt = sql(f"a IN ({items})")
    assert flt.matches({"a": f"v{MAX_IN_ITEMS - 1}"})
    assert not flt.matches({"a": "v"})
    with pytest.raises(FilterExpressionError, match="IN list has 257 items, the limit is 256"):
        sql(f"a NOT IN ({items}, 'x')")


def test_failed_compiles_are_not_cached_as_successes() -> None:
    for _ in range(3):
        with pytest.raises(FilterExpressionError):
            sql("a = = 1")
