"""Bounded fuzzing in the normal suite: ORBITMQ_FUZZ_RUNS inputs per decoder (10,000 by
default) from the mutation fuzzer; every decoder raises only its documented errors. The seed
is printed; ORBITMQ_SEED replays it. Long coverage-guided runs: ``make fuzz`` (atheris)."""

from __future__ import annotations

import os
import random

import pytest

from tests.fuzz.mutate import mutate
from tests.fuzz.targets import TARGETS, check

RUNS = int(os.environ.get("ORBITMQ_FUZZ_RUNS", "10000"))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_decoder_raises_only_its_documented_errors(name: str) -> None:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    target = TARGETS[name]
    for seed_input in target.seeds:
        check(target, seed_input)  # seeds (mostly valid ones, and past crashes) first
    for i in range(RUNS):
        data = mutate(rng, target.seeds)
        try:
            check(target, data)
        except Exception as exc:
            raise AssertionError(f"{name} input {i} (seed {seed}) raised: {data!r}") from exc
