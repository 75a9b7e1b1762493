"""`python -m orbitmq.bench security` runs on a small count and reports every ratio: the
encrypted store (append, hot read, both, cold read after a restart), TLS round trips, TLS
produce and consume, produce with ACL checks."""

from __future__ import annotations

from orbitmq.bench import security


def test_security_bench_runs_small() -> None:
    lines: list[str] = []
    results = security.run(640, lines.append)
    names = ("store", "store_append", "store_read", "store_cold_read", "remoting", "produce")
    for name in (*names, "consume", "acl_produce"):
        assert results[f"{name}_ratio"] > 0, name
    assert sum("encrypted" in line for line in lines) == 4
    assert sum("TLS" in line for line in lines) == 3
    assert sum("ACL on" in line for line in lines) == 1


def test_acl_pairs_run_small() -> None:
    """``--acl-pairs``: the ACL row alone, interleaved off/on pairs, medians printed."""
    lines: list[str] = []
    results = security.run_acl(320, 2, lines.append)
    assert results["acl_off_msg_s"] > 0 and results["acl_on_msg_s"] > 0
    # a cost only: 10 batches on a shared machine swing either way by more than 2x
    assert results["acl_cost"] < 1 and results["acl_pair_cost"] < 1
    assert results["acl_cpu_off_us"] > 0 and results["acl_cpu_on_us"] > 0
    assert sum(line.startswith("pair ") for line in lines) == 2
    assert "medians of 2" in lines[-1]


def test_acl_pairs_with_an_mtls_user_run_small() -> None:
    """``--acl-mtls``: the producer is named by its client certificate and signs nothing; its
    sends pass the ACL check (a refused one would fail the run)."""
    lines: list[str] = []
    results = security.run_acl(320, 1, lines.append, mtls=True)
    assert results["acl_off_msg_s"] > 0 and results["acl_on_msg_s"] > 0
    assert "mTLS user, no signature" in lines[-1]
