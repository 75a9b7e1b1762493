"""Typed request headers: round trips, limits, the get_* readers' rules, and garbage."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbitmq.common.codes import ResponseCode
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.fields import FieldError, get_int, get_str, get_str_list
from orbitmq.protocol.frame import Frame, FrameDecoder, encode_bytes
from orbitmq.protocol.header import I64_MAX, I64_MIN, FieldSpec, Header
from orbitmq.protocol.limits import MAX_BATCH_ACK, MAX_PULL_MESSAGES_UNFILTERED
from orbitmq.protocol.requests import (
    REQUESTS,
    GetMaxOffsetRequest,
    PopMessageRequest,
    PullMessageRequest,
    RegisterBrokerRequest,
    ResetOffsetRequest,
    UpdateConsumerOffsetRequest,
    ViewMessageRequest,
    fields_of,
    request_class,
)

ALL = sorted(REQUESTS.values(), key=lambda c: int(c.code))

_VALID_STR = {
    "cluster": "DefaultCluster",
    "broker_name": "broker-a",
    "topic": "T_1",
    "password": "password-",
}


def _value(spec: FieldSpec, variant: int) -> Any:
    """A valid value of the field; variant 1 differs from the default."""
    if spec.kind == "int":
        lo = max(spec.lo, -5)
        return min(lo + 1 + variant, spec.hi)
    if spec.kind == "str":
        if spec.name == "broker_addr":
            return f"10.0.0.{variant}:10911"
        return _VALID_STR.get(spec.name, "v") + str(variant)
    if spec.kind == "bool":
        return bool(variant)
    if spec.kind == "list[str]":
        return ["a", "b"][: variant + 1]
    return f"handle-{variant}"


def _sample(cls: type[Header], variant: int) -> Header:
    return cls(**{s.name: _value(s, variant) for s in fields_of(cls)})


def _wire(frame: Frame) -> Frame:
    (got,) = FrameDecoder().feed(encode_bytes(frame))
    return got


def test_every_request_code_has_a_class() -> None:
    assert set(REQUESTS) == set(RequestCode)
    for code, cls in REQUESTS.items():
        assert cls.code is code and cls.section and cls.response
        assert request_class(int(code)) is cls
    assert request_class(65000) is None


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
@pytest.mark.parametrize("variant", [0, 1])
def test_round_trip(cls: type[Header], variant: int) -> None:
    sent = _sample(cls, variant)
    body = b"" if cls is not UpdateConsumerOffsetRequest else b"x"
    frame = _wire(sent.frame(body, opaque=7))
    assert frame.code == cls.code and frame.opaque == 7
    assert cls.decode(frame) == sent
    assert cls.from_fields(sent.to_header()) == sent


def test_the_documented_wire_bytes() -> None:
    frame = GetMaxOffsetRequest(topic="T", queue_id=0).frame(opaque=7)
    assert encode_bytes(frame).hex(" ") == (
        "00 00 00 1f 01 00 00 1e 00 00 00 07 00 00 00 13 82 a5 74 6f 70 69 63 a1 54 a8 71 75 65 "
        "75 65 5f 69 64 00"
    )


def test_defaults_stay_off_the_wire_and_required_fields_on() -> None:
    pull = PullMessageRequest(topic="T", queue_id=0, queue_offset=0)
    assert pull.to_header() == {"topic": "T", "queue_id": 0, "queue_offset": 0}
    assert pull.max_msg_nums == 32 and pull.group == "" and pull.commit_offset == -1
    assert pull.tags is None and not pull.has_expression
    pull = PullMessageRequest(
        topic="T", queue_id=1, queue_offset=2, max_msg_nums=512, tags=["a"], expression="*"
    )
    assert pull.to_header() == {
        "topic": "T", "queue_id": 1, "queue_offset": 2, "max_msg_nums": 512, "tags": ["a"],
        "expression": "*",
    }  # fmt: skip
    assert pull.has_expression


def test_absent_and_nil_are_the_default() -> None:
    base = {"group": "G", "topic": "T", "invisible_time_ms": 1000}
    assert PopMessageRequest.from_fields(base) == PopMessageRequest.from_fields(
        {**base, "queue_id": None, "expression": None, "unknown": [1, 2]}
    )
    got = PopMessageRequest.from_fields(base)
    assert (got.queue_id, got.expression_type, got.expression) == (-1, "TAG", "*")
    assert got.consume_from_where == "LAST_OFFSET" and got.max_msg_nums == 32


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_limits_and_types_are_refused(cls: type[Header]) -> None:
    good = _sample(cls, 1).to_header()
    for spec in fields_of(cls):

        def refused(value: Any, name: str = spec.name) -> str:
            with pytest.raises(FieldError) as err:
                cls.decode(Frame(cls.code, fields={**good, name: value}, body=b"x"))
            assert err.value.code == ResponseCode.MESSAGE_ILLEGAL
            return str(err.value)

        if spec.required:
            missing = {k: v for k, v in good.items() if k != spec.name}
            with pytest.raises(FieldError, match=f"field '{spec.name}' is required"):
                cls.from_fields(missing)
            assert refused(None) == f"field '{spec.name}' is required"
        if spec.kind == "int":
            assert refused(True) == f"field '{spec.name}' must be an integer, not bool"
            assert refused("1") == f"field '{spec.name}' must be an integer, not str"
            bounds = f"[{spec.lo}, {spec.hi}]"
            if spec.lo > I64_MIN:
                assert (
                    refused(spec.lo - 1)
                    == f"field '{spec.name}' = {spec.lo - 1} is outside {bounds}"
                )
            if spec.hi < I64_MAX:
                assert (
                    refused(spec.hi + 1)
                    == f"field '{spec.name}' = {spec.hi + 1} is outside {bounds}"
                )
        elif spec.kind == "str":
            assert refused(1) == f"field '{spec.name}' must be a string, not int"
        elif spec.kind == "bool":
            assert refused(1) == f"field '{spec.name}' must be a boolean, not int"
        elif spec.kind == "list[str]":
            assert refused([1]) == f"field '{spec.name}' must be a list of strings"


def test_documented_limits() -> None:
    def pull(**fields: Any) -> PullMessageRequest:
        return PullMessageRequest.from_fields(
            {"topic": "T", "queue_id": 0, "queue_offset": 0, **fields}
        )

    assert pull(max_msg_nums=MAX_PULL_MESSAGES_UNFILTERED).max_msg_nums == 16384
    for bad in ({"max_msg_nums": 0}, {"max_msg_nums": 16385}, {"queue_id": -1},
                {"queue_id": (1 << 30) + 1}, {"max_bytes": 16 * 1024 * 1024 + 1}):  # fmt: skip
        with pytest.raises(FieldError, match="is outside"):
            pull(**bad)
    with pytest.raises(FieldError, match=r"= 99 is outside \[100, 43200000\]"):
        PopMessageRequest.from_fields({"group": "G", "topic": "T", "invisible_time_ms": 99})
    with pytest.raises(FieldError, match="must be 1-127 characters"):
        RegisterBrokerRequest.from_fields(
            {"cluster": "a b", "broker_name": "b", "broker_id": 0, "broker_addr": "h:1"}
        )
    for addr in ("h", "h:0", "h:65536", "h:x", ":1"):
        with pytest.raises(FieldError, match="is not host:port"):
            RegisterBrokerRequest.from_fields(
                {"cluster": "c", "broker_name": "b", "broker_id": 0, "broker_addr": addr}
            )
    assert MAX_BATCH_ACK == 4096


def test_rules_across_fields() -> None:
    view = ViewMessageRequest.decode(Frame(RequestCode.VIEW_MESSAGE_BY_ID, fields={"offset": 5}))
    assert view.offset == 5 and view.topic is None
    with pytest.raises(FieldError, match="field 'msg_id' is required"):
        ViewMessageRequest.decode(Frame(RequestCode.VIEW_MESSAGE_BY_ID, fields={"topic": "T"}))
    update = Frame(RequestCode.UPDATE_CONSUMER_OFFSET, fields={"group": "G"})
    with pytest.raises(FieldError, match="field 'topic' is required"):
        UpdateConsumerOffsetRequest.decode(update)
    update.body = b"offsets body"
    assert UpdateConsumerOffsetRequest.decode(update).group == "G"
    reset = {"group": "G", "topic": "T", "position": "timestamp"}
    with pytest.raises(FieldError, match="field 'timestamp_ms' is required"):
        ResetOffsetRequest.decode(Frame(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields=reset))
    reset["position"] = "latest"
    assert ResetOffsetRequest.from_fields(reset).timestamp_ms is None


field_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_NAMES = [*sorted({s.name for cls in ALL for s in fields_of(cls)}), "x"]
garbage_maps = st.dictionaries(st.sampled_from(_NAMES), field_values, max_size=8)


@given(st.sampled_from(ALL), garbage_maps, st.binary(max_size=4))
def test_garbage_headers_raise_only_field_error(
    cls: type[Header], fields: dict[str, Any], body: bytes
) -> None:
    try:
        got = cls.decode(Frame(cls.code, fields=fields, body=body))
    except FieldError:
        return
    assert cls.from_fields(got.to_header()) == got  # what decodes also re-encodes the same


def _legacy_pull(frame: Frame) -> tuple[Any, ...]:
    """What the broker's pull handler read with the get_* helpers before the typed headers."""
    return (
        get_str(frame, "topic"),
        get_int(frame, "queue_id", lo=0, hi=1 << 30),
        get_int(frame, "queue_offset", lo=0),
        get_int(frame, "max_msg_nums", 32, lo=1, hi=16384),
        get_int(frame, "max_bytes", 4 * 1024 * 1024, lo=1, hi=16 * 1024 * 1024),
        get_str_list(frame, "tags"),
        *(
            (get_str(frame, "expression_type", "TAG"), get_str(frame, "expression", "*"))
            if "expression" in frame.fields or "expression_type" in frame.fields
            else ()
        ),
        get_int(frame, "suspend_timeout_ms", 0, lo=0),
        get_str(frame, "group", ""),
        get_int(frame, "commit_offset", -1),
    )


def _legacy_pop(frame: Frame) -> tuple[Any, ...]:
    return (
        get_str(frame, "group"),
        get_str(frame, "topic"),
        get_int(frame, "queue_id", -1, lo=-1, hi=1 << 30),
        get_str(frame, "consume_from_where", "LAST_OFFSET"),
        get_str(frame, "client_id", ""),
        get_int(frame, "poll_time_ms", 0, lo=0, hi=2**31),
        get_int(frame, "max_msg_nums", 32, lo=1, hi=1024),
        get_int(frame, "invisible_time_ms", lo=100, hi=12 * 3600 * 1000),
        get_str(frame, "expression_type", "TAG"),
        get_str(frame, "expression", "*"),
    )


def _typed(cls: type[Header], frame: Frame, names: tuple[str, ...]) -> tuple[Any, ...]:
    got = cls.decode(frame)
    out = [getattr(got, n) for n in names]
    if isinstance(got, PullMessageRequest) and got.has_expression:
        out[6:6] = [got.expression_type or "TAG", got.expression or "*"]
    return tuple(out)


_PULL = ("topic", "queue_id", "queue_offset", "max_msg_nums", "max_bytes", "tags",
         "suspend_timeout_ms", "group", "commit_offset")  # fmt: skip
_POP = tuple(s.name for s in fields_of(PopMessageRequest))
_small = (
    st.none() | st.booleans() | st.integers(-3, 2**31 + 3) | st.text(max_size=3) | st.just(["a"])
)


@given(st.dictionaries(st.sampled_from(_PULL + _POP), _small, max_size=12))
def test_same_answers_as_the_get_readers(fields: dict[str, Any]) -> None:
    for cls, legacy, names in ((PullMessageRequest, _legacy_pull, _PULL),
                               (PopMessageRequest, _legacy_pop, _POP)):  # fmt: skip
        frame = Frame(cls.code, fields=fields)
        try:
            want: Any = legacy(frame)
        except FieldError as exc:
            want = str(exc)
        try:
            got: Any = _typed(cls, frame, names)
        except FieldError as exc:
            got = str(exc)
        assert got == want


def _slow(cls: type[Header], fields: dict[str, Any]) -> Any:
    """The field-by-field rules alone (what from_fields falls back to)."""
    try:
        return cls(**{s.name: s.read(fields) for s in fields_of(cls)})
    except FieldError as exc:
        return str(exc)


@given(st.sampled_from(ALL), garbage_maps)
def test_the_msgspec_fast_path_agrees_with_the_rules(
    cls: type[Header], fields: dict[str, Any]
) -> None:
    try:
        got: Any = cls.from_fields(fields)
    except FieldError as exc:
        got = str(exc)
    assert got == _slow(cls, fields)


def test_uint64_tuples_and_unbounded_ints() -> None:
    base = {"topic": "T", "queue_id": 0}
    with pytest.raises(FieldError) as err:
        PullMessageRequest.from_fields({**base, "queue_offset": 2**63})  # a msgpack uint64
    assert str(err.value) == f"field 'queue_offset' = {2**63} is outside [0, {2**63 - 1}]"
    with pytest.raises(FieldError, match="must be a list of strings"):
        PullMessageRequest.from_fields({**base, "queue_offset": 0, "tags": ("a",)})

    class Unbounded(Header):
        code = RequestCode.PULL_MESSAGE
        n: int

    with pytest.raises(TypeError, match="states bounds"):
        fields_of(Unbounded)
