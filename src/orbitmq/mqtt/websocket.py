"""WebSocketStream: MQTT over WebSocket (RFC 6455) on one accepted TCP or TLS stream.

MQTT 3.1.1 §6 and 5.0 §6: the client opens a WebSocket with subprotocol ``mqtt`` (``mqttv3.1``
for old 3.1 clients) and sends MQTT bytes in **binary** frames; a packet may span frames and a
frame may hold several packets, so the frames' payloads are one byte stream. This class turns
the stream into what :class:`~orbitmq.mqtt.handler.ClientHandler` reads and writes: ``read(n)``
returns payload bytes, ``write(data)`` sends one binary frame.

Choices: the codec is ``wsproto`` (sans-IO, so it runs on the gateway's own listener: TLS,
permissive mode and certificate reload stay those of the other ports); any request path is
accepted (clients use ``/mqtt`` or ``/``); a client that offers subprotocols but neither
``mqtt`` nor ``mqttv3.1`` gets HTTP 400; one that offers none is accepted (no subprotocol in the
answer), as Mosquitto does. A text frame is a protocol error (close 1003). Reading is pulled
by the handler: nothing is read from the socket while the handler is busy, which keeps the
backpressure of the plain TCP path. Pings are answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
HANDSHAKE_TIMEOUT_S = 10.0
READ_SIZE = 256 * 1024


class WebSocketStream:
    def __init__(
        self, raw_reader: asyncio.StreamReader, raw_writer: asyncio.StreamWriter, max_size: int
    ) -> None:
        self.raw_reader = raw_reader
        self.raw_writer = raw_writer
        self.max_size = max_size
        self.ws = WSConnection(ConnectionType.SERVER)
        self._buf = bytearray()
        self._eof = False
        self._request: Request | None = None

    @property
    def reader(self) -> WebSocketStream:
        """The handler reads the stream through ``read`` and ``feed_eof``."""
        return self

    # --- reading -------------------------------------------------------------------------------

    async def handshake(self) -> bool:
        """Read the HTTP upgrade and answer it; False: refused or gone (the caller closes)."""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                while self._request is None and not self._eof:
                    await self._pull()
        except (TimeoutError, ConnectionError, OSError):
            return False
        request = self._request
        if request is None:
            return False
        offered = list(request.subprotocols)
        chosen = next((p for p in SUBPROTOCOLS if p in offered), None)
        if offered and chosen is None:
            self._send(RejectConnection(status_code=400))
            return False
        self._send(AcceptConnection(subprotocol=chosen))
        with contextlib.suppress(ConnectionError, OSError):
            await self.raw_writer.drain()
        return not self._eof or bool(self._buf)

    async def _pull(self) -> None:
        data = await self.raw_reader.read(READ_SIZE)
        if not data:
            self._eof = True
            return
        try:
            self.ws.receive_data(data)
            self._events()
        except RemoteProtocolError:
            self._eof = True

    def _events(self) -> None:
        for event in self.ws.events():
            if isinstance(event, Request):
                self._request = event
            elif isinstance(event, BytesMessage):
                self._buf += event.data
            elif isinstance(event, TextMessage):
                self._close(CloseReason.UNSUPPORTED_DATA, "MQTT needs binary frames")
                self._eof = True
            elif isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.REMOTE_CLOSING:
                    self._send(event.response())
                self._eof = True

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` payload bytes (b"": the WebSocket or the socket closed)."""
        while not self._buf and not self._eof:
            await self._pull()
            with contextlib.suppress(ConnectionError, OSError):
                await self.raw_writer.drain()  # pongs
        if not self._buf:
            return b""
        size = len(self._buf) if n < 0 else n
        out = bytes(self._buf[:size])
        del self._buf[:size]
        return out

    def feed_eof(self) -> None:
        """End the stream now (the keep-alive watchdog wakes a waiting ``read`` this way)."""
        self._eof = True
        self.raw_reader.feed_eof()

    # --- writing -------------------------------------------------------------------------------

    def _send(self, event: Any) -> None:
        try:
            data = self.ws.send(event)
        except LocalProtocolError:
            return  # the WebSocket is closing: nothing more may be sent
        if data and not self.raw_writer.is_closing():
            self.raw_writer.write(data)

    def _close(self, code: int, reason: str = "") -> None:
        if self.ws.state is ConnectionState.OPEN:
            self._send(CloseConnection(code=code, reason=reason))

    def write(self, data: bytes) -> None:
        if data and self.ws.state is ConnectionState.OPEN:
            self._send(BytesMessage(data=data))

    async def drain(self) -> None:
        await self.raw_writer.drain()

    def close(self) -> None:
        self._close(CloseReason.NORMAL_CLOSURE)
        self.raw_writer.close()

    def is_closing(self) -> bool:
        return self.raw_writer.is_closing() or self.ws.state is not ConnectionState.OPEN

    def can_write_eof(self) -> bool:
        return False  # a half-close would cut the WebSocket's closing handshake

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw_writer.get_extra_info(name, default)
