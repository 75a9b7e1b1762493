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

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
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


async def test_a_replay_from_the_start_keeps_the_topics_data(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        s_config = slave_config(tmp_path / "s", master)
        async with running(s_config) as slave:
            await in_sync(master)
            assert await create_topic(client, master, "Kept") == ResponseCode.SUCCESS
            for i in range(10):
                resp = await client.invoke(master.address, send_frame("Kept", [b"m%d" % i], 0))
                assert resp.code == ResponseCode.SUCCESS
            await wait_until(lambda: slave.store.max_offset("Kept", 0) == 10)
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
