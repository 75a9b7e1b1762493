"""docs/protocol.md's request tables are generated from the typed headers and kept current."""

from __future__ import annotations

from pathlib import Path

from orbitmq.protocol.docs import main, render, request_table
from orbitmq.protocol.requests import REQUESTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_protocol_doc_is_current() -> None:
    text = DOC.read_text()
    assert render(text) == text, "run: python -m orbitmq.protocol.docs docs/protocol.md"


def test_every_request_is_in_a_table_of_the_doc() -> None:
    text = DOC.read_text()
    for cls in REQUESTS.values():
        assert f"<!-- requests:{cls.section} -->" in text
        assert f"| {int(cls.code)} | {cls.code.name}" in request_table(cls.section)


def test_check_and_rewrite(tmp_path: Path) -> None:
    stale = tmp_path / "protocol.md"
    stale.write_text("intro\n<!-- requests:broker -->\nold\n<!-- /requests:broker -->\nend\n")
    assert main(["--check", str(stale)]) == 1
    assert main([str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0
    text = stale.read_text()
    assert text.startswith("intro\n<!-- requests:broker -->\n| code |") and "\nold\n" not in text
    assert "| 11 | PULL_MESSAGE | `topic`, `queue_id` (int, 0..2^30)" in text
    assert main([]) == 2
