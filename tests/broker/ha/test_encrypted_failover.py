"""Encryption at rest in controller mode, through a failover (docs/security.md, "With HA
replication"): three encrypted brokers sharing a master key; the master stops; the new master
keeps writing into the segments whose keys it got over the HA link, with a writer epoch of its
own term; the old master rejoins and ends byte-identical; every message reads back in clear on
every replica (the bodies not being on disk in clear is tests/broker/test_encrypted_broker.py's)."""

from __future__ import annotations

import os
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from tests.broker.ha.test_controlled import (
    broker_config,
    controller,
    masters,
    office,
    port_pair,
    role,
    send_ok,
    wait_until,
)
from tests.broker.ha.test_replication import log_bytes


async def test_encrypted_group_fails_over_and_rejoins(tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    enc = {"encrypt_at_rest": True, "encryption_key_file": str(key)}
    client = RemotingClient()
    ports = [port_pair() for _ in range(3)]
    brokers: list[BrokerController] = []
    async with controller(tmp_path) as node:
        try:
            for i in range(3):
                b = BrokerController(broker_config(tmp_path / f"b{i}", node, ports[i], store=enc))
                await b.start()
                brokers.append(b)
            await wait_until(lambda: len(masters(brokers)) == 1)
            first = masters(brokers)[0]
            await wait_until(lambda: len(office(first).sync_state_set) == 3)
            acked = {i: await send_ok(client, first, i) for i in range(30)}
            slaves = [b for b in brokers if b is not first]
            at = brokers.index(first)
            await first.stop()
            await wait_until(lambda: len(masters(slaves)) == 1)
            second = masters(slaves)[0]
            await wait_until(lambda: len(office(second).sync_state_set) >= 2)
            sealer = second.store.sealer
            assert sealer is not None and sealer.epoch.value >= office(second).epoch << 16
            for i in range(30, 50):
                acked[i] = await send_ok(client, second, i)
            back = BrokerController(broker_config(tmp_path / f"b{at}", node, ports[at], store=enc))
            await back.start()
            brokers.append(back)
            await wait_until(lambda: isinstance(role(back).role, HaSlave))
            await wait_until(
                lambda: back.store.commit_log.max_offset == second.store.commit_log.max_offset
            )
            assert log_bytes(back.store) == log_bytes(second.store)
            for replica in (second, back):
                for i, offset in acked.items():
                    record = replica.store.read_record(offset)
                    assert record is not None, (replica.address, i)
                    assert [m.body for m in decode_records(bytes(record))] == [b"m%d" % i]
        finally:
            for b in brokers:
                await b.stop()
            await client.close()
