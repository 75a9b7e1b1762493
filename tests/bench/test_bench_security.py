"""`python -m orbitmq.bench security` runs on a small count and reports both ratios."""

from __future__ import annotations

from orbitmq.bench import security


def test_security_bench_runs_small() -> None:
    lines: list[str] = []
    results = security.run(640, lines.append)
    assert results["store_ratio"] > 0 and results["remoting_ratio"] > 0
    assert any("encrypted" in line for line in lines)
    assert any("TLS" in line for line in lines)
