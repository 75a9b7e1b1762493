"""Helper process for test_idle.py: opens N idle MQTT connections (CONNECT with keep alive
60 s, CONNACK read), prints ``ready <n>`` and holds them until its stdin closes. A separate
process, so the test process (the broker and its gateway) holds only the server side and
its memory is the gateway's.

Usage: python -m tests.compat.mqtt.idle_clients <port> <count>
"""

from __future__ import annotations

import resource
import socket
import sys

from orbitmq.protocol.mqtt.codec import encode
from orbitmq.protocol.mqtt.packets import Connect


def main() -> int:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
    socks: list[socket.socket] = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(encode(Connect(f"idle-{i}", 4 if i % 2 else 5, True, 60), 4 if i % 2 else 5))
        ack = s.recv(64)
        if not ack or ack[0] != 0x20:
            print(f"no CONNACK on connection {i}: {ack!r}", flush=True)
            return 1
        socks.append(s)
    print(f"ready {len(socks)}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
