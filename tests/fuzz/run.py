"""Coverage-guided fuzzing of one decoder with atheris (libFuzzer).

    python -m tests.fuzz.run TARGET [libFuzzer flags, e.g. -runs=1000000 -max_len=65536]

``make fuzz`` runs every target (ORBITMQ_FUZZ_RUNS inputs each, 1,000,000 by default). The
target's seeds start the corpus; only OrbitMQ's modules are instrumented. An input raising
anything but the target's documented errors is a crash: libFuzzer writes it to
``crash-<sha1>`` and exits non-zero. ``python -m tests.fuzz.run TARGET crash-<sha1>`` replays it.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["orbitmq"]):
    from tests.fuzz.targets import TARGETS, check


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[sys.argv[1]]
    args = [sys.argv[0], *sys.argv[2:]]
    if not any(not a.startswith("-") for a in args[1:]):  # no corpus given: seed one
        corpus = tempfile.mkdtemp(prefix=f"orbitmq-fuzz-{target.name}-")
        for i, seed in enumerate(target.seeds):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(seed)
        args.append(corpus)

    def one_input(data: bytes) -> None:
        check(target, data)

    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
