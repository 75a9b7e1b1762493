"""MQTT 3.1.1 and 5.0, sans-IO: packets, codec, topics and the server's per-connection state.

- :mod:`.packets` the control packets as dataclasses; :mod:`.properties` the 5.0 property
  table; :mod:`.codes` packet types, reason codes and :class:`MqttProtocolError`;
- :mod:`.codec` ``encode(packet, version) -> bytes`` and ``MqttDecoder.feed(bytes) -> packets``;
- :mod:`.topics` topic name/filter validation, matching, ``$share`` parsing;
- :mod:`.connection` the server side of one connection (packet ids, QoS flows, receive
  maximum, topic aliases, keep alive), driven by a gateway that does the I/O.

Like the rest of orbitmq.protocol it imports no asyncio, socket or store (an import-linter
contract says so). docs/mqtt.md describes what is covered and the limits chosen.
"""
