"""A real cluster (1 NameServer, 2 brokers, as processes on 127.0.0.1) for the CLI tests.

``cli_cluster`` is shared by the tests of a module (starting processes is the slow part);
each test uses its own topics. ``cluster`` (tests/harness.py) is there for tests that need
their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.harness import ProcessCluster, cluster


@dataclass(frozen=True)
class CliCluster:
    namesrv: str
    brokers: dict[str, str]
    """broker name -> address."""


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliCluster]:
    c = ProcessCluster(tmp_path_factory.mktemp("cli-cluster"))
    try:
        ns = c.namesrv()
        a = c.broker("broker-a", [ns.address])
        b = c.broker("broker-b", [ns.address])
        yield CliCluster(ns.address, {"broker-a": a.address, "broker-b": b.address})
    finally:
        c.stop_all()


__all__ = ["CliCluster", "cli_cluster", "cluster"]
