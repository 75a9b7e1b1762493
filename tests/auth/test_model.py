"""ACL 2.0 evaluation: RocketMQ's most-specific-entry-wins, default deny, IP ranges, retry topics;
and a differential check against a small independent model of the brief's section 2.4."""

from __future__ import annotations

import random

import pytest

from orbitmq.auth.model import (
    Action,
    ConfigurationError,
    Decision,
    PolicyEntry,
    Resource,
    ResourceType,
    User,
    UserType,
    check,
    decide,
)

ALICE = User("alice")
PUB, SUB = Action.PUB, Action.SUB
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


def e(res: str, acts: str, dec: str = "Allow", ips: tuple[str, ...] = ()) -> PolicyEntry:
    return PolicyEntry.make(res, acts.split(","), dec, ips)


def allowed(entries: list[PolicyEntry], *checks: object, ip: str = "10.0.0.1") -> bool:
    return decide(ALICE, entries, list(checks), ip).allowed  # type: ignore[arg-type]


def test_literal_allow_beats_prefixed_deny_and_back() -> None:
    entries = [e("Topic:orders", "Pub"), e("Topic:ord*", "Pub", "Deny")]
    assert allowed(entries, check(TOPIC, "orders", PUB))
    assert not allowed(entries, check(TOPIC, "ordinal", PUB))
    entries = [e("Topic:orders", "Pub", "Deny"), e("Topic:*", "Pub")]
    assert not allowed(entries, check(TOPIC, "orders", PUB))
    assert allowed(entries, check(TOPIC, "other", PUB))


def test_longer_prefix_wins_and_typed_beats_any() -> None:
    entries = [e("Topic:a*", "Pub", "Deny"), e("Topic:ab*", "Pub"), e("*", "All", "Deny")]
    assert allowed(entries, check(TOPIC, "abc", PUB))
    assert not allowed(entries, check(TOPIC, "axe", PUB))
    assert not allowed(entries, check(GROUP, "g", SUB))


def test_deny_wins_a_tie() -> None:
    # Two entries cannot share a resource in the store; the evaluator still breaks a tie to Deny.
    entries = [e("Topic:t", "Pub"), e("Topic:t", "Pub", "Deny")]
    assert not allowed(entries, check(TOPIC, "t", PUB))


def test_default_deny_actions_and_all() -> None:
    assert not allowed([], check(TOPIC, "t", PUB))
    assert not allowed([e("Topic:t", "Sub")], check(TOPIC, "t", PUB))
    assert allowed([e("Topic:t", "All")], check(TOPIC, "t", PUB))
    # one of the requested actions suffices (a route lookup asks Pub|Sub|Get)
    assert allowed([e("Topic:t", "Sub")], check(TOPIC, "t", PUB, SUB, Action.GET))
    # every check must pass
    assert not allowed([e("Topic:t", "Sub")], check(TOPIC, "t", SUB), check(GROUP, "g", SUB))


def test_source_ips() -> None:
    entries = [e("Topic:t", "Pub", ips=("10.0.0.0/8", "192.168.1.7"))]
    assert allowed(entries, check(TOPIC, "t", PUB), ip="10.2.3.4")
    assert allowed(entries, check(TOPIC, "t", PUB), ip="192.168.1.7")
    assert not allowed(entries, check(TOPIC, "t", PUB), ip="192.168.1.8")
    assert not allowed(entries, check(TOPIC, "t", PUB), ip="not-an-ip")


def test_retry_topic_is_its_group() -> None:
    chk = check(TOPIC, "%RETRY%g1", SUB)
    assert chk.resource == Resource(GROUP, "g1", Resource.parse("Group:g1").pattern)
    assert allowed([e("Group:g1", "Sub")], chk)


def test_super_disabled_unknown() -> None:
    chk = check(TOPIC, "t", PUB)
    assert decide(User("root", UserType.SUPER), None, [chk], "1.1.1.1").allowed
    assert not decide(User("x", UserType.SUPER, enabled=False), None, [chk], "1.1.1.1").allowed
    assert not decide(None, None, [chk], "1.1.1.1").allowed


@pytest.mark.parametrize(
    "bad",
    [
        ("Topic:t", "Any", "Allow", ()),
        ("Topic:t", "", "Allow", ()),
        ("Nope:t", "Pub", "Allow", ()),
        ("Topic:t", "Pub", "Maybe", ()),
        ("Topic:t", "Pub", "Allow", ("300.1.1.1",)),
        ("Topic:", "Pub", "Allow", ()),
    ],
)
def test_invalid_entries_are_refused(bad: tuple[str, str, str, tuple[str, ...]]) -> None:
    res, acts, dec, ips = bad
    with pytest.raises(ConfigurationError):
        PolicyEntry.make(res, [a for a in acts.split(",") if a], dec, ips)


def test_entry_round_trip() -> None:
    entry = e("Group:g*", "Sub,Get", "Deny", ("10.0.0.0/8",))
    assert PolicyEntry.from_json(entry.to_json()) == entry
    assert str(Resource.parse("Topic:*")) == "Topic:*"
    assert Decision.parse("deny") is Decision.DENY


def _reference(entries: list[tuple[str, str, str, str]], rtype: str, name: str, act: str) -> bool:
    """The brief's section 2.4 written independently: filter, rank, take the first."""
    ranked = []
    for res, pattern, acts, dec in entries:
        if res == "*":
            kind, key = None, (1, 2, 0)
        else:
            kind, pat = res.split(":", 1)
            if kind != rtype:
                continue
            if pattern == "any":
                key = (0, 2, 0)
            elif pattern == "lit":
                if pat != name:
                    continue
                key = (0, 0, -len(pat))
            else:
                if not name.startswith(pat[:-1]):
                    continue
                key = (0, 1, -len(pat) + 1)
        if act not in acts.split(",") and "All" not in acts.split(","):
            continue
        ranked.append((key, 0 if dec == "Deny" else 1, dec))
    return bool(ranked) and min(ranked)[2] == "Allow"


def test_differential_against_reference_model() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    names = ["a", "ab", "abc", "b", "ba"]
    for _ in range(400):
        entries: dict[str, tuple[str, str, str, str]] = {}
        for _ in range(rng.randrange(0, 6)):
            kind = rng.choice(["Topic", "Group", "*"])
            form = rng.choice(["lit", "pre", "any"])
            name = rng.choice(names)
            res = (
                "*"
                if kind == "*"
                else f"{kind}:{ {'lit': name, 'pre': name + '*', 'any': '*'}[form] }"
            )
            acts = ",".join(rng.sample(["Pub", "Sub", "Get", "All"], rng.randrange(1, 3)))
            entries[res] = (res, form, acts, rng.choice(["Allow", "Deny"]))
        rtype, name, act = (
            rng.choice(["Topic", "Group"]),
            rng.choice(names),
            rng.choice(["Pub", "Sub", "Get"]),
        )
        model = [PolicyEntry.make(r, a.split(","), d) for r, _f, a, d in entries.values()]
        rt = TOPIC if rtype == "Topic" else GROUP
        got = decide(ALICE, model, [check(rt, name, Action.parse(act))], "1.2.3.4").allowed
        assert got == _reference(list(entries.values()), rtype, name, act), (
            seed,
            entries,
            rtype,
            name,
            act,
        )
