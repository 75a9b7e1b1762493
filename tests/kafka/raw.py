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
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, "raw", body))
        (size,) = struct.unpack(">i", self._read(4))
        cid, answer = decode_response(api_key, version, self._read(size))
        assert cid == self.correlation
        return answer

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
