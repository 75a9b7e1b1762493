"""Listener.start: a port lost to another process is a ConfigError, never a dead service.

Two processes may both bind one port with SO_REUSEADDR while neither listens; the second
``listen`` then fails. Inside the event loop's own ``create_server`` (uvloop) that failure only
closed the server and was reported to the loop, so ``start`` read the port of a closed socket
(AttributeError): a broker of ``orbitmq cluster up`` died at start on the MQTT port its
neighbour took in that instant (seen in the power-cut chaos test). The listener now binds and
listens itself, so the lost race raises, and the MQTT gateway's "port taken: not started"
path handles it as it handles any taken port.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from orbitmq.common.errors import ConfigError
from orbitmq.net.listener import Listener


def listener(port: int) -> Listener:
    return Listener(lambda _addr: None, host="127.0.0.1", port=port, name="test")  # type: ignore[arg-type,return-value]


async def test_a_listen_lost_between_bind_and_listen_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rival = socket.socket()
    rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rival.bind(("127.0.0.1", 0))
    port = rival.getsockname()[1]
    real = socket.socket

    class LosesTheRace(real):  # type: ignore[misc,valid-type]
        def listen(self, *args: Any) -> None:
            rival.listen()  # the other process listens between this one's bind and listen
            super().listen(*args)

    monkeypatch.setattr(socket, "socket", LosesTheRace)
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            await listener(port).start()
    finally:
        monkeypatch.undo()
        rival.close()


async def test_a_taken_port_raises_and_a_free_one_serves() -> None:
    first = listener(0)
    port = await first.start()
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            await listener(port).start()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        await first.stop()
