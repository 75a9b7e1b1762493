"""ensure_ids' usual-case check (every message carries its id) in C agrees with the Python
one, and a send with a message missing its id still gets one either way."""

from __future__ import annotations

import random

import pytest

from orbitmq.broker import send_ids
from orbitmq.common.message import property_value
from orbitmq.protocol.messages import decode_send_body, encode_send_body

_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"


def _props(rng: random.Random) -> bytes:
    parts = [_UNIQ, b"\x02", b"x", b"TAGS\x01", b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX", b"\x01"]
    if rng.random() < 0.6:  # the usual shape: a name-value list with an id somewhere
        pairs = [b"WAIT\x01true", _UNIQ + rng.randbytes(rng.randint(0, 3)).hex().encode()]
        rng.shuffle(pairs)
        return b"\x02".join(pairs) + rng.choice([b"", b"\x02"])
    return b"".join(rng.choice(parts) for _ in range(rng.randint(0, 6)))


@pytest.mark.skipif(send_ids._HAS_EACH is None, reason="orbitmq._native not built")
def test_has_each_matches_property_value() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    has_each = send_ids._HAS_EACH
    assert has_each is not None
    for _ in range(2000):
        props = [_props(rng) for _ in range(rng.randint(1, 16))]
        want = all(property_value(p, _UNIQ) for p in props)
        assert has_each(props, _UNIQ) is want, props
        views: list[bytes] = [memoryview(p) for p in props]  # type: ignore[misc]  # C takes any buffer
        assert has_each(views, _UNIQ) is want


@pytest.mark.parametrize("native", [True, False])
def test_ids_assigned_alike(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(send_ids, "_HAS_EACH", None)
    props = [_UNIQ + b"A1\x02", b"TAGS\x01t\x02", b"WAIT\x01true\x02"]
    send = decode_send_body(encode_send_body([b"a", b"b", b"c"], props))
    ids = send_ids.ensure_ids(send)
    assert ids is not None and ids[0] == "A1" and ids[1] and ids[2]
    assert [property_value(p, _UNIQ) for p in send.properties] == [i.encode() for i in ids]
    full = decode_send_body(encode_send_body([b"a"], [_UNIQ + b"B2"]))
    assert send_ids.ensure_ids(full) is None
