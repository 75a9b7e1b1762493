"""The controller's Remoting port in TLS required mode: TLS 1.2+ with the CA, plaintext
refused."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.server import ControllerNode
from orbitmq.net.tls import client_context
from tests.broker.test_tls_ports import _refused, _tls_version
from tests.net.pki import Ca


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_controller_port_requires_tls(tmp_path: Path) -> None:
    ca = Ca.make(tmp_path)
    cert, key = ca.issue(tmp_path, "localhost", ip="127.0.0.1")
    config = ControllerConfig(
        port=_free_port(),
        raft_port=_free_port(),
        data_dir=str(tmp_path / "raft"),
        tls_mode="required",
        tls_cert_file=str(cert),
        tls_key_file=str(key),
    )
    node = ControllerNode(config)
    await node.start()
    try:
        port = node.server.port
        good = client_context(ca_file=str(ca.file))
        assert await asyncio.to_thread(_tls_version, port, good) in ("TLSv1.2", "TLSv1.3")
        assert await asyncio.to_thread(_refused, port, None)
    finally:
        await node.stop()
