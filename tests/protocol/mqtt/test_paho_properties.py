"""The 5.0 property codec cross-checked against paho-mqtt's (an independent implementation):
what one writes, the other reads back equal, for every packet type and the will."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orbitmq.protocol.mqtt.codes import MQTT_5, REASONS, PacketType
from orbitmq.protocol.mqtt.properties import WILL, Prop, decode_properties, encode_properties
from orbitmq.protocol.mqtt.wire import Reader

from .strategies import props

paho_props = pytest.importorskip("paho.mqtt.properties")
PacketTypes = pytest.importorskip("paho.mqtt.packettypes").PacketTypes

KINDS = [*(int(t) for t in PacketType if t not in (PacketType.PINGREQ, PacketType.PINGRESP)), WILL]


def _paho_kind(kind: int) -> int:
    return int(PacketTypes.WILLMESSAGE) if kind == WILL else kind


def _as_paho_values(ours: dict[int, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pid, value in ours.items():
        name = Prop(pid).name.title().replace("_", "")
        name = {"MaximumQos": "MaximumQoS"}.get(name, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_properties_agree_with_paho(kind: int, data: st.DataObject) -> None:
    ours = data.draw(props(kind, MQTT_5))
    assume(ours.get(Prop.MAXIMUM_PACKET_SIZE, 1) <= 268_435_455)  # paho's own bound
    raw = encode_properties(ours, kind)
    theirs, used = paho_props.Properties(_paho_kind(kind)).unpack(raw)
    assert used == len(raw)
    expected = _as_paho_values(ours)
    for name, value in expected.items():
        assert getattr(theirs, name) == value, name
    # and the other way: paho writes, we read
    packed = theirs.pack()
    assert decode_properties(Reader(packed), kind) == ours


def test_reason_code_table_agrees_with_paho() -> None:
    reasoncodes = pytest.importorskip("paho.mqtt.reasoncodes")
    theirs: dict[int, set[int]] = {}
    for code, by_name in reasoncodes.ReasonCode.names.items():
        for packet_types in by_name.values():
            for t in packet_types:
                theirs.setdefault(int(t), set()).add(code)
    for packet, ours in REASONS.items():
        extra = {0x99} if packet == PacketType.CONNACK else set()  # 5.0 §3.2.2.2 lists it
        assert set(ours) == theirs[packet] | extra, PacketType(packet).name
