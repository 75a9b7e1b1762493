"""The optional C codec ``orbitmq._native``, or None: who may use it and how it is switched off.

The extension is built by setuptools at install when a C compiler is there (setup.py) and is
an accelerator only: every function in it has a Python reference in ``orbitmq.common.record``
that produces the same bytes (tests/common/test_native.py). It is used whenever it was built,
unless ``ORBITMQ_NATIVE=0`` is set in the environment before the process imports OrbitMQ (then,
or without the extension, the Python codec serves). It was off by default for a while: a
replicated partition test read back nothing with it on; the cause was a NameServer routing the
group with no master after the partition healed, the same with either codec (docs/native.md).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("ORBITMQ_NATIVE", "1") == "0":
        return None
    try:
        from orbitmq import _native
    except ImportError:  # not built here (no compiler at install): the Python codec serves
        return None
    return _native


NATIVE = _load()
"""The extension module, or None when the pure-Python codec is in use."""
