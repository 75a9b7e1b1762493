"""The Spark connector's accessKey/secretKey options: parsed together, hidden by Spark's
default redaction and kept out of repr."""

from __future__ import annotations

import re

import pytest

from orbitmq.spark.options import OptionError, parse_sink_options, parse_source_options

SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
"""spark.redaction.regex's default (Spark's configuration docs)."""


def test_credentials_parse_and_are_redacted() -> None:
    src = parse_source_options(
        {"namesrv": "h:1", "topic": "t", "accessKey": "alice", "secretKey": "s3cr3t-value"},
        streaming=False,
    )
    assert (src.access_key, src.secret_key) == ("alice", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(src)
    sink = parse_sink_options(
        {"namesrv": "h:1", "accessKey": "alice", "secretKey": "s3cr3t-value"}, streaming=False
    )
    assert sink.access_key == "alice" and "s3cr3t-value" not in repr(sink)
    for name in ("accessKey", "secretKey", "spark.orbitmq.accessKey"):
        assert re.search(SPARK_DEFAULT_REDACTION, name), name
    with pytest.raises(OptionError):
        parse_source_options(
            {"namesrv": "h:1", "topic": "t", "accessKey": "alice"}, streaming=False
        )
    with pytest.raises(OptionError):
        parse_sink_options({"namesrv": "h:1", "secretKey": "x"}, streaming=False)
