"""``orbitmq broker`` in its own process that SIGKILLs itself in the middle of a truncation, for
tests/chaos/test_ha_truncation_crash.py (repository root as the working directory)::

    ORBITMQ_TEST_CRASH_TRUNCATE_AT=<step> ORBITMQ_TEST_CRASH_MARK=<file> \
        python -m tests.chaos.crashing_broker broker --config ... --port ...

The broker is the real one (``orbitmq.cli.main``); only ``MessageStore.truncate_to`` is wrapped:
when the store reports ``<step>`` (one of ``orbitmq.store.truncate.STEPS``), the process writes
the cut offset and the step to ``<file>`` and sends itself SIGKILL there, as a crash at that
instant would stop it (nothing after the step runs; no cleanup).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from orbitmq.store.message_store import MessageStore

AT = os.environ.get("ORBITMQ_TEST_CRASH_TRUNCATE_AT", "")
MARK = os.environ.get("ORBITMQ_TEST_CRASH_MARK", "")


def _install() -> None:
    real = MessageStore.truncate_to

    def truncate_to(
        self: MessageStore, offset: int, *, step: Callable[[str], None] | None = None
    ) -> Any:
        def crash_at(name: str) -> None:
            if step is not None:
                step(name)
            if name == AT:
                with open(MARK, "w") as f:
                    f.write(f"{offset} {name} {self.commit_log.max_offset}\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)

        return real(self, offset, step=crash_at)

    MessageStore.truncate_to = truncate_to  # type: ignore[method-assign]


if __name__ == "__main__":
    if AT and MARK:
        _install()
    from orbitmq.cli.main import main

    main()
