"""MQTT topic names, filters, matching (with a reference matcher) and $share parsing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitmq.protocol.mqtt.topics import (
    SharedFilter,
    TopicTrie,
    matches,
    parse_shared,
    validate_subscription,
    validate_topic_filter,
    validate_topic_name,
)

# 5.0 §4.7.1.2, §4.7.1.3, §4.7.2 examples, and a few edge cases of our own.
TABLE = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis", True),
    ("sport/tennis", "sport/tennis", True),
    ("sport/tennis", "sport/Tennis", False),
    ("sport/tennis", "sport/tennis/", False),
    ("#", "$SYS/broker/clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$SYS", False),
    ("a/+/#", "a/$b/c", True),  # only the first level is special
]


@pytest.mark.parametrize(("flt", "name", "expected"), TABLE)
def test_matching_table(flt: str, name: str, expected: bool) -> None:
    validate_topic_filter(flt)
    validate_topic_name(name)
    assert matches(flt, name) is expected
    trie: TopicTrie[int] = TopicTrie()
    trie.add(flt, "k", 1)
    assert (list(trie.match(name)) == [("k", 1)]) is expected


@pytest.mark.parametrize(
    "flt", ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "sp+rt/x", "##", "a/b\x00"]
)
def test_invalid_filters(flt: str) -> None:
    with pytest.raises(ValueError):
        validate_topic_filter(flt)


@pytest.mark.parametrize("name", ["", "a/+", "a/#", "+", "a\x00"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ValueError):
        validate_topic_name(name)


def test_shared_subscriptions() -> None:
    assert parse_shared("$share/g1/plant/+/temp") == SharedFilter("g1", "plant/+/temp")
    assert parse_shared("$share/g/#") == SharedFilter("g", "#")
    assert parse_shared("plant/#") is None
    assert validate_subscription("a/+") is None
    for bad in ("$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/#/a", "$share/g/a#"):
        with pytest.raises(ValueError):
            validate_subscription(bad)


def _reference(flt: str, name: str) -> bool:
    """A second matcher, written differently: the filter as a regular expression."""
    if name.startswith("$") and flt[:1] in "+#":
        return False
    parts = []
    for level in flt.split("/"):
        parts.append("[^/]*" if level == "+" else "#" if level == "#" else re.escape(level))
    pattern = "/".join(parts)
    if pattern.endswith("/#"):
        pattern = pattern[:-2] + "(/.*)?"
    elif pattern == "#":
        pattern = ".*"
    return re.fullmatch(pattern, name, re.DOTALL) is not None


levels = st.sampled_from(["a", "b", "", "$x", "c"])
names = st.lists(levels, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=1, max_size=4))
    if draw(st.booleans()):
        parts.append("#")
    return "/".join(parts) or "+"


@settings(max_examples=1000, deadline=None)
@given(filters(), names)
def test_matcher_agrees_with_reference(flt: str, name: str) -> None:
    validate_topic_filter(flt)
    assert matches(flt, name) == _reference(flt, name)


@settings(max_examples=200, deadline=None)
@given(st.lists(filters(), max_size=12, unique=True), names)
def test_trie_agrees_with_matcher(flts: list[str], name: str) -> None:
    trie: TopicTrie[str] = TopicTrie()
    for f in flts:
        trie.add(f, f, f)
    assert sorted(v for _, v in trie.match(name)) == sorted(f for f in flts if matches(f, name))
    for f in flts:
        assert trie.remove(f, f)
    assert len(trie) == 0 and not trie.remove("a", "a")
    assert list(trie.match(name)) == []
