"""A real MQTT client (paho-mqtt 2.x, 3.1.1 and 5.0) against the codec and state machine.

The test drives :class:`ServerConnection` from a loopback server of a few lines (a thread per
socket, an in-memory subscription trie): enough gateway to show the bytes are what a widely
used client expects, for CONNECT, SUBSCRIBE, QoS 0/1/2 both ways, topic aliases and PING.
Skipped where paho-mqtt is not installed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orbitmq.protocol.mqtt import packets as p
from orbitmq.protocol.mqtt.connection import (
    Closed,
    ConnectRequested,
    Disconnected,
    Event,
    MessageReceived,
    Send,
    ServerConnection,
    SubscribeRequested,
    UnsubscribeRequested,
)
from orbitmq.protocol.mqtt.topics import TopicTrie

mqtt = pytest.importorskip("paho.mqtt.client")
Properties = pytest.importorskip("paho.mqtt.properties").Properties
PacketTypes = pytest.importorskip("paho.mqtt.packettypes").PacketTypes


class _Session:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = ServerConnection(receive_maximum=20, topic_alias_maximum=4)
        self.lock = threading.Lock()


class LoopbackServer:
    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.subs: TopicTrie[int] = TopicTrie()
        self.subs_lock = threading.Lock()
        self.sessions: list[_Session] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        for s in self.sessions:
            s.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            session = _Session(sock)
            self.sessions.append(session)
            threading.Thread(target=self._serve, args=(session,), daemon=True).start()

    def _serve(self, s: _Session) -> None:
        while True:
            try:
                data = s.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            with s.lock:
                events = s.conn.receive_data(data, int(time.monotonic() * 1000))
            if not self._run(s, events):
                s.sock.close()
                return

    def _run(self, s: _Session, events: list[Event]) -> bool:
        for ev in events:
            if isinstance(ev, Send):
                s.sock.sendall(ev.data)
            elif isinstance(ev, ConnectRequested):
                with s.lock:
                    more = s.conn.accept()
                if not self._run(s, more):
                    return False
            elif isinstance(ev, SubscribeRequested):
                with self.subs_lock:
                    for sub in ev.subscribe.subscriptions:
                        self.subs.add(sub.filter, s, sub.qos)
                codes = tuple(sub.qos for sub in ev.subscribe.subscriptions)
                with s.lock:
                    s.sock.sendall(s.conn.send(p.Suback(ev.subscribe.packet_id, codes)))
            elif isinstance(ev, UnsubscribeRequested):
                with self.subs_lock:
                    for f in ev.unsubscribe.filters:
                        self.subs.remove(f, s)
                with s.lock:
                    s.sock.sendall(s.conn.send(p.Unsuback(ev.unsubscribe.packet_id, (0,))))
            elif isinstance(ev, MessageReceived):
                self._route(ev.publish)
                if ev.publish.packet_id is not None:
                    with s.lock:
                        s.sock.sendall(s.conn.acknowledge(ev.publish.packet_id))
            elif isinstance(ev, Closed | Disconnected):
                if isinstance(ev, Closed) and ev.data:
                    s.sock.sendall(ev.data)
                return False
        return True

    def _route(self, pub: p.Publish) -> None:
        with self.subs_lock:
            targets = list(self.subs.match(pub.topic))
        for key, granted in targets:
            target = key
            assert isinstance(target, _Session)
            with target.lock:
                out = target.conn.publish(pub.topic, pub.payload, min(pub.qos, granted))
                if out is not None:
                    target.sock.sendall(out[1])


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    srv = LoopbackServer()
    yield srv
    srv.close()


def _client(srv: LoopbackServer, version: int, cid: str, **connect: Any) -> Any:
    protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=protocol)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect("127.0.0.1", srv.port, keepalive=5, **connect)
    c.loop_start()
    assert connected.wait(10), "no CONNACK"
    return c


@pytest.mark.parametrize("version", [4, 5])
def test_paho_publish_subscribe_all_qos(server: LoopbackServer, version: int) -> None:
    props = None
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.TopicAliasMaximum = 2  # the server sends aliases to this client
    sub = (
        _client(server, version, "sub", properties=props)
        if props
        else _client(server, version, "sub")
    )
    got: list[tuple[str, bytes, int]] = []
    done = threading.Event()

    aliases: dict[int, str] = {}

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        topic = msg.topic
        alias = getattr(msg.properties, "TopicAlias", None) if version == 5 else None
        if alias is not None:  # paho 2.2 hands inbound aliases over unresolved
            topic = aliases.setdefault(alias, topic) if topic else aliases[alias]
        got.append((topic, msg.payload, msg.qos))
        if len(got) == 9:
            done.set()

    sub.on_message = on_message
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe("plant/#", qos=2)
    assert subscribed.wait(10)
    pub = _client(server, version, "pub")
    for i in range(3):
        for qos in (0, 1, 2):
            info = pub.publish(f"plant/line{i}/temp", f"{i}:{qos}".encode(), qos=qos)
            info.wait_for_publish(10)
    assert done.wait(10), got
    if version == 5:  # 3 topics, the client allows 2 aliases: the third goes without
        assert sorted(aliases.values()) == ["plant/line0/temp", "plant/line1/temp"]
    assert sorted(got) == sorted(
        (f"plant/line{i}/temp", f"{i}:{q}".encode(), q) for i in range(3) for q in (0, 1, 2)
    )
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()


def test_paho_v5_inbound_topic_alias(server: LoopbackServer) -> None:
    sub = _client(server, 5, "sub")
    got: list[tuple[str, bytes]] = []
    done = threading.Event()

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        got.append((msg.topic, msg.payload))
        if len(got) == 2:
            done.set()

    sub.on_message = on_message
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe("plant/+", qos=1)
    assert subscribed.wait(10)
    pub = _client(server, 5, "pub")
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = 3  # within the server's Topic Alias Maximum of 4
    pub.publish("plant/x", b"first", qos=1, properties=props).wait_for_publish(10)
    pub.publish("", b"second", qos=1, properties=props).wait_for_publish(10)
    assert done.wait(10), got
    assert got == [("plant/x", b"first"), ("plant/x", b"second")]
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
