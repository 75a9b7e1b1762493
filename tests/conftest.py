"""Session-wide set-up for every test: compiled bytecode for the child processes.

The suite starts hundreds of ``python -m orbitmq ...`` servers, consumers and CLI commands
(tests/harness.py, tests/cli, tests/crash, ...). With bytecode writing off
(``PYTHONDONTWRITEBYTECODE``, common in CI images and sandboxes) every one of them compiled all
~250 OrbitMQ modules it imports from source again: about 0.3 s of CPU per start, minutes over a
run on two cores. When writing is off, the children here get a bytecode cache of their own
instead (``PYTHONPYCACHEPREFIX``, a temporary folder outside the repository, removed at the end
of the run): the first child compiles, the others read. The source tree stays as clean as the
setting asked, and a run with writing on is left as it is (its ``__pycache__`` folders already
serve the children).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

_PYC_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
_saved: dict[str, str | None] = {}
_cache_dir: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return  # the run already has a cache of its own: children use it
    _saved.update({name: os.environ.get(name) for name in _PYC_ENV})
    folder = tempfile.mkdtemp(prefix="orbitmq-test-pyc-")
    _cache_dir.append(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved.clear()
    while _cache_dir:
        shutil.rmtree(_cache_dir.pop(), ignore_errors=True)
