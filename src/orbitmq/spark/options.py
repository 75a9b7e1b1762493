"""Connector options: one parse at query start, so a typo or a contradiction fails before any
task runs, with a message that names the option.

Spark hands options over case-insensitively (keys lower-cased); the parsed result is a small
frozen dataclass that pickles into the planner, the streaming runner and every executor.
Both sides live here, the read options (:class:`SourceOptions`) and the write options
(:class:`SinkOptions`), on one set of parsing helpers (:func:`normalize`, :func:`get_bool`,
:func:`get_int`, :func:`get_duration_ms`, :func:`reject_unknown`).

Offsets JSON (``startingOffsets`` / ``endingOffsets`` and the checkpoint's offset log) is Kafka's
shape with RocketMQ's queue identity: ``{"<topic>": {"<broker>/<queue_id>": <offset>}}``. A queue
id alone is not unique in a multi-broker topic, so the key names the broker too. Offsets are
"next offset to read" (end-exclusive); in user JSON -2 means earliest and -1 latest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orbitmq.common.errors import ConfigError
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE
from orbitmq.spark.marker import DEFAULT_MARKER_TOPIC

__all__ = [
    "AT_LEAST_ONCE",
    "DEFAULT_PRODUCER_GROUP",
    "EARLIEST",
    "EXACTLY_ONCE",
    "LATEST",
    "SINK_OPTIONS",
    "OffsetSpec",
    "OptionError",
    "SinkOptions",
    "SourceOptions",
    "get_bool",
    "get_duration_ms",
    "get_int",
    "normalize",
    "parse_offsets_json",
    "parse_sink_options",
    "parse_source_options",
    "queue_key",
    "reject_unknown",
    "split_queue_key",
]

EARLIEST = -2
LATEST = -1


class OptionError(ConfigError):
    """A connector option is missing, unknown, malformed or contradicts another."""


def normalize(options: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased keys (Spark's options are case-insensitive), values as given."""
    return {str(k).lower(): str(v) for k, v in options.items()}


def reject_unknown(opts: Mapping[str, str], known: Iterable[str], what: str) -> None:
    """OptionError naming every option this side does not understand."""
    allowed = {k.lower() for k in known}
    unknown = sorted(k for k in opts if k not in allowed)
    if unknown:
        raise OptionError(
            f"unknown {what} option(s): {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known, key=str.lower))})"
        )


def get_bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={raw!r}: expected true or false")


def get_int(
    opts: Mapping[str, str], name: str, default: int | None, *, lo: int | None = None
) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r}: expected an integer") from None
    if lo is not None and value < lo:
        raise OptionError(f"option {name}={raw!r}: must be >= {lo}")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|)\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "": 1000.0, "m": 60_000.0, "min": 60_000.0, "h": 3_600_000.0}


def get_duration_ms(opts: Mapping[str, str], name: str, default_ms: int) -> int:
    """``500ms``, ``10s``, ``15m``, ``1h`` (a bare number is seconds)."""
    raw = opts.get(name.lower())
    if raw is None:
        return default_ms
    m = _DURATION.match(raw)
    if not m:
        raise OptionError(f"option {name}={raw!r}: expected a duration such as 30s, 15m, 500ms")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2).lower()])


def queue_key(broker: str, queue_id: int) -> str:
    """The offsets-JSON key of a queue: ``broker/queue_id``."""
    return f"{broker}/{queue_id}"


def split_queue_key(key: str) -> tuple[str, int]:
    broker, sep, qid = key.rpartition("/")
    if not sep or not broker or not qid.isdigit():
        raise OptionError(f"queue key {key!r}: expected '<broker>/<queue_id>', e.g. 'broker-a/0'")
    return broker, int(qid)


OffsetMap = dict[str, dict[str, int]]
"""topic -> queue key -> offset."""


def parse_offsets_json(name: str, raw: str, *, allow_earliest: bool = True) -> OffsetMap:
    """``{"topic": {"broker-a/0": 12, "broker-a/1": -2}}``, validated; OptionError naming
    ``name`` otherwise."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise OptionError(f"option {name}: not earliest, latest or JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise OptionError(f"option {name}: JSON must be an object of topics")
    out: OffsetMap = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map queue keys to offsets")
        per: dict[str, int] = {}
        for key, off in queues.items():
            broker, qid = split_queue_key(str(key))
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OptionError(f"option {name}: {topic}/{key} offset {off!r} is not an offset")
            if off == EARLIEST and not allow_earliest:
                raise OptionError(f"option {name}: {topic}/{key}: -2 (earliest) is not allowed")
            per[queue_key(broker, qid)] = off
        out[str(topic)] = per
    return out


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a range starts or ends: ``kind`` is earliest, latest, offsets or timestamp."""

    kind: str
    offsets: OffsetMap = field(default_factory=dict)
    timestamp_ms: int | None = None
    """For kind "timestamp" with one time for every queue."""
    timestamps: OffsetMap = field(default_factory=dict)
    """For kind "timestamp" per queue (``startingOffsetsByTimestamp``)."""


SOURCE_OPTIONS = (
    "namesrv", "topic", "topics", "topicPattern", "startingOffsets", "endingOffsets",
    "startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "failOnDataLoss",
    "tagExpression", "sqlFilter", "maxBytesPerPartition", "groupId", "commitToGroup",
    "pullBatchSize", "timeoutMs", "path", "accessKey", "secretKey",
)  # fmt: skip
"""Every option the source understands ("path" is what ``load(path)`` passes; unused)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    namesrv: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting: OffsetSpec = field(default_factory=lambda: OffsetSpec("earliest"))
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec("latest"))
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    fail_on_data_loss: bool = True
    tag_expression: str | None = None
    sql_filter: str | None = None
    max_bytes_per_partition: int = 64 * 1024 * 1024
    group_id: str | None = None
    commit_to_group: bool = False
    pull_batch_size: int = 8192
    timeout_s: float = 10.0
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    @property
    def filtered(self) -> bool:
        """A broker-side filter drops messages, so offsets are not contiguous in a pull."""
        return self.sql_filter is not None or (
            self.tag_expression is not None and self.tag_expression.strip() not in ("", "*")
        )

    def matches_topic(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def _starting(opts: Mapping[str, str], streaming: bool) -> OffsetSpec:
    given = [
        n
        for n in ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
        if n.lower() in opts
    ]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(given)} contradict each other: give one")
    if "startingtimestamp" in opts:
        ts = get_int(opts, "startingTimestamp", None, lo=0)
        return OffsetSpec("timestamp", timestamp_ms=ts)
    if "startingoffsetsbytimestamp" in opts:
        stamps = parse_offsets_json(
            "startingOffsetsByTimestamp", opts["startingoffsetsbytimestamp"]
        )
        for topic, per in stamps.items():
            for key, ts in per.items():
                if ts < 0:
                    raise OptionError(
                        f"option startingOffsetsByTimestamp: {topic}/{key} timestamp {ts} < 0"
                    )
        return OffsetSpec("timestamp", timestamps=stamps)
    raw = opts.get("startingoffsets", "latest" if streaming else "earliest").strip()
    if raw.lower() in ("earliest", "latest"):
        if raw.lower() == "latest" and not streaming:
            raise OptionError("option startingOffsets=latest is for streaming queries only")
        return OffsetSpec(raw.lower())
    return OffsetSpec("offsets", offsets=parse_offsets_json("startingOffsets", raw))


def _ending(opts: Mapping[str, str], streaming: bool) -> OffsetSpec:
    given = [n for n in ("endingOffsets", "endingTimestamp") if n.lower() in opts]
    if given and streaming:
        raise OptionError(f"option {given[0]} is for batch queries only")
    if len(given) > 1:
        raise OptionError("options endingOffsets and endingTimestamp contradict each other")
    if "endingtimestamp" in opts:
        return OffsetSpec("timestamp", timestamp_ms=get_int(opts, "endingTimestamp", None, lo=0))
    raw = opts.get("endingoffsets", "latest").strip()
    if raw.lower() == "latest":
        return OffsetSpec("latest")
    if raw.lower() == "earliest":
        raise OptionError("option endingOffsets=earliest makes an empty query; use latest or JSON")
    return OffsetSpec(
        "offsets", offsets=parse_offsets_json("endingOffsets", raw, allow_earliest=False)
    )


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate every read option; OptionError naming the first bad one."""
    opts = normalize(options)
    reject_unknown(opts, SOURCE_OPTIONS, "source")
    namesrv = opts.get("namesrv", "").strip()
    if not namesrv:
        raise OptionError("option namesrv is required (host:port of a NameServer, ';' between)")
    subs = [n for n in ("topic", "topics", "topicPattern") if n.lower() in opts]
    if len(subs) != 1:
        raise OptionError(
            "give exactly one of the options topic, topics, topicPattern"
            + (f" (got {', '.join(subs)})" if subs else "")
        )
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    if "topicpattern" in opts:
        pattern = opts["topicpattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option topicPattern={pattern!r}: {exc}") from None
    else:
        raw = opts.get("topic") or opts.get("topics") or ""
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError(f"option {subs[0]} names no topic")
        if "topic" in opts and len(topics) > 1:
            raise OptionError("option topic takes one topic; use topics for several")
    starting = _starting(opts, streaming)
    ending = _ending(opts, streaming)
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        for topic in spec.offsets or spec.timestamps:
            if (topics and topic not in topics) or (
                pattern is not None and not re.fullmatch(pattern, topic)
            ):
                raise OptionError(f"option {name} names topic {topic!r}, which is not subscribed")
    max_off = get_int(opts, "maxOffsetsPerTrigger", None, lo=1)
    min_off = get_int(opts, "minOffsetsPerTrigger", None, lo=1)
    if not streaming:
        for n in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if n.lower() in opts:
                raise OptionError(f"option {n} is for streaming queries only")
    if "maxtriggerdelay" in opts and min_off is None:
        raise OptionError("option maxTriggerDelay needs minOffsetsPerTrigger")
    if max_off is not None and min_off is not None and min_off > max_off:
        raise OptionError(
            f"option minOffsetsPerTrigger={min_off} exceeds maxOffsetsPerTrigger={max_off}"
        )
    tag_expr = opts.get("tagexpression")
    sql = opts.get("sqlfilter")
    if tag_expr is not None and sql is not None:
        raise OptionError("options tagExpression and sqlFilter contradict each other: give one")
    try:
        from orbitmq.common.filter import compile_filter

        if tag_expr is not None:
            compile_filter("TAG", tag_expr)
        if sql is not None:
            compile_filter("SQL92", sql)
    except ValueError as exc:
        name = "tagExpression" if tag_expr is not None else "sqlFilter"
        raise OptionError(f"option {name}: {exc}") from None
    group = opts.get("groupid")
    commit = get_bool(opts, "commitToGroup", group is not None)
    if commit and not group:
        raise OptionError("option commitToGroup needs groupId")
    timeout_ms = get_int(opts, "timeoutMs", 10_000, lo=100)
    assert timeout_ms is not None
    return SourceOptions(
        namesrv=namesrv,
        topics=topics,
        topic_pattern=pattern,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_off,
        min_offsets_per_trigger=min_off,
        max_trigger_delay_ms=get_duration_ms(opts, "maxTriggerDelay", 15 * 60 * 1000),
        fail_on_data_loss=get_bool(opts, "failOnDataLoss", True),
        tag_expression=tag_expr,
        sql_filter=sql,
        max_bytes_per_partition=get_int(opts, "maxBytesPerPartition", 64 << 20, lo=1024) or 0,
        group_id=group,
        commit_to_group=commit,
        pull_batch_size=get_int(opts, "pullBatchSize", 8192, lo=1) or 8192,
        timeout_s=timeout_ms / 1000.0,
        **credentials(opts),
    )


def credentials(opts: Mapping[str, str]) -> dict[str, str]:
    """Options accessKey and secretKey (docs/security.md): both or neither. Spark's default
    ``spark.redaction.regex``, ``(?i)secret|password|token|access[.]?key``, hides both names'
    values in the UI and the logs."""
    ak, sk = opts.get("accesskey", "").strip(), opts.get("secretkey", "")
    if bool(ak) != bool(sk):
        raise OptionError("options accessKey and secretKey go together")
    return {"access_key": ak, "secret_key": sk} if ak else {}


# ------------------------------------------------------------------------------------ sink

SINK_OPTIONS = (
    "namesrv",
    "topic",
    "producerGroup",
    "deliveryGuarantee",
    "markerTopic",
    "maxBatchMessages",
    "maxBatchBytes",
    "sendTimeout",
    "commitTimeout",
    "path",  # save(path) arrives as an option: refused below when set
    "checkpointLocation",  # Spark's own options, passed through to every sink: ignored
    "queryName",
    "accessKey",
    "secretKey",
)
DEFAULT_PRODUCER_GROUP = "orbitmq-spark-sink"
EXACTLY_ONCE = "exactlyOnce"
AT_LEAST_ONCE = "atLeastOnce"


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The write options, parsed (see docs/spark.md for each)."""

    namesrv: str
    topic: str | None
    group: str
    exactly_once: bool
    marker_topic: str
    max_batch_messages: int
    max_batch_bytes: int
    send_timeout_s: float
    commit_timeout_s: float
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """Parse and check the write options; OptionError naming the option otherwise."""
    opts = normalize(options)
    reject_unknown(opts, SINK_OPTIONS, "sink")
    if opts.get("path"):
        raise OptionError("option path: the orbitmq sink writes to topics (use option topic)")
    namesrv = opts.get("namesrv", "").strip()
    if not namesrv:
        raise OptionError("option namesrv is required (NameServer host:port, ';' between several)")
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option topic is empty")
    guarantee = opts.get("deliveryguarantee", EXACTLY_ONCE if streaming else AT_LEAST_ONCE)
    by_lower = {EXACTLY_ONCE.lower(): True, AT_LEAST_ONCE.lower(): False}
    if guarantee.strip().lower() not in by_lower:
        raise OptionError(
            f"option deliveryGuarantee={guarantee!r}: expected {EXACTLY_ONCE} or {AT_LEAST_ONCE}"
        )
    max_msgs = get_int(opts, "maxBatchMessages", 1000, lo=1)
    max_bytes = get_int(opts, "maxBatchBytes", 1024 * 1024, lo=1024)
    assert max_msgs is not None and max_bytes is not None
    if max_bytes > DEFAULT_MAX_MESSAGE_SIZE - 64 * 1024:
        raise OptionError(
            f"option maxBatchBytes={max_bytes}: at most {DEFAULT_MAX_MESSAGE_SIZE - 64 * 1024} "
            "(a half batch is one message on the broker)"
        )
    send_ms = get_duration_ms(opts, "sendTimeout", 10_000)
    commit_ms = get_duration_ms(opts, "commitTimeout", 60_000)
    if send_ms <= 0 or commit_ms <= 0:
        raise OptionError("options sendTimeout and commitTimeout must be > 0")
    group = opts.get("producergroup", DEFAULT_PRODUCER_GROUP).strip()
    if not group:
        raise OptionError("option producerGroup is empty")
    return SinkOptions(
        namesrv=namesrv,
        topic=topic.strip() if topic else None,
        group=group,
        exactly_once=by_lower[guarantee.strip().lower()],
        marker_topic=opts.get("markertopic", DEFAULT_MARKER_TOPIC).strip(),
        max_batch_messages=max_msgs,
        max_batch_bytes=max_bytes,
        send_timeout_s=send_ms / 1000.0,
        commit_timeout_s=commit_ms / 1000.0,
        **credentials(opts),
    )
