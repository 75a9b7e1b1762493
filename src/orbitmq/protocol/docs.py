"""The request tables of docs/protocol.md, generated from the typed headers (protocol/requests.py).

docs/protocol.md keeps its prose by hand; each request table sits between two markers,
``<!-- requests:SECTION -->`` and ``<!-- /requests:SECTION -->``, and is rewritten from the header
classes of that section: code, name, every field with its type, limits and default, the body,
and the response. ``python -m orbitmq.protocol.docs docs/protocol.md`` rewrites the file;
``--check`` exits 1 when it is stale, and a test (tests/protocol/test_protocol_doc.py) fails then.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from orbitmq.protocol import auth_requests, config_requests, controller_requests, requests
from orbitmq.protocol.header import I64_MAX, I64_MIN, FieldSpec, Header, fields_of

_BLOCK = re.compile(r"(<!-- requests:([a-z-]+) -->\n)(.*?)(<!-- /requests:\2 -->)", re.S)
_HEAD = "| code | name | request fields / body | response |\n| ---: | --- | --- | --- |\n"


def _num(n: int) -> str:
    """Powers of two above 2^16 as 2^k (2^30, 2^63-1), other numbers as they are."""
    for value, sign in ((n, ""), (-n, "-")):
        if value > 65536 and value & (value - 1) == 0:
            return f"{sign}2^{value.bit_length() - 1}"
    if n > 65536 and (n + 1) & n == 0:
        return f"2^{n.bit_length()}-1"
    return str(n)


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return _num(value)
    return f'"{value}"' if value == "" else str(value)


def field_text(spec: FieldSpec) -> str:
    """One field as the tables show it: name (type, limits, default: meaning)."""
    parts: list[str] = []
    if spec.kind not in ("str", "any"):
        parts.append(spec.kind)
    if spec.kind == "int" and (spec.lo > I64_MIN or spec.hi < I64_MAX):
        lo = _num(spec.lo) if spec.lo > I64_MIN else ""
        hi = _num(spec.hi) if spec.hi < I64_MAX else ""
        parts.append(f"{lo}..{hi}" if lo and hi else f"≥ {lo}" if lo else f"≤ {hi}")
    if spec.min_length is not None or spec.max_length is not None:
        parts.append(f"{spec.min_length or 0}-{spec.max_length} characters")
    if not spec.required:
        parts.append("optional" if spec.default is None else f"default {_default(spec.default)}")
    text = ", ".join(parts)
    if spec.doc:
        text = f"{text}: {spec.doc}" if text else spec.doc
    return f"`{spec.name}` ({text})" if text else f"`{spec.name}`"


def request_row(cls: type[Header]) -> str:
    fields = ", ".join(field_text(s) for s in fields_of(cls))
    if cls.body:
        fields = f"{fields}; body {cls.body}" if fields else f"body {cls.body}"
    name = cls.code.name + (" (broker → client, oneway)" if cls.oneway else "")
    cells = (str(int(cls.code)), name, fields or "\u2013", cls.response)  # an en dash: none
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def _declared() -> list[type[Header]]:
    """The header classes in the order requests.py declares them (related codes together)."""
    return [
        c
        for module in (requests, controller_requests, auth_requests, config_requests)
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, Header) and c in requests.REQUESTS.values()
    ]


def request_table(section: str) -> str:
    """The markdown table of one section's requests, in declaration order."""
    rows = [request_row(cls) for cls in _declared() if cls.section == section]
    if not rows:
        raise ValueError(f"no request is in section {section!r}")
    return _HEAD + "".join(rows)


def render(doc: str) -> str:
    """``doc`` with every marked request table regenerated."""
    return _BLOCK.sub(lambda m: m[1] + request_table(m[2]) + m[4], doc)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if len(paths) != 1:
        print("usage: python -m orbitmq.protocol.docs [--check] docs/protocol.md", file=sys.stderr)
        return 2
    path = Path(paths[0])
    text = path.read_text()
    new = render(text)
    if new == text:
        return 0
    if check:
        print(f"{path} is stale: run python -m orbitmq.protocol.docs {path}", file=sys.stderr)
        return 1
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
