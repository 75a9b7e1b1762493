"""Retry with backoff and dead-letter queues on an in-process broker: group configs, push
send-back through the timer, the DLQ (write-only, read by GET_DLQ_MESSAGES), Pop revive backoff
and Pop dead-lettering, bad configs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.dead_letter import DLQ_PERM
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ConfigError
from orbitmq.common.message import encode_properties
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import PERM_READ, decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.consumer import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    dlq_topic,
    pop_retry_topic,
    retry_topic,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.group_config import (
    DEFAULT_RETRY_DELAYS_MS,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    SubscriptionGroupConfig,
    SubscriptionGroupConfigList,
)
from orbitmq.protocol.messages import decode_records, encode_send_body
from tests.broker.conftest import broker_config
from tests.broker.test_pop import ack, call, make_topic, pop

pytestmark = pytest.mark.timeout(60)

G = "RetryGroup"


# ---------------------------------------------------------------------- helpers


async def set_config(
    client: RemotingClient, b: BrokerController, group: str = G, **fields: Any
) -> Frame:
    body = encode_body(SubscriptionGroupConfig(group_name=group, **fields))
    return await call(client, b, Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))


async def send_one(
    client: RemotingClient, b: BrokerController, topic: str, body: bytes, **props: str
) -> int:
    """Send one message; its CommitLog offset."""
    frame = Frame(
        RequestCode.SEND_MESSAGE,
        fields={"topic": topic, "queue_id": 0},
        body=encode_send_body([body], [encode_properties(props)]),
    )
    resp = await client.invoke(b.address, frame)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    await asyncio.to_thread(b.store.wait_for_dispatch)
    return int(resp.fields["offset"])


async def send_back(
    client: RemotingClient, b: BrokerController, offset: int, group: str = G, **fields: Any
) -> Frame:
    frame = Frame(
        RequestCode.CONSUMER_SEND_MSG_BACK, fields={"group": group, "offset": offset, **fields}
    )
    return await client.invoke(b.address, frame)


async def pull(client: RemotingClient, b: BrokerController, topic: str, offset: int) -> Frame:
    frame = Frame(
        RequestCode.PULL_MESSAGE, fields={"topic": topic, "queue_id": 0, "queue_offset": offset}
    )
    return await client.invoke(b.address, frame)


async def wait_copy(
    client: RemotingClient, b: BrokerController, topic: str, offset: int, timeout_s: float = 5.0
) -> tuple[StoredMessage, int]:
    """Poll until the message at ``offset`` of ``topic``/0 can be pulled; it and the wall
    clock (ms) when it was first seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if b.topics.get(topic) is not None and b.store.max_offset(topic, 0) > offset:
            seen = int(time.time() * 1000)
            resp = await pull(client, b, topic, offset)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            return decode_records(resp.body)[0], seen
        await asyncio.sleep(0.01)
    raise AssertionError(f"nothing arrived at {topic}/0 offset {offset} in {timeout_s}s")


async def dlq_read(
    client: RemotingClient, b: BrokerController, group: str = G, **fields: Any
) -> tuple[Frame, list[StoredMessage]]:
    frame = Frame(RequestCode.GET_DLQ_MESSAGES, fields={"group": group, **fields})
    resp = await client.invoke(b.address, frame)
    msgs = decode_records(resp.body) if resp.code == ResponseCode.SUCCESS else []
    return resp, msgs


@pytest.fixture
async def fast(tmp_path: Path) -> Any:
    b = BrokerController(broker_config(tmp_path / "store", pop_revive_interval_ms=50))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


# ---------------------------------------------------------------------- group configs


async def test_group_config_defaults_update_list_delete(
    broker: BrokerController, client: RemotingClient
) -> None:
    # Never configured: the defaults, RocketMQ's schedule (delay levels 3..18).
    frame = Frame(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, fields={"group": G})
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["configured"] is False
    [default] = decode_body(resp.body, SubscriptionGroupConfigList).configs
    assert default.retry_max_times == 16 and default.orderly_retry_interval_ms == 3000
    assert default.retry_delays_ms == list(DEFAULT_RETRY_DELAYS_MS)
    assert [default.retry_delay_ms(n) for n in (0, 1, 2, 15, 16, 99)] == [
        10_000, 30_000, 60_000, 7_200_000, 7_200_000, 7_200_000,
    ]  # fmt: skip
    assert default.pop_retry_delay_ms(0) == 10_000  # Pop: the same schedule by default

    resp = await set_config(client, broker, retry_max_times=3, retry_delays_ms=[200, 300])
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    resp = await set_config(client, broker, "Other", pop_retry_delays_ms=[])
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert broker.groups.get("Other").pop_retry_delay_ms(5) == 0

    resp = await client.invoke(broker.address, Frame(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    configs = decode_body(resp.body, SubscriptionGroupConfigList).configs
    assert [c.group_name for c in configs] == ["Other", G]
    assert configs[1].retry_delays_ms == [200, 300] and configs[1].retry_max_times == 3

    frame = Frame(RequestCode.DELETE_SUBSCRIPTIONGROUP, fields={"group": G})
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["deleted"] is True
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["deleted"] is False
    assert broker.groups.get(G).retry_max_times == 16


async def test_group_configs_survive_restart(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        resp = await set_config(client, b, retry_max_times=5, retry_delays_ms=[1000])
        assert resp.code == ResponseCode.SUCCESS
    finally:
        await b.stop()
    b = BrokerController(config)
    await b.start()
    try:
        assert b.groups.get(G).retry_max_times == 5
        assert b.groups.get(G).retry_delays_ms == [1000]
    finally:
        await b.stop()
    # A damaged file stops the broker: silently falling back to defaults would change when
    # messages are dead-lettered.
    (tmp_path / "s" / "config" / "subscriptionGroup.json").write_text('{"groups": 3}')
    b = BrokerController(config)
    with pytest.raises(ConfigError, match=r"subscriptionGroup\.json"):
        await b.start()
    await b.stop()


BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"retry_delays_ms": [-1]}, "retry_delays_ms[0]"),
    ({"retry_delays_ms": []}, "at least one"),
    ({"retry_delays_ms": [1000] * 65}, "65 entries"),
    ({"retry_delays_ms": [8 * 24 * 3600 * 1000]}, "retry_delays_ms[0]"),
    ({"pop_retry_delays_ms": [100, -5]}, "pop_retry_delays_ms[1]"),
    ({"retry_max_times": -1}, "retry_max_times"),
    ({"retry_max_times": 10**6}, "retry_max_times"),
    ({"orderly_retry_interval_ms": 0}, "orderly_retry_interval_ms"),
    ({"orderly_retry_interval_ms": 10**9}, "orderly_retry_interval_ms"),
    ({"group_name": "bad group!"}, "group"),
    ({"group_name": ""}, "group is empty"),
]


@pytest.mark.parametrize(("fields", "words"), BAD_CONFIGS)
async def test_bad_group_configs_are_refused(
    broker: BrokerController, client: RemotingClient, fields: dict[str, Any], words: str
) -> None:
    data = msgspec.structs.asdict(SubscriptionGroupConfig(group_name=G))
    data.update(fields)
    frame = Frame(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=msgspec.msgpack.encode(data)
    )
    resp = await client.invoke(broker.address, frame)
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert words in resp.remark
    assert broker.groups.find(G) is None and broker.groups.find("bad group!") is None


async def test_malformed_group_config_requests(
    broker: BrokerController, client: RemotingClient
) -> None:
    for frame in (
        Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP),
        Frame(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"\xc1garbage"),
        Frame(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=msgspec.msgpack.encode({"group_name": G, "retry_delays_ms": "10s"}),
        ),
        Frame(RequestCode.DELETE_SUBSCRIPTIONGROUP),
        Frame(RequestCode.DELETE_SUBSCRIPTIONGROUP, fields={"group": 7}),
        Frame(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, fields={"group": "x y"}),
        Frame(RequestCode.GET_DLQ_MESSAGES),
        Frame(RequestCode.GET_DLQ_MESSAGES, fields={"group": G, "max_msg_nums": 0}),
        Frame(RequestCode.GET_DLQ_MESSAGES, fields={"group": G, "queue_offset": -2}),
    ):
        resp = await client.invoke(broker.address, frame)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (frame, resp.remark)
        assert resp.remark


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    print_blob=True,
)
@given(
    data=st.dictionaries(
        st.sampled_from(
            ["group_name", "retry_max_times", "retry_delays_ms", "pop_retry_delays_ms",
             "orderly_retry_interval_ms", "consume_enable", "fifo", "extra"]
        ),
        st.one_of(
            st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans(), st.none(),
            st.lists(st.integers(-(2**40), 2**40), max_size=70),
        ),
    )
)  # fmt: skip
async def test_random_group_configs_never_crash(
    broker: BrokerController, client: RemotingClient, data: dict[str, Any]
) -> None:
    frame = Frame(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=msgspec.msgpack.encode(data)
    )
    resp = await client.invoke(broker.address, frame)
    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL), resp.remark
    if resp.code == ResponseCode.SUCCESS:
        stored = broker.groups.get(data["group_name"])
        assert stored.retry_delays_ms and all(d >= 0 for d in stored.retry_delays_ms)


# ---------------------------------------------------------------------- push send-back


async def test_send_back_waits_the_backoff_then_dead_letters(
    broker: BrokerController, client: RemotingClient
) -> None:
    assert (
        await set_config(client, broker, retry_max_times=2, retry_delays_ms=[400, 700])
    ).code == 0
    phys = await send_one(client, broker, "T", b"payload", TAGS="a", KEYS="k1", color="red")
    first = decode_records((await pull(client, broker, "T", 0)).body)[0]
    rt = retry_topic(G)

    # Failure of delivery 0: due after 400 ms, invisible until then.
    began = int(time.time() * 1000)
    resp = await send_back(client, broker, phys, origin_topic="T")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.fields["topic"] == rt and resp.fields["reconsume_times"] == 1
    assert resp.fields["dlq"] is False
    assert began + 400 <= resp.fields["deliver_at_ms"] <= int(time.time() * 1000) + 400
    await asyncio.sleep(0.15)
    assert broker.store.max_offset(rt, 0) == 0  # not yet
    copy, seen = await wait_copy(client, broker, rt, 0)
    assert seen >= resp.fields["deliver_at_ms"] - 20
    assert copy.body == b"payload" and copy.reconsume_times == 1
    assert copy.properties[PROPERTY_RETRY_TOPIC] == "T"
    assert copy.properties[PROPERTY_ORIGIN_MESSAGE_ID] == first.msg_id == copy.msg_id
    assert copy.tags == "a" and copy.keys == ["k1"] and copy.properties["color"] == "red"

    # Failure of delivery 1: the second delay.
    resp = await send_back(client, broker, copy.physical_offset, origin_topic="T")
    assert resp.code == ResponseCode.SUCCESS and resp.fields["reconsume_times"] == 2
    sent_at = int(time.time() * 1000)
    assert resp.fields["deliver_at_ms"] >= sent_at - 50 + 700 - 50
    again, seen = await wait_copy(client, broker, rt, 1)
    assert seen >= resp.fields["deliver_at_ms"] - 20 and again.reconsume_times == 2

    # Failure of delivery 2 = retry_max_times: dead-lettered at once.
    resp = await send_back(client, broker, again.physical_offset, origin_topic="T")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.fields["dlq"] is True and resp.fields["topic"] == dlq_topic(G)
    assert resp.fields["reconsume_times"] == 2
    config = broker.topics.get(dlq_topic(G))
    assert config is not None and config.perm == DLQ_PERM and not config.perm & PERM_READ
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    # Consumers cannot pull it ...
    assert (await pull(client, broker, dlq_topic(G), 0)).code == ResponseCode.NO_PERMISSION
    # ... admins read it.
    resp, [dead] = await dlq_read(client, broker)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["next_begin_offset"] == 1
    assert dead.body == b"payload" and dead.reconsume_times == 2 and dead.msg_id == first.msg_id
    assert dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "T"
    assert dead.properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] == first.msg_id
    assert dead.properties[PROPERTY_DLQ_REASON] == "max_reconsume_times"
    assert dead.properties[PROPERTY_RETRY_TOPIC] == "T" and dead.tags == "a"
    resp, none = await dlq_read(client, broker, queue_offset=1)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and not none
    await asyncio.sleep(0.3)
    assert broker.store.max_offset(rt, 0) == 2  # no third retry copy


async def test_request_max_reconsume_times_overrides_and_to_dlq(
    broker: BrokerController, client: RemotingClient
) -> None:
    phys = await send_one(client, broker, "T", b"one")
    # RocketMQ clients send max_reconsume_times: it overrides the group's 16.
    resp = await send_back(client, broker, phys, max_reconsume_times=0)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True
    # -1 is "not set": the group's limit (16); the default delay is 10 s.
    resp = await send_back(client, broker, phys, max_reconsume_times=-1)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is False
    assert resp.fields["deliver_at_ms"] >= int(time.time() * 1000) + 9_000
    # An orderly consumer that gave up: straight to the DLQ with its own count.
    resp = await send_back(client, broker, phys, to_dlq=True, reconsume_times=7)
    assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is True
    assert resp.fields["reconsume_times"] == 7
    await asyncio.to_thread(broker.store.wait_for_dispatch)
    _, dead = await dlq_read(client, broker)
    assert [m.properties[PROPERTY_DLQ_REASON] for m in dead] == ["max_reconsume_times", "orderly"]
    assert [m.reconsume_times for m in dead] == [0, 7]
    for fields in ({"to_dlq": "yes"}, {"to_dlq": 1}, {"reconsume_times": -2},
                   {"max_reconsume_times": -2}, {"max_reconsume_times": "3"}):  # fmt: skip
        resp = await send_back(client, broker, phys, **fields)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, fields
    resp, _ = await dlq_read(client, broker, group="NoSuchGroup")
    assert resp.code == ResponseCode.PULL_NOT_FOUND and "no dead-letter queue" in resp.remark


async def test_delayed_retry_survives_restart(tmp_path: Path, client: RemotingClient) -> None:
    config = broker_config(tmp_path / "s")
    b = BrokerController(config)
    await b.start()
    try:
        await set_config(client, b, retry_delays_ms=[800])
        phys = await send_one(client, b, "T", b"kept")
        resp = await send_back(client, b, phys)
        assert resp.code == ResponseCode.SUCCESS and resp.fields["dlq"] is False
        due = resp.fields["deliver_at_ms"]
    finally:
        await b.stop()
    b = BrokerController(config)
    await b.start()
    try:
        copy, seen = await wait_copy(client, b, retry_topic(G), 0)
        assert copy.body == b"kept" and copy.reconsume_times == 1 and seen >= due - 20
    finally:
        await b.stop()


# ---------------------------------------------------------------------- Pop


async def test_pop_revive_backoff_then_dlq(fast: BrokerController, client: RemotingClient) -> None:
    b = fast
    resp = await set_config(client, b, retry_max_times=1, pop_retry_delays_ms=[500])
    assert resp.code == ResponseCode.SUCCESS
    make_topic(b, "P")
    await send_one(client, b, "P", b"pop-me", TAGS="t")
    _, [m0], handles = await pop(client, b, "P", invisible_time_ms=200, group=G)
    invisible_end = int(time.time() * 1000) + 200
    # Not acked: visible again 500 ms after its invisible time ended, not at its end.
    resp, got, _ = await pop(client, b, "P", poll_time_ms=350, group=G)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and not got
    resp, [m1], handles1 = await pop(client, b, "P", poll_time_ms=3000, group=G)
    assert int(time.time() * 1000) >= invisible_end + 500 - 60
    assert m1.topic == pop_retry_topic(G, "P") and m1.reconsume_times == 1
    assert m1.msg_id == m0.msg_id and m1.properties[PROPERTY_RETRY_TOPIC] == "P"
    assert (await ack(client, b, "P", handles[0], group=G)).code == (
        ResponseCode.RECEIPT_HANDLE_EXPIRED
    )
    # Delivered with reconsume_times 1 = retry_max_times and not acked: to the DLQ.
    r = await call(
        client,
        b,
        Frame(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            fields={"group": G, "topic": "P", "handle": handles1[0], "invisible_time_ms": 100},
        ),
    )
    assert r.code == ResponseCode.SUCCESS, r.remark
    for _ in range(200):
        if b.topics.get(dlq_topic(G)) is not None and b.store.max_offset(dlq_topic(G), 0):
            break
        await asyncio.sleep(0.02)
    resp, [dead] = await dlq_read(client, b)
    assert dead.body == b"pop-me" and dead.reconsume_times == 1
    assert dead.properties[PROPERTY_DLQ_REASON] == "pop"
    assert dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "P"
    resp, got, _ = await pop(client, b, "P", poll_time_ms=300, group=G)
    assert resp.code == ResponseCode.PULL_NOT_FOUND  # not delivered again
    assert b.store.max_offset(pop_retry_topic(G, "P"), 0) == 1


async def test_pop_without_backoff_comes_back_at_the_invisible_time(
    fast: BrokerController, client: RemotingClient
) -> None:
    b = fast
    assert (await set_config(client, b, pop_retry_delays_ms=[])).code == ResponseCode.SUCCESS
    make_topic(b, "Q")
    await send_one(client, b, "Q", b"quick")
    await pop(client, b, "Q", invisible_time_ms=200, group=G)
    began = time.monotonic()
    _, [m], _ = await pop(client, b, "Q", poll_time_ms=3000, group=G)
    assert m.reconsume_times == 1 and time.monotonic() - began < 1.5
