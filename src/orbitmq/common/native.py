"""The optional C codec ``orbitmq._native``, or None: who may use it and how it is switched off.

The extension is built by setuptools at install when a C compiler is there (setup.py) and is
an accelerator only: every function in it has a Python reference in ``orbitmq.common.record``
that produces the same bytes (tests/common/test_native.py). It is OFF unless
``ORBITMQ_NATIVE=1`` is set in the environment before the process imports OrbitMQ: with it on,
the replicated-group partition test (tests/chaos/test_ha_partition.py) read back none of its
messages, which the Python codec reads back in full; until that is understood the Python codec
is the default (docs/native.md).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("ORBITMQ_NATIVE", "0") != "1":
        return None
    try:
        from orbitmq import _native
    except ImportError:  # not built here (no compiler at install): the Python codec serves
        return None
    return _native


NATIVE = _load()
"""The extension module, or None when the pure-Python codec is in use."""
