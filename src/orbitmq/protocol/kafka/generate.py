"""Generate `messages_gen.py` from Kafka's JSON message definitions in `schema/`.

    python -m orbitmq.protocol.kafka.generate          # rewrite messages_gen.py
    python -m orbitmq.protocol.kafka.generate --check  # exit 1 if it is out of date

The output is a table of `schema_types.Message` objects, one per definition, with field names in
snake_case (`ThrottleTimeMs` -> `throttle_time_ms`) and defaults already parsed. It is data, not
code, so the codec compiles it once per (message, version). A test runs `--check`, so the
committed output always matches the committed definitions.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from orbitmq.protocol.kafka.schema_types import MAX_VERSION, NONE, PRIMITIVES

SCHEMA_DIR = Path(__file__).with_name("schema")
OUTPUT = Path(__file__).with_name("messages_gen.py")

# The APIs the gateway speaks; each needs <Name>Request.json and <Name>Response.json.
API_NAMES = (
    "ApiVersions", "Metadata", "CreateTopics", "DeleteTopics", "CreatePartitions", "Produce",
    "Fetch", "ListOffsets", "FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat",
    "LeaveGroup", "OffsetCommit", "OffsetFetch", "ListGroups", "DescribeGroups",
    "InitProducerId", "OffsetForLeaderEpoch", "DescribeConfigs", "DescribeCluster",
    "SaslHandshake", "SaslAuthenticate",
)  # fmt: skip
HEADERS = ("RequestHeader", "ResponseHeader")

_INT_KINDS = frozenset({"int8", "int16", "uint16", "int32", "uint32", "int64"})


def strip_comments(text: str) -> str:
    """Drop `//` comments, which Kafka's JSON files use, leaving `//` inside strings alone."""
    out: list[str] = []
    i, n, in_str = 0, len(text), False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def parse_versions(spec: str) -> tuple[int, int]:
    spec = spec.strip()
    if spec == "none":
        return NONE
    if spec.endswith("+"):
        return (int(spec[:-1]), MAX_VERSION)
    if "-" in spec:
        lo, hi = spec.split("-")
        return (int(lo), int(hi))
    return (int(spec), int(spec))


def snake(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def parse_default(kind: str, raw: Any) -> Any:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    if text == "null":
        return None
    if kind == "bool":
        return text == "true"
    if kind in _INT_KINDS:
        return int(text, 0)
    if kind == "float64":
        return float(text)
    return text


def field_source(spec: dict[str, Any], indent: str) -> str:
    """One `F(...)` expression for a field definition (recursing into struct fields)."""
    raw_type: str = spec["type"]
    args = [repr(snake(spec["name"]))]
    elem = ""
    if raw_type.startswith("[]"):
        kind = "array"
        inner = raw_type[2:]
        elem = inner if inner in PRIMITIVES else "struct"
    elif raw_type in PRIMITIVES:
        kind = raw_type
    else:
        kind = "struct"
    args.append(repr(kind))
    args.append(repr(parse_versions(spec.get("versions", "0+"))))
    if elem:
        args.append(f"elem={elem!r}")
    if "nullableVersions" in spec:
        args.append(f"nullable={parse_versions(spec['nullableVersions'])!r}")
    if "taggedVersions" in spec:
        args.append(f"tagged={parse_versions(spec['taggedVersions'])!r}")
        args.append(f"tag={int(spec['tag'])}")
    if "default" in spec:
        value = parse_default(elem or kind, spec["default"])
        args.append(f"default={value!r}")
        args.append("has_default=True")
    if "flexibleVersions" in spec:
        args.append(f"flexible={parse_versions(spec['flexibleVersions'])!r}")
    sub = spec.get("fields", [])
    if sub:
        inner_indent = indent + "    "
        items = "".join(f"{inner_indent}{field_source(f, inner_indent)},\n" for f in sub)
        args.append(f"fields=(\n{items}{indent})")
    return "F(" + ", ".join(args) + ")"


def message_source(path: Path) -> str:
    spec = json.loads(strip_comments(path.read_text()))
    indent = "            "
    fields = "".join(f"{indent}{field_source(f, indent)},\n" for f in spec["fields"])
    flexible = parse_versions(spec.get("flexibleVersions", "none"))
    return (
        f"    {spec['name']!r}: M(\n"
        f"        {spec['name']!r}, {spec.get('apiKey', -1)}, {spec['type']!r},"
        f" {parse_versions(spec['validVersions'])!r}, {flexible!r},\n"
        f"        (\n{fields}        ),\n    ),\n"
    ).replace("        (\n        ),", "        (),")


def render() -> str:
    names = list(HEADERS)
    for api in API_NAMES:
        names += [f"{api}Request", f"{api}Response"]
    body = "".join(message_source(SCHEMA_DIR / f"{n}.json") for n in names)
    return (
        '"""Kafka message definitions as tables: GENERATED by orbitmq.protocol.kafka.generate'
        ' from\nschema/*.json (Apache Kafka\'s definitions). Do not edit; regenerate."""\n\n'
        "from orbitmq.protocol.kafka.schema_types import Field as F\n"
        "from orbitmq.protocol.kafka.schema_types import Message as M\n\n"
        "MESSAGES: dict[str, M] = {\n" + body + "}\n"
    )


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT.name} is out of date: run python -m orbitmq.protocol.kafka.generate")
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
