"""Hostile and broken input to a running NameServer, over raw asyncio TCP connections.

Hypothesis generates random bytes, frames cut short, frame prefixes with impossible lengths,
headers that are not string-keyed maps, unknown request codes and frame versions, and
well-formed requests whose fields or bodies are wrong (missing, wrong type, out of range, bad
msgpack). Each must get an error response (the connection then stays usable: a probe request
behind the bad ones is answered) or a closed connection. After every example a well-behaved
RemotingClient must still get the same routes, and the route tables must be exactly as before.

Replay a run with ``ORBITMQ_SEED=<n>`` (the seed is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from orbitmq.common.codes import ResponseCode
from orbitmq.namesrv.config import NamesrvConfig
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.namesrv.processor import NamesrvProcessor
from orbitmq.namesrv.route_info import RouteInfoManager
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import PERM_READ
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import (
    DEFAULT_MAX_FRAME_SIZE,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    MAX_HEADER_SIZE,
    PREFIX,
    Frame,
    FrameDecoder,
    encode_bytes,
)
from tests.namesrv.conftest import identity, register_frame, topic_configs

IO_TIMEOUT = 5.0
PROBE_OPAQUE = 0xFFFF_FFF0
EXAMPLES = int(os.environ.get("ORBITMQ_BAD_INPUT_EXAMPLES", "100"))


def _seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    return int(env) if env else random.randrange(2**32)


def replayable(test: Callable[..., None]) -> Callable[..., None]:
    n = _seed()
    print(f"ORBITMQ_SEED={n}")
    seeded: Callable[..., None] = hyp_seed(n)(test)
    return seeded


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------- the server under test


@dataclass
class Harness:
    loop: asyncio.AbstractEventLoop
    ns: NamesrvController
    good: RemotingClient
    baseline: dict[str, Any]
    baseline_replies: list[tuple[int, bytes]]

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    async def read_only_replies(self) -> list[tuple[int, bytes]]:
        out = []
        for frame in (
            Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "T1"}),
            Frame(RequestCode.GET_ROUTEINFO_BY_TOPIC, fields={"topic": "RO"}),
            Frame(RequestCode.GET_BROKER_CLUSTER_INFO),
            Frame(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
        ):
            resp = await self.good.invoke(self.ns.address, frame, timeout=IO_TIMEOUT)
            out.append((resp.code, bytes(resp.body)))
        return out

    def assert_unharmed(self) -> None:
        """The well-behaved client is served as before and the tables did not move."""
        assert self.run(self.read_only_replies()) == self.baseline_replies
        assert self.ns.routes.snapshot() == self.baseline
        assert self.ns.routes.invariant_violations() == []


@contextlib.contextmanager
def running_namesrv() -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    ns = NamesrvController(NamesrvConfig(host="127.0.0.1", port=0))
    holder = RemotingClient(name="holder")  # the registered brokers' connection, kept open
    good = RemotingClient(name="good")
    try:
        loop.run_until_complete(ns.start())

        async def populate() -> None:
            topics = topic_configs("T1", "T2") | topic_configs("RO", perm=PERM_READ)
            for frame in (
                register_frame(topics=topics, version=3),
                register_frame(bid=1, addr="127.0.0.1:10921"),
                register_frame(name="broker-b", addr="127.0.0.1:10931", cluster="c2"),
                register_frame(name="broker-c", addr="127.0.0.1:10941", topics=topics),
                Frame(RequestCode.WIPE_WRITE_PERM_OF_BROKER, fields={"broker_name": "broker-c"}),
            ):
                resp = await holder.invoke(ns.address, frame, timeout=IO_TIMEOUT)
                assert resp.code == ResponseCode.SUCCESS, resp.remark

        loop.run_until_complete(populate())
        h = Harness(loop, ns, good, ns.routes.snapshot(), [])
        h.baseline_replies = h.run(h.read_only_replies())
        assert [code for code, _ in h.baseline_replies] == [ResponseCode.SUCCESS] * 4
        yield h
        h.assert_unharmed()
    finally:
        loop.run_until_complete(good.close())
        loop.run_until_complete(holder.close())
        loop.run_until_complete(ns.stop())
        loop.close()


# ---------------------------------------------------------------------- raw connections


@dataclass
class Exchange:
    frames: list[Frame]
    closed_by_server: bool


async def exchange(
    ns: NamesrvController, data: bytes, *, eof: bool, until: Callable[[list[Frame]], bool]
) -> Exchange:
    """Send ``data`` (then EOF if asked) and read until ``until(frames)`` or the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", ns.port)
    decoder = FrameDecoder()
    frames: list[Frame] = []
    closed = False
    try:
        try:
            writer.write(data)
            if eof:
                writer.write_eof()
            await writer.drain()
        except ConnectionError:
            pass  # the server may close while we still write; reading tells what happened
        async with asyncio.timeout(IO_TIMEOUT):
            while not until(frames):
                try:
                    chunk = await reader.read(65536)
                except ConnectionError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                frames += decoder.feed(chunk)  # the server's bytes must always frame
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert decoder.buffered == 0 or closed, "the server sent part of a frame"
    return Exchange(frames, closed)


def until_closed(_frames: list[Frame]) -> bool:
    return False


def until_probe(frames: list[Frame]) -> bool:
    return any(f.opaque == PROBE_OPAQUE for f in frames)


def probe() -> bytes:
    return encode_bytes(Frame(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, PROBE_OPAQUE))


# ---------------------------------------------------------------------- strategies

NAME_CHARS = string.ascii_letters + string.digits + "._%|:@+-"
TOPIC_CHARS = string.ascii_letters + string.digits + "%|_+-"  # '+': Pop retry topics (%RETRY%g+t)
HOST_CHARS = string.ascii_letters + string.digits + "._:[]-"
_encode = msgspec.msgpack.Encoder().encode

any_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(0, 9), max_size=2),
)
not_str = any_value.filter(lambda v: not isinstance(v, str))
not_int = any_value.filter(lambda v: not isinstance(v, int) or isinstance(v, bool))


def with_bad_char(alphabet: str) -> st.SearchStrategy[str]:
    """A short valid-looking string with one character from outside ``alphabet``."""
    bad = st.characters(exclude_characters=alphabet)
    return st.tuples(st.text(alphabet, max_size=8), bad, st.text(alphabet, max_size=8)).map("".join)


def text_kinds(alphabet: str, max_len: int) -> dict[str, st.SearchStrategy[Any]]:
    return {
        "wrong type": not_str,
        "empty": st.just(""),
        "too long": st.text(alphabet, min_size=max_len + 1, max_size=max_len + 40),
        "bad character": with_bad_char(alphabet),
    }


# Every way a field can be wrong, by field. Each (request, field, way) leaf is drawn equally
# often, so a validation rule that goes missing is noticed within a run.
BAD_FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "cluster": text_kinds(NAME_CHARS, 127),
    "broker_name": text_kinds(NAME_CHARS, 127),
    "topic": text_kinds(TOPIC_CHARS, 127),
    "broker_id": {
        "wrong type": not_int,
        "negative": st.one_of(st.just(-1), st.integers(-(2**63), -1)),
        "too big": st.one_of(st.just(2**63), st.integers(2**63, 2**64 - 1)),
    },
    "broker_addr": {
        "wrong type": not_str,
        "no port": st.text(HOST_CHARS.replace(":", ""), max_size=20),
        "port out of range": st.sampled_from(["0", "65536", "99999", "00000"]).map(
            lambda port: f"127.0.0.1:{port}"
        ),
        "port not digits": st.sampled_from(
            ["", "abc", "-1", "1e3", " 80", "\uff180", "123456"]
        ).map(lambda port: f"127.0.0.1:{port}"),
        "bad host": st.one_of(
            st.just(""), with_bad_char(HOST_CHARS), st.text(HOST_CHARS, min_size=254)
        ).map(lambda host: f"{host}:10911"),
    },
}

VALID_REQUESTS: dict[int, dict[str, Any]] = {
    RequestCode.REGISTER_BROKER: identity(),
    RequestCode.UNREGISTER_BROKER: identity(),
    RequestCode.GET_ROUTEINFO_BY_TOPIC: {"topic": "T1"},
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: {"broker_name": "broker-a"},
    RequestCode.ADD_WRITE_PERM_OF_BROKER: {"broker_name": "broker-c"},
    RequestCode.DELETE_TOPIC_IN_NAMESRV: {"topic": "T1", "cluster": "c1"},
}
OPTIONAL = {(RequestCode.DELETE_TOPIC_IN_NAMESRV, "cluster")}
GOOD_BODY = bytes(register_frame(topics=topic_configs("T1")).body)


def _config(**over: Any) -> dict[str, Any]:
    return {"topic_name": "T1", "read_queue_nums": 4, "write_queue_nums": 4, "perm": 6} | over


def _configs(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return strategy.map(lambda v: {"topic_configs": v})


def _int_attr(attr: str, hi: int) -> st.SearchStrategy[dict[str, Any]]:
    values = st.one_of(
        st.sampled_from([-1, hi + 1]),  # just outside the range
        st.integers(-(2**63), -1),
        st.integers(hi + 1, 2**63 - 1),
        not_int,
    )
    return _configs(values.map(lambda v: {"T1": _config(**{attr: v})}))


BAD_BODIES: dict[str, st.SearchStrategy[Any]] = {
    "garbage": st.binary(max_size=64),
    "not a map": any_value.filter(lambda v: not isinstance(v, dict)).map(_encode),
    "no topic_configs": st.just(_encode({"data_version": 1})),
    "topic_configs not a map": _configs(any_value.filter(lambda v: not isinstance(v, dict))),
    "data_version not an int": not_int.filter(lambda v: v is not None).map(
        lambda v: {"topic_configs": {}, "data_version": v}
    ),
    "config not a map": _configs(
        any_value.filter(lambda v: not isinstance(v, dict)).map(lambda v: {"T1": v})
    ),
    "key is another topic": _configs(
        st.text(TOPIC_CHARS, min_size=1, max_size=5)
        .filter(lambda t: t != "T1")
        .map(lambda t: {t: _config()})
    ),
    "bad topic name": _configs(
        st.one_of(*list(text_kinds(TOPIC_CHARS, 127).values())[1:]).map(
            lambda t: {t: _config(topic_name=t)}
        )
    ),
    "read_queue_nums": _int_attr("read_queue_nums", 65535),
    "write_queue_nums": _int_attr("write_queue_nums", 65535),
    "perm": _int_attr("perm", 7),
    "message_type": _configs(
        st.text(max_size=10)
        .filter(lambda m: m not in ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"))
        .map(lambda m: {"T1": _config(message_type=m)})
    ),
}


def could_be_register_body(data: bytes) -> bool:
    """Whether random bytes might be a RegisterBrokerBody: a msgpack map with topic_configs.

    Deliberately independent of the code under test, so a lost check cannot hide itself.
    """
    try:
        value = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return False
    return isinstance(value, dict) and "topic_configs" in value


LEAVES: list[tuple[int, str, str]] = [
    (code, target, way)
    for code, fields in VALID_REQUESTS.items()
    for target in fields
    for way in ["missing", *BAD_FIELDS[target]]
    if not (way == "missing" and (code, target) in OPTIONAL)
] + [(RequestCode.REGISTER_BROKER, "body", way) for way in BAD_BODIES]


@st.composite
def invalid_requests(draw: st.DrawFn) -> tuple[bytes, int, bool, str]:
    """(frame bytes, opaque, oneway, what the remark names) for one broken request."""
    code, target, way = draw(st.sampled_from(LEAVES), label="leaf")
    fields = dict(VALID_REQUESTS[code])
    body = GOOD_BODY if code == RequestCode.REGISTER_BROKER else b""
    expect = target
    if target == "body":
        value = draw(BAD_BODIES[way], label="body")
        body = value if isinstance(value, bytes) else _encode(value)
        assume(way != "garbage" or not could_be_register_body(body))
        expect = ""  # the remark names the topic or the body
    elif way == "missing":
        if draw(st.booleans(), label="nil instead"):
            fields[target] = None
        else:
            del fields[target]
    else:
        bad = BAD_FIELDS[target][way]
        if (code, target) in OPTIONAL:
            bad = bad.filter(lambda v: v is not None)  # nil means absent: a valid request
        fields[target] = draw(bad, label="value")
    extra = draw(st.dictionaries(st.text(max_size=6), any_value, max_size=2), label="extra")
    fields = {k: v for k, v in extra.items() if k not in fields} | fields
    opaque = draw(st.integers(0, PROBE_OPAQUE - 1), label="opaque")
    oneway = draw(st.booleans(), label="oneway")
    frame = Frame(code, opaque, FLAG_ONEWAY if oneway else 0, fields, body)
    return encode_bytes(frame), opaque, oneway, expect


@st.composite
def unsupported_requests(draw: st.DrawFn, known: frozenset[int]) -> tuple[bytes, int, bool, int]:
    """(frame bytes, opaque, oneway, expected code): an unknown code, or a newer frame version."""
    newer = draw(st.booleans(), label="newer version")
    if newer:
        code = draw(st.integers(0, 0xFFFF), label="code")
        version = draw(st.integers(2, 255), label="version")
        expect = ResponseCode.VERSION_NOT_SUPPORTED
    else:
        code = draw(st.integers(0, 0xFFFF).filter(lambda c: c not in known), label="code")
        version = 1
        expect = ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    fields = draw(st.dictionaries(st.text(max_size=6), any_value, max_size=3), label="fields")
    body = draw(st.binary(max_size=32), label="body")
    opaque = draw(st.integers(0, PROBE_OPAQUE - 1), label="opaque")
    oneway = draw(st.booleans(), label="oneway")
    frame = Frame(code, opaque, FLAG_ONEWAY if oneway else 0, fields, body, version)
    return encode_bytes(frame), opaque, oneway, expect


def _raw(length: int, header_len: int, rest: bytes, code: int = 105) -> bytes:
    return PREFIX.pack(length, 1, 0, code, 1, header_len) + rest


@st.composite
def unframeable(draw: st.DrawFn) -> bytes:
    """Bytes that cannot be framed: the server must close the connection on its own."""
    kind = draw(st.sampled_from(["short", "huge", "header_len", "not_a_map", "bad_keys", "junk"]))
    if kind == "short":  # LENGTH below the fixed part
        return _raw(draw(st.integers(0, 11)), 0, b"")
    if kind == "huge":  # LENGTH over the limit, up to 4 GiB
        return _raw(draw(st.integers(DEFAULT_MAX_FRAME_SIZE + 1, 2**32 - 1)), 0, b"")
    if kind == "header_len":  # HEADER_LEN beyond the frame or over 64 KiB
        length = draw(st.integers(12, 4096))
        header_len = draw(
            st.one_of(
                st.integers(length - 11, 2**32 - 1), st.integers(MAX_HEADER_SIZE + 1, 2**32 - 1)
            )
        )
        return _raw(length, header_len, b"")
    if kind == "junk":  # header bytes that are not msgpack at all
        header = b"\xc1" + draw(st.binary(max_size=16))
    elif kind == "not_a_map":
        header = _encode(draw(any_value.filter(lambda v: not isinstance(v, dict))))
    else:  # a map with a key that is not a string
        key = draw(
            st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=4), st.booleans())
        )
        header = b"\x81" + _encode(key) + _encode(1)
    body = draw(st.binary(max_size=16))
    return _raw(12 + len(header) + len(body), len(header), header + body)


# ---------------------------------------------------------------------- the tests


def test_random_bytes_get_responses_or_a_closed_connection() -> None:
    with running_namesrv() as h:

        @replayable
        @SETTINGS
        @given(data=st.binary(min_size=1, max_size=600), prefix_good=st.booleans())
        def check(data: bytes, prefix_good: bool) -> None:
            sent = (probe() if prefix_good else b"") + data
            ex = h.run(exchange(h.ns, sent, eof=True, until=until_closed))
            assert ex.closed_by_server  # EOF from us, or garbage: the server closes
            assert all(f.flags & FLAG_RESPONSE for f in ex.frames)
            # a request ahead of the garbage is answered correctly, if the server got to it
            # before the garbage made it close
            assert all(
                f.code == ResponseCode.SUCCESS for f in ex.frames if f.opaque == PROBE_OPAQUE
            )
            h.assert_unharmed()

        check()


def test_unframeable_streams_are_closed_by_the_server() -> None:
    with running_namesrv() as h:

        @replayable
        @SETTINGS
        @given(data=unframeable(), prefix_good=st.booleans())
        def check(data: bytes, prefix_good: bool) -> None:
            sent = (probe() if prefix_good else b"") + data
            ex = h.run(exchange(h.ns, sent, eof=False, until=until_closed))
            assert ex.closed_by_server
            assert all(f.opaque == PROBE_OPAQUE for f in ex.frames)
            h.assert_unharmed()

        check()


def test_truncated_frames_get_no_response() -> None:
    with running_namesrv() as h:

        @replayable
        @SETTINGS
        @given(request=invalid_requests(), cut=st.floats(0, 1, exclude_max=True))
        def check(request: tuple[bytes, int, bool, str], cut: float) -> None:
            data = request[0]
            data = data[: int(len(data) * cut)]
            ex = h.run(exchange(h.ns, data, eof=True, until=until_closed))
            assert ex.closed_by_server and ex.frames == []
            h.assert_unharmed()

        check()


def test_invalid_fields_and_bodies_get_message_illegal() -> None:
    with running_namesrv() as h:

        @replayable
        @SETTINGS
        @given(
            requests=st.lists(invalid_requests(), min_size=1, max_size=4, unique_by=lambda r: r[1])
        )
        def check(requests: list[tuple[bytes, int, bool, str]]) -> None:
            data = b"".join(r[0] for r in requests) + probe()
            ex = h.run(exchange(h.ns, data, eof=False, until=until_probe))
            assert not ex.closed_by_server
            by_opaque: dict[int, list[Frame]] = {}
            for f in ex.frames:
                assert f.flags & FLAG_RESPONSE
                by_opaque.setdefault(f.opaque, []).append(f)
            assert [f.code for f in by_opaque.pop(PROBE_OPAQUE)] == [ResponseCode.SUCCESS]
            answered = [r for r in requests if not r[2]]
            assert sum(map(len, by_opaque.values())) == len(answered)  # none for one-way
            for _data, opaque, _oneway, expect in answered:
                resp = by_opaque[opaque].pop()
                assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp.remark
                assert resp.remark and expect in resp.remark
            h.assert_unharmed()

        check()


def test_unknown_codes_and_newer_versions_are_refused() -> None:
    with running_namesrv() as h:
        known = h.ns.processor.codes

        @replayable
        @SETTINGS
        @given(
            requests=st.lists(
                unsupported_requests(known), min_size=1, max_size=4, unique_by=lambda r: r[1]
            )
        )
        def check(requests: list[tuple[bytes, int, bool, int]]) -> None:
            data = b"".join(r[0] for r in requests) + probe()
            ex = h.run(exchange(h.ns, data, eof=False, until=until_probe))
            assert not ex.closed_by_server
            got = sorted((f.opaque, f.code) for f in ex.frames if f.opaque != PROBE_OPAQUE)
            # the transport answers a newer version even when one-way: it cannot trust the flags
            expect = sorted(
                (opaque, code)
                for _d, opaque, oneway, code in requests
                if not oneway or code == ResponseCode.VERSION_NOT_SUPPORTED
            )
            assert got == expect
            assert all(f.remark for f in ex.frames if f.opaque != PROBE_OPAQUE)
            h.assert_unharmed()

        check()


def test_unknown_fields_are_ignored() -> None:
    """Readers ignore fields they do not know (docs/protocol.md): extra fields change nothing."""
    with running_namesrv() as h:
        reads = [
            (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}),
            (RequestCode.GET_BROKER_CLUSTER_INFO, {}),
            (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {}),
        ]
        expected = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: h.baseline_replies[0][1],
            RequestCode.GET_BROKER_CLUSTER_INFO: h.baseline_replies[2][1],
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: h.baseline_replies[3][1],
        }

        @replayable
        @SETTINGS
        @given(
            which=st.integers(0, len(reads) - 1),
            extra=st.dictionaries(
                st.text(max_size=8).filter(lambda k: k != "topic"), any_value, max_size=4
            ),
        )
        def check(which: int, extra: dict[str, Any]) -> None:
            code, fields = reads[which]
            frame = Frame(code, 7, 0, extra | fields)
            ex = h.run(exchange(h.ns, encode_bytes(frame), eof=False, until=lambda f: bool(f)))
            assert [(f.opaque, f.code) for f in ex.frames] == [(7, ResponseCode.SUCCESS)]
            assert bytes(ex.frames[0].body) == expected[code]
            h.assert_unharmed()

        check()


# ---------------------------------------------------------------------- exact limits


def _register_with(field: str, value: Any) -> Frame:
    frame = register_frame(topics=topic_configs("T1"))
    frame.fields[field] = value
    return frame


def _register_with_config(**over: Any) -> Frame:
    frame = register_frame()
    frame.body = _encode({"topic_configs": {over.get("topic_name", "T1"): _config(**over)}})
    return frame


LIMITS: list[tuple[str, Frame, bool]] = [
    ("broker_id 0", _register_with("broker_id", 0), True),
    ("broker_id max", _register_with("broker_id", 2**63 - 1), True),
    ("broker_id -1", _register_with("broker_id", -1), False),
    ("broker_id 2**63", _register_with("broker_id", 2**63), False),
    ("port 1", _register_with("broker_addr", "h:1"), True),
    ("port 65535", _register_with("broker_addr", "h:65535"), True),
    ("port 0", _register_with("broker_addr", "h:0"), False),
    ("port 65536", _register_with("broker_addr", "h:65536"), False),
    ("ipv6 host", _register_with("broker_addr", "[::1]:10911"), True),
    ("name 127", _register_with("broker_name", "b" * 127), True),
    ("name 128", _register_with("broker_name", "b" * 128), False),
    ("cluster 127", _register_with("cluster", "c" * 127), True),
    ("cluster 128", _register_with("cluster", "c" * 128), False),
    ("topic 127", _register_with_config(topic_name="t" * 127), True),
    ("topic 128", _register_with_config(topic_name="t" * 128), False),
    ("queues 0", _register_with_config(read_queue_nums=0, write_queue_nums=0), True),
    ("queues 65535", _register_with_config(read_queue_nums=65535), True),
    ("read queues -1", _register_with_config(read_queue_nums=-1), False),
    ("write queues -1", _register_with_config(write_queue_nums=-1), False),
    ("read queues 65536", _register_with_config(read_queue_nums=65536), False),
    ("write queues 65536", _register_with_config(write_queue_nums=65536), False),
    ("perm 0", _register_with_config(perm=0), True),
    ("perm 7", _register_with_config(perm=7), True),
    ("perm -1", _register_with_config(perm=-1), False),
    ("perm 8", _register_with_config(perm=8), False),
    ("every message type", _register_with_config(message_type="TRANSACTION"), True),
    ("unknown message type", _register_with_config(message_type="normal"), False),
]


def test_limits_are_exact() -> None:
    """Values at each documented limit pass, values just past it are MESSAGE_ILLEGAL and leave
    the tables as they were."""
    for what, frame, ok in LIMITS:
        routes = RouteInfoManager()
        resp = NamesrvProcessor(routes).process(frame)
        if ok:
            assert resp.code == ResponseCode.SUCCESS, (what, resp.remark)
            assert routes.broker_count == 1, what
        else:
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL and resp.remark, what
            assert routes.broker_count == 0, what
