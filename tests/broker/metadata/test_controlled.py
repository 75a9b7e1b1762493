"""Metadata replication in controller mode, one process: a one-node controller and two brokers
of one group (``sync``, ``min_in_sync_replicas = 2``). The master the
controller elects writes the metadata log (its take-office snapshot logged once, its journal
healthy: a switch to master must not wait on the replication of its own snapshot), the slave
applies it, and after the master stops the slave the controller promotes has the topic, the
group config and the offsets, and writes the log itself: the old master, back as a slave, gets its changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metadata.records import METADATA_TOPIC, SnapshotBegin, decode_envelope
from orbitmq.common.codes import ResponseCode
from orbitmq.common.record import decode
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.consumer import QueueOffset
from tests.broker.ha.test_controlled import (
    broker_config,
    controller,
    masters,
    office,
    port_pair,
    role,
    wait_until,
)
from tests.broker.metadata.test_replicated import commit, create_group, create_topic, meta
from tests.broker.test_broker import send_frame


def snapshots(broker: BrokerController) -> list[int]:
    """The epochs of the take-office snapshots in the broker's metadata log."""
    res = broker.store.get_messages(METADATA_TOPIC, 0, 0, 1000)
    epochs = []
    for view in res.messages:
        env = decode_envelope(decode(bytes(view)).body)
        if any(isinstance(c, SnapshotBegin) for c in env.changes):
            epochs.append(env.epoch)
    return epochs


async def test_elected_masters_write_the_metadata_log(tmp_path: Path) -> None:
    client = RemotingClient()
    ports = [port_pair() for _ in range(2)]
    brokers: list[BrokerController] = []
    async with controller(tmp_path) as node:
        try:
            for i in range(2):
                config = broker_config(tmp_path / f"b{i}", node, ports[i], auto_create_topic=False)
                brokers.append(BrokerController(config))
                await brokers[-1].start()
            await wait_until(lambda: len(masters(brokers)) == 1)
            first = masters(brokers)[0]
            [other] = [b for b in brokers if b is not first]
            await wait_until(lambda: len(office(first).sync_state_set) == 2)
            journal = meta(first).journal
            assert journal.active and journal.health.failures == 0
            assert snapshots(first) == [office(first).epoch]
            assert not meta(other).journal.active

            assert await create_topic(client, first, "Orders") == ResponseCode.SUCCESS
            assert await create_group(client, first, "Billing") == ResponseCode.SUCCESS
            for i in range(4):
                resp = await client.invoke(first.address, send_frame("Orders", [b"m%d" % i], 0))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            await asyncio.to_thread(first.store.wait_for_dispatch)
            offsets = [QueueOffset(topic="Orders", queue_id=0, offset=3)]
            assert await commit(client, first, "Billing", offsets) == ResponseCode.SUCCESS
            # A slave takes no change from a client, and applies the master's.
            assert await create_topic(client, other, "Nope") == ResponseCode.NO_PERMISSION
            await wait_until(lambda: other.offsets.query("Billing", "Orders", 0) == 3)
            assert other.topics.get("Orders") is not None

            old_epoch = office(first).epoch
            await first.stop()
            await wait_until(lambda: role(other).is_master)
            assert office(other).epoch > old_epoch
            journal = meta(other).journal
            assert journal.active and journal.health.failures == 0
            assert other.topics.get("Orders") is not None
            assert other.groups.get("Billing").retry_max_times == 4
            assert other.offsets.query("Billing", "Orders", 0) == 3
            assert snapshots(other)[-1] == office(other).epoch
            # The old master back, a slave: the new master's changes reach it.
            back = BrokerController(broker_config(tmp_path / f"b{brokers.index(first)}", node,
                                                  ports[brokers.index(first)],
                                                  auto_create_topic=False))  # fmt: skip
            brokers.append(back)
            await back.start()
            await wait_until(lambda: len(office(other).sync_state_set) == 2)
            assert not meta(back).journal.active
            assert await create_topic(client, other, "After") == ResponseCode.SUCCESS
            await wait_until(lambda: back.topics.get("After") is not None)
        finally:
            for b in brokers:
                await b.stop()
    await client.close()
