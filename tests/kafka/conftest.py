"""A NameServer, a broker and a Kafka gateway in this test's event loop; Kafka clients (which
block) run in threads against the gateway's port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orbitmq.kafka.config import KafkaConfig
from orbitmq.kafka.server import KafkaGateway
from orbitmq.namesrv.controller import NamesrvController
from orbitmq.testing import run_broker, run_namesrv, small_broker_config


@dataclass
class Stack:
    namesrv: str
    bootstrap: str
    gateway: KafkaGateway
    data_dir: Path


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with run_namesrv() as ns:
        addr = _addr(ns)
        config = small_broker_config(tmp_path / "store", namesrv_addrs=(addr,))
        async with run_broker(config):
            gw = KafkaGateway(KafkaConfig(namesrv_addrs=(addr,), port=0, default_partitions=2))
            await gw.start()
            try:
                yield Stack(addr, f"127.0.0.1:{gw.port}", gw, tmp_path)
            finally:
                await gw.stop()


def _addr(ns: NamesrvController) -> str:
    return f"127.0.0.1:{ns.port}"
