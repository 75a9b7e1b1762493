"""A replica that replays its metadata log from the start keeps the data of its topics.

A restarted replica whose checkpoint no longer matches its log (``record N is not the one
applied``: after an unclean recovery) replays the whole metadata log. That log starts with the
snapshot its first master logged on taking office, older than any topic created since: the
snapshot's end drops those topics' configs, and the later records put them back. Their queues
must survive that: a topic's data is deleted only when the log is applied to its end and the
topic is still gone. (Deleting at the snapshot's end destroyed every acknowledged message of the
topic on that replica: found by tests/chaos/test_ha_official_client.py, three master kills.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.metadata.records import METADATA_TOPIC
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.store import layout
from orbitmq.store.confirm import ConfirmFile
from orbitmq.store.reader import GetStatus
from tests.broker.ha.test_replication import (
    in_sync,
    master_config,
    running,
    slave_config,
    wait_until,
)
from tests.broker.metadata.test_replicated import create_topic, meta
from tests.broker.test_broker import send_frame


async def kept_topic_with_ten(
    client: RemotingClient, master: BrokerController, slave: BrokerController
) -> None:
    """Topic "Kept" created on the master, ten messages in its queue 0, all on the slave."""
    await in_sync(master)
    assert await create_topic(client, master, "Kept") == ResponseCode.SUCCESS
    for i in range(10):
        resp = await client.invoke(master.address, send_frame("Kept", [b"m%d" % i], 0))
        assert resp.code == ResponseCode.SUCCESS
    await wait_until(lambda: slave.store.max_offset("Kept", 0) == 10)


async def test_a_replay_from_the_start_keeps_the_topics_data(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        s_config = slave_config(tmp_path / "s", master)
        async with running(s_config) as slave:
            await kept_topic_with_ten(client, master, slave)
            await wait_until(lambda: meta(slave).applied_offset > 0)
            checkpoint = meta(slave).path
        await client.close()
    # As after an unclean recovery: the record before the checkpoint is not where it was.
    raw = json.loads(checkpoint.read_text())
    raw["last_physical"] += 1
    checkpoint.write_text(json.dumps(raw))
    async with running(s_config) as slave:
        await wait_until(lambda: meta(slave).applied_offset >= raw["applied_offset"])
        assert slave.topics.get("Kept") is not None
        got = slave.store.get_messages("Kept", 0, 0, 32)
        assert got.status is GetStatus.FOUND, got.status
        assert len(got.messages) == 10


@pytest.mark.parametrize("checkpoint_moved", [False, True], ids=["checkpoint", "replay"])
async def test_applied_records_above_the_kept_confirm_offset_keep_the_topics_data(
    tmp_path: Path, checkpoint_moved: bool
) -> None:
    """A replica applies metadata up to the live confirm offset but keeps that offset on disk
    about once a second; after a crash it dispatches only up to the kept one, so its checkpoint
    can name a record that is in the log but not dispatched. Treated as a cut, the replay from
    0 met the first master's snapshot, dropped the topic created since and deleted its queues:
    the replica, elected master, numbered new messages from queue offset 0 over the old ones
    (tests/chaos/test_ha_power_cut.py lost 142 acknowledged messages this way). Now the
    checkpoint is kept (``checkpoint``), and a real replay (``replay``: the record is not where
    the checkpoint says) deletes no topic's data before every metadata record the log holds is
    applied."""
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        s_config = slave_config(tmp_path / "s", master)
        async with running(s_config) as slave:
            await kept_topic_with_ten(client, master, slave)
            meta_cq = slave.store.queues.get(METADATA_TOPIC, 0)
            assert meta_cq is not None
            await wait_until(lambda: meta(slave).applied_offset == meta_cq.max_offset)
            entry = meta_cq.entry(meta(slave).applied_offset - 1)  # the topic's TopicPut
            assert entry is not None
            put_at = entry[0]
            checkpoint = meta(slave).path
        await client.close()
    # The crash: the kept confirm offset is below the topic's record, the derived files are
    # rebuilt up to it (no clean checkpoint, an abort marker).
    store = tmp_path / "s"
    ConfirmFile(store / "confirm").save(put_at)
    (store / layout.CHECKPOINT_FILE).unlink()
    (store / layout.ABORT_FILE).touch()
    if checkpoint_moved:
        raw = json.loads(checkpoint.read_text())
        raw["last_physical"] += 1
        checkpoint.write_text(json.dumps(raw))
    async with running(s_config) as slave:  # its master is gone: nothing confirms more
        assert slave.store.commit_log.confirm_offset == put_at
        await meta(slave).catch_up()
        assert slave.store.commit_log.queue_offsets[("Kept", 0)] == 10
        assert slave.store.queues.get("Kept", 0) is not None
        if not checkpoint_moved:
            assert slave.topics.get("Kept") is not None
        # Replication confirms the rest: the topic and its ten messages are there.
        slave.store.set_confirm_offset(None)
        await wait_until(lambda: slave.topics.get("Kept") is not None)
        await wait_until(lambda: meta(slave).applied_offset == meta_cq_max(slave))
        got = slave.store.get_messages("Kept", 0, 0, 32)
        assert got.status is GetStatus.FOUND, got.status
        assert len(got.messages) == 10


def meta_cq_max(broker: BrokerController) -> int:
    cq = broker.store.queues.get(METADATA_TOPIC, 0)
    return 0 if cq is None else cq.max_offset
