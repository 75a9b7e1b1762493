"""The CLI's formatting helpers."""

from __future__ import annotations

import pytest
import typer

from orbitmq.cli.common import body_preview, parse_perm, perm_text, split_list


def test_body_preview_text_hex_and_cuts() -> None:
    assert body_preview(b"hello") == "hello"
    assert body_preview("grüße\n\tok".encode()) == "grüße\\n\\tok"
    assert body_preview(b"a" * 100, 10) == "a" * 10 + "…"
    assert body_preview(b"a" * 100, 0) == "a" * 100
    assert body_preview(b"\x00\x01\xff") == "hex:0001ff"
    assert body_preview(bytes(range(40)), 4) == "hex:00010203…"
    assert body_preview(b"bell\x07") == "hex:62656c6c07"  # valid UTF-8, not printable
    assert body_preview(b"\xc3") == "hex:c3"  # cut UTF-8


def test_split_list() -> None:
    assert split_list("a;b, c,,;") == ["a", "b", "c"]
    assert split_list(None) == [] and split_list("") == []


def test_perm() -> None:
    assert [parse_perm(p) for p in ("RW", "rw", "R", "W", "6", "4", "2", "7")] == [
        6, 6, 4, 2, 6, 4, 2, 7,
    ]  # fmt: skip
    assert perm_text(6) == "RW" and perm_text(4) == "R-" and perm_text(7) == "RW+inherit"
    for bad in ("X", "8", "-1", ""):
        with pytest.raises(typer.BadParameter):
            parse_perm(bad)
