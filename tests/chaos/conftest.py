"""Fixtures of the chaos tests: ``cluster`` (real server processes, tests/harness.py) and
``lab`` (three network namespaces on one bridge, tests/chaos/netns.py; skipped without root or
iproute2, with the reason), removed at the end whatever happened."""

from collections.abc import Iterator

import pytest

from tests.chaos.netns import NetLab, unavailable
from tests.harness import cluster


@pytest.fixture
def lab() -> Iterator[NetLab]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    made = NetLab(3).create()
    try:
        yield made
    finally:
        made.destroy()


__all__ = ["cluster", "lab"]
