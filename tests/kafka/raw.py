"""A minimal blocking Kafka client on the sans-IO codec, for exact requests in tests."""

from __future__ import annotations

import socket
import struct
from typing import Any

from orbitmq.protocol.kafka.connection import decode_response, encode_request


class RawClient:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.correlation = 0

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        cid = self.send(api_key, version, body)
        got, answer = self.receive(api_key, version)
        assert got == cid
        return answer

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> int:
        """Write one request without reading (pipelining); its correlation id."""
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, "raw", body))
        return self.correlation

    def receive(self, api_key: int, version: int) -> tuple[int, dict[str, Any]]:
        """The next response on the connection, decoded as (api_key, version): (cid, body)."""
        (size,) = struct.unpack(">i", self._read(4))
        return decode_response(api_key, version, self._read(size))

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the gateway")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()
