"""`python -m orbitmq.bench <benchmark> [options]`; benchmarks: store, produce, spread, security,
tier, proxy."""

from __future__ import annotations

import os
import shlex
import sys

from orbitmq.bench import produce, proxy_bench, security, spread, store, tier

BENCHMARKS = {
    "store": store.main,
    "produce": produce.main,
    "spread": spread.main,
    "security": security.main,
    "tier": tier.main,
    "proxy": proxy_bench.main,
}


def _python() -> str:
    exe = sys.executable
    rel = os.path.relpath(exe)
    return rel if not rel.startswith("..") else exe


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in BENCHMARKS:
        print(
            f"usage: python -m orbitmq.bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr
        )
        if args and args[0] not in ("-h", "--help"):
            print(f"unknown benchmark {args[0]!r}", file=sys.stderr)
            return 2
        return 0 if args else 2
    command = shlex.join([_python(), "-m", "orbitmq.bench", *args])
    return BENCHMARKS[args[0]](args[1:], command)


if __name__ == "__main__":
    sys.exit(main())
