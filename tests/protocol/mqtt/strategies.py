"""Hypothesis strategies for MQTT packets of either version."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from orbitmq.protocol.mqtt import packets as p
from orbitmq.protocol.mqtt.codes import MQTT_5, REASONS, REASONS_311
from orbitmq.protocol.mqtt.codes import PacketType as PT
from orbitmq.protocol.mqtt.properties import TABLE, WILL, Prop, PropType, allowed

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
blobs = st.binary(max_size=16)
pids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)


def reasons(packet: int, version: int) -> st.SearchStrategy[int]:
    table = REASONS if version == MQTT_5 else REASONS_311
    return st.sampled_from(sorted(table.get(packet, {0})))


_FLAGS = {
    Prop.PAYLOAD_FORMAT_INDICATOR,
    Prop.REQUEST_PROBLEM_INFORMATION,
    Prop.REQUEST_RESPONSE_INFORMATION,
    Prop.MAXIMUM_QOS,
    Prop.RETAIN_AVAILABLE,
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE,
}
_NON_ZERO = {Prop.RECEIVE_MAXIMUM, Prop.MAXIMUM_PACKET_SIZE, Prop.TOPIC_ALIAS}


def _value(pid: int) -> st.SearchStrategy[Any]:
    kind, _ = TABLE[pid]
    low = 1 if pid in _NON_ZERO else 0
    if pid in _FLAGS:
        return st.integers(0, 1)
    if pid == Prop.USER_PROPERTY:
        return st.lists(st.tuples(text, text), min_size=1, max_size=3).map(tuple)
    if pid == Prop.SUBSCRIPTION_IDENTIFIER:
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=1).map(tuple)
    return {
        PropType.BYTE: st.integers(0, 255),
        PropType.U16: st.integers(low, 0xFFFF),
        PropType.U32: st.integers(low, 0xFFFFFFFF),
        PropType.VARINT: st.integers(1, 268_435_455),
        PropType.STRING: text,
        PropType.BINARY: blobs,
    }[kind]


def props(packet: int, version: int) -> st.SearchStrategy[dict[int, Any]]:
    if version != MQTT_5:
        return st.just({})
    ids = sorted(allowed(packet))
    return st.lists(st.sampled_from(ids), unique=True, max_size=4).flatmap(
        lambda chosen: st.fixed_dictionaries({pid: _value(pid) for pid in chosen})
    )


def packets(version: int) -> st.SearchStrategy[p.Packet]:
    v5 = version == MQTT_5

    wills = st.builds(p.Will, text, blobs, qos, st.booleans(), props(WILL, version))
    connects = st.builds(
        p.Connect,
        text,
        st.just(version),
        st.booleans(),
        st.integers(0, 0xFFFF),
        st.none() | text,
        st.none() | blobs,
        st.none() | wills,
        props(PT.CONNECT, version),
    ).filter(lambda c: v5 or c.password is None or c.username is not None)
    publishes = qos.flatmap(
        lambda q: st.builds(
            p.Publish,
            text,
            blobs,
            st.just(q),
            st.booleans(),
            st.booleans() if q else st.just(False),
            pids if q else st.none(),
            props(PT.PUBLISH, version),
        )
    )
    acks = [
        st.builds(cls, pids, reasons(cls.TYPE, version), props(cls.TYPE, version))
        for cls in (p.PubAck, p.PubRec, p.PubRel, p.PubComp)
    ]
    subs = st.builds(
        p.Subscription,
        text,
        qos,
        st.booleans() if v5 else st.just(False),
        st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    suback_codes = reasons(PT.SUBACK, version)
    out: list[st.SearchStrategy[p.Packet]] = [
        connects,
        st.builds(
            p.Connack, st.booleans(), reasons(PT.CONNACK, version), props(PT.CONNACK, version)
        ),
        publishes,
        *acks,
        st.builds(
            p.Subscribe,
            pids,
            st.lists(subs, min_size=1, max_size=3).map(tuple),
            props(PT.SUBSCRIBE, version),
        ),
        st.builds(
            p.Suback, pids, st.lists(suback_codes, max_size=3).map(tuple), props(PT.SUBACK, version)
        ),
        st.builds(
            p.Unsubscribe,
            pids,
            st.lists(text, min_size=1, max_size=3).map(tuple),
            props(PT.UNSUBSCRIBE, version),
        ),
        st.builds(
            p.Unsuback,
            pids,
            st.lists(reasons(PT.UNSUBACK, version), max_size=3).map(tuple) if v5 else st.just(()),
            props(PT.UNSUBACK, version),
        ),
        st.builds(p.PingReq),
        st.builds(p.PingResp),
        st.builds(p.Disconnect, reasons(PT.DISCONNECT, version), props(PT.DISCONNECT, version)),
    ]
    if v5:
        out.append(st.builds(p.Auth, reasons(PT.AUTH, version), props(PT.AUTH, version)))
    return st.one_of(out)
