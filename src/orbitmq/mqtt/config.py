"""MqttConfig: the MQTT gateway's settings (the ``[mqtt]`` table; each declared with
:func:`orbitmq.common.config.setting`, which documents and checks it).

The gateway runs inside a broker process (``orbitmq broker``, ``orbitmq up``) on port 1883
(WebSocket 8083; TLS 8883 when ``tls_mode`` is not off) unless told otherwise; port 0 turns it
off (a test that wants free ports builds the gateway itself with ``listen_port=0``, ...). The
TLS settings have the names and meaning of the other listeners' (orbitmq.net.settings).
docs/mqtt.md describes what each limit means on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.common.config import PORT, above, at_least, between, check_settings, one_of, setting
from orbitmq.common.errors import ConfigError
from orbitmq.net.tls import CLIENT_AUTH, TLS_MODES, ContextSource, server_context

DEFAULT_MQTT_PORT = 1883
DEFAULT_TLS_PORT = 8883
DEFAULT_WS_PORT = 8083


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
    tls_port: int = setting(
        DEFAULT_TLS_PORT,
        "MQTT over TLS port (IANA's 8883), open when tls_mode is not off; TLS only.",
        PORT,
    )
    ws_port: int = setting(
        DEFAULT_WS_PORT,
        'MQTT over WebSocket port (subprotocol "mqtt", any path); 0 turns it off. TLS on it '
        "follows tls_mode, as on port.",
        PORT,
    )
    tls_mode: str = setting(
        "off",
        "TLS of the MQTT listeners, as on the other listeners: ``off`` (plaintext; no tls_port); "
        "``permissive`` (port and ws_port take TLS and plaintext, told apart by the first "
        "byte; tls_port is TLS only); ``required`` (plaintext refused on every port). TLS 1.2+.",
        one_of(*TLS_MODES),
    )
    tls_cert_file: str | None = setting(
        None, "PEM certificate chain the MQTT listeners show (needed unless tls_mode is off)."
    )
    tls_key_file: str | None = setting(
        None, "PEM private key of tls_cert_file (None: the key is in tls_cert_file)."
    )
    tls_ca_file: str | None = setting(
        None, "PEM CA certificate(s) client certificates must chain to (tls_client_auth)."
    )
    tls_client_auth: str = setting(
        "none",
        "Client certificates: ``none``, ``optional`` (verified if shown) or ``required`` (no "
        "certificate, no connection). A verified certificate's principal (first DNS/URI "
        "subjectAltName, else CN) is the MQTT user when the CONNECT has no password.",
        one_of(*CLIENT_AUTH),
    )
    tls_reload_interval_s: float = setting(
        0.5,
        "How often the certificate, key and CA files are checked for changes (SHA-256); a "
        "change (or SIGHUP) applies to new connections without a restart.",
        above(0),
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
        False,
        "Require a user name and password found in password_file, when the broker's own "
        "authentication is off (with ``[broker] auth_enabled`` MQTT always checks the ACL users "
        "and policies instead; off and off: accept all).",
    )
    password_file: str | None = setting(
        None,
        "File of ``user:sha256-hex-of-password`` lines, read at start (# starts a comment).",
    )

    deny_subscribe: tuple[str, ...] = setting(
        (),
        "Topic filters a SUBSCRIBE is refused for (exact match; reason 0x80 in both versions), "
        "kept for setups without ACL users (with them, policies decide: Sub on the topic).",
    )

    def __post_init__(self) -> None:
        check_settings(self, "mqtt")
        if self.tls_mode != "off" and not self.tls_cert_file:
            raise ConfigError(f"mqtt.tls_mode={self.tls_mode} needs mqtt.tls_cert_file")
        if self.tls_client_auth != "none" and not self.tls_ca_file:
            raise ConfigError("mqtt.tls_client_auth needs mqtt.tls_ca_file")
        if self.tls_client_auth != "none" and self.tls_mode == "permissive":
            raise ConfigError(
                "mqtt.tls_client_auth needs tls_mode=required: a plaintext client would bypass it"
            )

    def tls_source(self) -> ContextSource | None:
        """The listeners' server context, rebuilt when its files change (None: TLS off)."""
        if self.tls_mode == "off" or not self.tls_cert_file:
            return None
        cert, key, ca, auth = (
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_client_auth
        )  # fmt: skip
        return ContextSource(
            lambda: server_context(cert, key, ca_file=ca, client_auth=auth),
            [cert, key or "", ca or ""],
            self.tls_reload_interval_s,
        )
