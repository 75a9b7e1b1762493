"""MQTT topic names and filters (5.0 §4.7, 3.1.1 §4.7): validation, matching, ``$share``.

- A topic name (PUBLISH) is at least one character and holds no wildcard.
- A topic filter (SUBSCRIBE) is at least one character; ``+`` fills a whole level and matches
  exactly one level (an empty one too); ``#`` fills the whole last level and matches that
  level's parent and everything below it ("sport/#" matches "sport").
- A filter whose first level is a wildcard never matches a name beginning with ``$``
  (§4.7.2): ``#`` and ``+/...`` see no ``$SYS/...`` topic; "$SYS/#" does.
- ``$share/{group}/{filter}`` (5.0 §4.8.2) is a shared subscription: the group is non-empty
  and holds no ``/``, ``+`` or ``#``; the filter after it is an ordinary non-empty filter.

:class:`TopicTrie` finds every filter matching a name in time bounded by the name's levels,
not by the number of subscriptions, for the gateway's online delivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from orbitmq.protocol.mqtt.wire import check_string

SHARE_PREFIX = "$share/"
V = TypeVar("V")


def _check_text(value: str, what: str) -> None:
    if not value:
        raise ValueError(f"{what} is empty")
    check_string(value)  # U+0000, surrogates, 65,535 bytes


def validate_topic_name(name: str) -> None:
    """ValueError if ``name`` may not be published to (5.0 §4.7.3, §3.3.2.1)."""
    _check_text(name, "topic name")
    if "+" in name or "#" in name:
        raise ValueError(f"topic name {name!r} holds a wildcard")


def validate_topic_filter(topic_filter: str) -> None:
    """ValueError if ``topic_filter`` is not a valid (non-shared) filter (5.0 §4.7.1)."""
    _check_text(topic_filter, "topic filter")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"'#' must be the whole last level: {topic_filter!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must fill a whole level: {topic_filter!r}")


@dataclass(frozen=True, slots=True)
class SharedFilter:
    group: str
    filter: str


def parse_shared(topic_filter: str) -> SharedFilter | None:
    """The group and filter of ``$share/{group}/{filter}``, None for an ordinary filter;
    ValueError if it starts with ``$share/`` but is not a valid shared subscription."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, sep, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or "+" in group or "#" in group:
        raise ValueError(f"shared subscription {topic_filter!r}: bad share name")
    if not sep or not rest:
        raise ValueError(f"shared subscription {topic_filter!r}: no topic filter")
    validate_topic_filter(rest)
    return SharedFilter(group, rest)


def validate_subscription(topic_filter: str) -> SharedFilter | None:
    """Validates an ordinary or shared filter; returns the shared parts if it is shared."""
    shared = parse_shared(topic_filter)
    if shared is None:
        validate_topic_filter(topic_filter)
    return shared


def has_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def matches(topic_filter: str, name: str) -> bool:
    """Whether the (valid, non-shared) ``topic_filter`` matches the topic ``name``."""
    if name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    n_levels = name.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(n_levels):
            return False
        if level != "+" and level != n_levels[i]:
            return False
    return len(f_levels) == len(n_levels)


@dataclass(slots=True)
class _Node(Generic[V]):
    children: dict[str, _Node[V]] = field(default_factory=dict)
    values: dict[object, V] = field(default_factory=dict)


class TopicTrie(Generic[V]):
    """Filters -> values keyed by an owner (a session, a group), matched against names."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, key: object, value: V) -> None:
        node = self._root
        for level in topic_filter.split("/"):
            node = node.children.setdefault(level, _Node())
        if key not in node.values:
            self._count += 1
        node.values[key] = value

    def remove(self, topic_filter: str, key: object) -> bool:
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if key not in node.values:
            return False
        del node.values[key]
        self._count -= 1
        for parent, level in reversed(path):  # prune empty branches
            child = parent.children[level]
            if child.values or child.children:
                break
            del parent.children[level]
        return True

    def match(self, name: str) -> Iterator[tuple[object, V]]:
        """Every (key, value) whose filter matches ``name`` (a key once per filter)."""
        levels = name.split("/")
        dollar = name.startswith("$")
        stack: list[tuple[_Node[V], int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            first = depth == 0
            multi = node.children.get("#")
            if multi is not None and not (first and dollar):
                yield from multi.values.items()
            if depth == len(levels):
                yield from node.values.items()
                continue
            exact = node.children.get(levels[depth])
            if exact is not None:
                stack.append((exact, depth + 1))
            single = node.children.get("+")
            if single is not None and not (first and dollar):
                stack.append((single, depth + 1))
