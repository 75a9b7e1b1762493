"""Controller tests: pysyncobj 0.3.17 reads its journal's meta file with a bare ``open().read()``
(journal.py, on every restart from a data dir); the unclosed file is reported when collected.
That is its bug, harmless, and only that warning is ignored here."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_PYSYNCOBJ_META_LEAK = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <_io\.FileIO name=.*raft\.journal\.meta"
    ":pytest.PytestUnraisableExceptionWarning"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(_PYSYNCOBJ_META_LEAK)
