"""In-process Raft clusters for deterministic tests: pysyncobj nodes ticked by hand."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orbitmq.controller.raft import RaftNode


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tick_until(nodes: list[RaftNode], cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached while ticking")
        for node in nodes:
            node.tick(0.002)


def leader_of(nodes: list[RaftNode]) -> RaftNode | None:
    leaders = [n for n in nodes if n.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


def run_command(
    nodes: list[RaftNode], node: RaftNode, name: str, *args: Any, timeout: float = 10.0
) -> Any:
    """Submit on ``node``, tick every node until the callback fires; (result, fail_reason)."""
    got: list[tuple[Any, int]] = []
    node.submit_callback(name, args, lambda r, e: got.append((r, e)))
    tick_until(nodes, lambda: bool(got), timeout)
    return got[0]


@contextmanager
def raft_cluster(base: Path, n: int = 3) -> Iterator[list[RaftNode]]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
    nodes = [
        RaftNode(a, [o for o in addrs if o != a], str(base / f"node{i}"), auto_tick=False)
        for i, a in enumerate(addrs)
    ]
    try:
        tick_until(nodes, lambda: leader_of(nodes) is not None)
        yield nodes
    finally:
        for node in nodes:
            node.destroy()
