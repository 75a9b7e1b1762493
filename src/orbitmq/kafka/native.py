"""The optional C speed-up of the gateway's Produce path, ``orbitmq._kafka_native``, or None.

Built by setup.py beside ``orbitmq._native`` when a C compiler is there, and switched off by
the same ``ORBITMQ_NATIVE=0`` (orbitmq.common.native). It is an accelerator only: its one
function, ``send_body``, gives the bytes :func:`orbitmq.kafka.mapping.to_send_body` gives for
the records it serves and declines (None) every other batch, so the Python mapping stays the
reference and serves alone without it (tests/kafka/test_kafka_native.py compares both).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("ORBITMQ_NATIVE", "1") == "0":
        return None
    try:
        from orbitmq import _kafka_native
    except ImportError:  # not built here: the Python mapping serves
        return None
    return _kafka_native


KAFKA_NATIVE = _load()
"""The extension module, or None when the Python mapping serves every batch."""
