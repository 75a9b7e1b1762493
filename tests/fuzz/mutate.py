"""A small mutation fuzzer (no coverage feedback): random bytes, and valid seeds with bits
flipped, bytes replaced, inserted, deleted or duplicated, boundary integers written in, tails
cut and seeds spliced. Fast and dependency-free, for the bounded run in the normal suite; the
long coverage-guided runs use atheris (:mod:`tests.fuzz.run`)."""

from __future__ import annotations

import random

_INTERESTING = (
    b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00", b"\xff\xff", b"\x7f\xff", b"\x80\x00",
    b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00",
    b"\x00\x00\x00\x0c", b"\x00\x01\x00\x00",
)  # fmt: skip


def mutate(rng: random.Random, seeds: tuple[bytes, ...]) -> bytes:
    if not seeds or rng.random() < 0.1:
        return rng.randbytes(rng.randrange(0, 300))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randrange(1, 5)):
        size = len(data)
        op = rng.randrange(8)
        at = rng.randrange(size + 1)
        if op == 0 and size:
            data[at % size] ^= 1 << rng.randrange(8)
        elif op == 1 and size:
            data[at % size] = rng.randrange(256)
        elif op == 2:
            data[at:at] = rng.randbytes(rng.randrange(1, 16))
        elif op == 3 and size:
            del data[at : at + rng.randrange(1, 16)]
        elif op == 4 and size:
            end = min(size, at + rng.randrange(1, 32))
            data[at:at] = data[at:end]
        elif op == 5:
            value = rng.choice(_INTERESTING)
            data[at : at + len(value)] = value
        elif op == 6:
            del data[at:]
        else:
            other = rng.choice(seeds)
            data[at:] = other[rng.randrange(len(other) + 1) :]
    return bytes(data)
