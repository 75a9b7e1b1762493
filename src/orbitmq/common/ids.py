"""Unique message ids, in the shape RocketMQ clients use for UNIQ_KEY: 32 hex digits.

    4 bytes  IPv4 address of the creator
    2 bytes  process id
    4 bytes  random, chosen at start (RocketMQ: a class-loader hash)
    4 bytes  milliseconds since the start of the current month
    2 bytes  counter

Ids are unique per process start for 65,536 ids per millisecond; the time part and the random
part separate restarts and processes. Generation is a counter and a format call.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from datetime import UTC, datetime


def _local_ip() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


_HEX4 = [f"{i:04X}" for i in range(1 << 16)]


class MessageIdGenerator:
    def __init__(self) -> None:
        prefix = _local_ip() + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        self._prefix = prefix.hex().upper()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._head_ms = -1
        self._head = ""

    def _month_base(self, now_ms: int) -> int:
        if now_ms >= self._next_month_ms:
            now = datetime.fromtimestamp(now_ms / 1000, UTC)
            start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            nxt = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
            self._month_start_ms = int(start.timestamp() * 1000)
            self._next_month_ms = int(nxt.timestamp() * 1000)
        return self._month_start_ms

    def next_id(self) -> str:
        # next() on itertools.count is atomic under the GIL: no lock on the hot path.
        n = next(self._counter) & 0xFFFF
        now_ms = time.time_ns() // 1_000_000
        if now_ms != self._head_ms:
            self._head_ms = now_ms
            self._head = f"{self._prefix}{(now_ms - self._month_base(now_ms)) & 0xFFFFFFFF:08X}"
        return self._head + _HEX4[n]

    def next_ids(self, count: int) -> list[str]:
        """``count`` ids at once (one clock read)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            base = self._month_base(now_ms)
        head = f"{self._prefix}{(now_ms - base) & 0xFFFFFFFF:08X}"
        counter = self._counter
        return [head + _HEX4[next(counter) & 0xFFFF] for _ in range(count)]


default_generator = MessageIdGenerator()
