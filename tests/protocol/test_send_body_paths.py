"""decode_send_body splits small sends with struct and larger ones with numpy: the same result
either way, and the same refusal of a body whose lengths do not add up."""

from __future__ import annotations

import random

import numpy as np
import pytest

from orbitmq.common.errors import ProtocolError
from orbitmq.protocol.messages import decode_send_body, encode_send_body


@pytest.mark.parametrize("n", [1, 4, 5, 15, 16, 17, 40])
def test_both_paths_split_alike(n: int) -> None:
    rng = random.Random(n)  # fixed seed per case: replayable
    bodies = [rng.randbytes(rng.randrange(0, 64)) for _ in range(n)]
    props = [rng.randbytes(rng.randrange(0, 20)) for _ in range(n)]
    got = decode_send_body(encode_send_body(bodies, props))
    assert [bytes(b) for b in got.bodies] == bodies
    assert got.properties == props
    assert got.body_lengths.dtype == np.int64 and got.body_lengths.tolist() == list(
        map(len, bodies)
    )
    assert got.properties_lengths.tolist() == list(map(len, props))
    assert got.properties_block == b"".join(props)
    starts = np.cumsum([0, *map(len, props)])[:-1].tolist()
    assert got.properties_starts.tolist() == starts


@pytest.mark.parametrize("n", [5, 16, 17])
def test_both_paths_refuse_bad_lengths(n: int) -> None:
    data = encode_send_body([b"x" * 8] * n, [b"p"] * n)
    with pytest.raises(ProtocolError):
        decode_send_body(data + b"extra")
    with pytest.raises(ProtocolError):
        decode_send_body(data[:-1])
