"""`orbitmq bench auth` runs on a small count and reports every mode (no speed is asserted)."""

from __future__ import annotations

import math

from typer.testing import CliRunner

from orbitmq.bench.auth import run_auth_bench
from orbitmq.cli.main import app


def test_bench_auth_small_count() -> None:
    results = run_auth_bench(count=50, batch=4, size=64)
    assert [r.mode for r in results] == ["off", "v1", "v2"]
    assert all(math.isfinite(r.check_us) and r.check_us > 0 for r in results)
    assert results[0].sign_us == 0 and results[2].sign_us > 0
    assert results[0].body_hmac_us == 0 and all(r.body_hmac_us > 0 for r in results[1:])
    result = CliRunner().invoke(app, ["bench", "auth", "--count", "20"], catch_exceptions=False)
    assert result.exit_code == 0 and "v2" in result.output and "body HMAC" in result.output
