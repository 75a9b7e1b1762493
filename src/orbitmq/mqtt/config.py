"""MqttConfig: the MQTT gateway's settings (the ``[mqtt]`` table; each declared with
:func:`orbitmq.common.config.setting`, which documents and checks it).

The gateway runs inside a broker process (``orbitmq broker``, ``orbitmq up``) on port 1883
unless told otherwise; port 0 turns it off (a test that wants a free port builds the gateway
itself with ``listen_port=0``). docs/mqtt.md describes what each limit means on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.config import PORT, at_least, between, check_settings, setting

DEFAULT_MQTT_PORT = 1883


@dataclass(frozen=True, slots=True)
class MqttConfig:
    host: str = setting(
        "127.0.0.1", 'Address the MQTT listener binds ("0.0.0.0" for every interface).'
    )
    port: int = setting(
        DEFAULT_MQTT_PORT,
        "MQTT port (IANA's 1883); 0 turns the MQTT gateway off.",
        PORT,
    )
    auto_create_topic: bool = setting(
        True,
        "Create the OrbitMQ topic (an MQTT topic's first level) on the first PUBLISH to it; "
        "off: a PUBLISH to a topic that does not exist is refused (5.0: reason 0x90).",
    )
    fallback_topic: str = setting(
        "MQTT",
        "OrbitMQ topic of MQTT topics whose first level is not a valid OrbitMQ topic name "
        "(empty, ``$``-prefixed or with characters outside [A-Za-z0-9%|_+-]).",
    )
    receive_maximum: int = setting(
        64,
        "QoS 1/2 PUBLISH a client may have unacknowledged towards the server (5.0 CONNACK "
        "Receive Maximum); also the most the server has in flight towards one client.",
        between(1, 65535),
    )
    topic_alias_maximum: int = setting(
        16, "Topic aliases a 5.0 client may use towards the server (0: none).", between(0, 65535)
    )
    max_packet_size: int = setting(
        1024 * 1024,
        "Largest MQTT packet accepted, in bytes (announced as 5.0 Maximum Packet Size).",
        between(64, 268_435_460),
    )
    max_session_expiry_s: int = setting(
        7 * 24 * 3600,
        "Longest session expiry interval granted, in seconds (a client asking for more gets "
        "this, told in CONNACK).",
        at_least(0),
    )
    max_keep_alive_s: int = setting(
        0,
        "Longest keep alive granted to a 5.0 client, in seconds: one asking for more (or for "
        "none) is told this as Server Keep Alive. 0: the client's own is used.",
        between(0, 65535),
    )
    auth_enabled: bool = setting(
        False, "Require a user name and password found in password_file (off: accept all)."
    )
    password_file: str | None = setting(
        None,
        "File of ``user:sha256-hex-of-password`` lines, read at start (# starts a comment).",
    )

    deny_subscribe: tuple[str, ...] = setting(
        (),
        "Topic filters a SUBSCRIBE is refused for (exact match; reason 0x80 in both versions), "
        "a stop-gap until ACL policies cover MQTT.",
    )

    def __post_init__(self) -> None:
        check_settings(self, "mqtt")
