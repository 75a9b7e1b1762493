"""``orbitmq cluster up --replicas 3 --auth``: the replicated cluster with authentication on.

Checked: ``admin`` is bootstrapped with a generated secret printed once on the supervisor's
stderr, and the cluster forms with it (the brokers' registrations, heartbeats and SyncStateSet
changes are signed as their inner user); the controller refuses an unsigned request and the
broker an unsigned send; the admin creates a topic and sends, signed; after a master SIGKILL
(short failover timings) a new master is elected and signed sends are acknowledged again;
nothing of the generated secret is in any process's log or config file.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from orbitmq.client import AdminConfig, AsyncAdminClient, AsyncProducer, Message
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.common.errors import MQError
from orbitmq.controller.client import ControllerClient
from tests.chaos.ha_cluster import GROUP, HaCluster, fast_failover_args
from tests.harness import ProcessCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
TOPIC = "AuthUp"
GENERATED = re.compile(r"created 'admin' with secret (\S+)")


async def test_cluster_up_with_auth(cluster: ProcessCluster, tmp_path: Path) -> None:
    ha = HaCluster(cluster, tmp_path, extra=["--auth", *fast_failover_args()])
    try:
        await asyncio.to_thread(ha.proc.start, 90)
        found = GENERATED.search(ha.proc.log_path.read_text())
        assert found, "no generated admin secret printed"
        secret = found.group(1)
        assert "auth=on" in ha.proc.ready_line
        ha.reload()
        ha.ctl = ControllerClient(ha.controllers, access_key="admin", secret_key=secret)
        master = await ha.wait_master(in_sync=3, timeout_s=60)

        unsigned = ControllerClient(ha.controllers)
        try:
            with pytest.raises(MQError):
                await unsigned.replica_info(GROUP)
        finally:
            await unsigned.close()
        admin_config = AdminConfig(access_key="admin", secret_key=secret)
        async with AsyncAdminClient(ha.namesrv, admin_config) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
        signed = AsyncProducer(ha.namesrv, ProducerConfig(access_key="admin", secret_key=secret,
                                                          send_timeout_s=15.0))  # fmt: skip
        anonymous = AsyncProducer(ha.namesrv, ProducerConfig(send_timeout_s=3.0))
        await signed.start()
        await anonymous.start()
        try:
            deadline = time.monotonic() + 20
            while True:  # the route of a topic just made reaches the NameServers
                try:
                    await signed.send(Message(TOPIC, b"first"))
                    break
                except MQError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            with pytest.raises(MQError):
                await anonymous.send(Message(TOPIC, b"unsigned"))
            ha.kill(master.master_address)
            started = time.monotonic()
            new = await ha.wait_master(after_epoch=master.master_epoch, timeout_s=30)
            assert new.master_address != master.master_address
            await signed.send(Message(TOPIC, b"after the kill"))
            print(f"new master {time.monotonic() - started:.1f} s after the kill, signed send ok")
        finally:
            await signed.close()
            await anonymous.close()
    finally:
        await ha.close()
    for path in [*tmp_path.rglob("*.log"), *tmp_path.rglob("*.toml")]:
        if path != ha.proc.log_path:
            assert secret not in path.read_text(errors="replace"), path
