"""``python -m tests.cli.exec_audit_child <record-file> <orbitmq args...>``: runs
``python -m orbitmq <args>`` with a ``sys.addaudithook`` hook that appends one line to
``<record-file>`` for every process-creation audit event the interpreter raises (subprocess,
os.system, the exec/spawn/posix_spawn family, fork), from any thread, start-up included.
Used by tests/cli/test_up_process.py (brief T14: "no child process"); with
``--probe`` instead of orbitmq arguments it starts ``true`` once, the control that the hook
records what it must.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from typing import Any

EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
    }
)


def main() -> None:
    record = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in EVENTS:
            record.write(f"{event} {repr(args)[:300]}\n")

    sys.addaudithook(hook)
    if sys.argv[2:] == ["--probe"]:
        subprocess.run(["true"], check=True)
        return
    sys.argv = ["orbitmq", *sys.argv[2:]]
    runpy.run_module("orbitmq", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
