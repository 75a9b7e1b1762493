"""The MQTT gateway: MQTT 3.1.1 and 5.0 clients publish and subscribe on a broker's store, and
their messages are ordinary OrbitMQ messages (docs/mqtt.md).

A service beside the broker, in its process and event loop: it imports the broker (through
:mod:`orbitmq.mqtt.store_access` only), the store, the sans-IO codec
(:mod:`orbitmq.protocol.mqtt`) and common; nothing below imports it. Modules, top down:
``gateway`` (listeners, lifecycle) > ``websocket`` (MQTT over WebSocket) > ``handler`` (one
connection) > ``registry`` (sessions,
wills, expiry, inbound) > ``shared`` (``$share`` groups) > ``delivery`` (outbound per session)
> ``context`` (what they share, the arrival hub) > ``retained``, ``session``, ``journal``,
``mapping``, ``store_access``, ``auth`` (ACL users and policies, or a password file),
``config``. Listeners are :class:`orbitmq.net.listener.Listener` (TLS as on every port).
"""
