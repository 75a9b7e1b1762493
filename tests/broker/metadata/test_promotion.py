"""A slave promoted by hand (restarted as master on its own store) carries on its master's Pop
consumers: the replicated Pop secret accepts the old master's receipt handles, and the Pop
progress and checkpoints (revive log, offsets) keep popped messages from coming again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from orbitmq.testing import small_broker_config
from tests.broker.ha.test_replication import (
    in_sync,
    master_config,
    running,
    slave_config,
    wait_until,
)
from tests.broker.metadata.test_replicated import create_topic
from tests.broker.test_broker import send_frame
from tests.broker.test_pop import GROUP, ack, pop, send

TOPIC = "PopHa"


def low_offset(path: Path) -> int:
    """The timer fire checkpoint's ``low_offset`` (-1: no checkpoint yet)."""
    try:
        return int(json.loads(path.read_bytes())["low_offset"])
    except FileNotFoundError:
        return -1


async def test_pop_handles_and_progress_survive_a_promotion(tmp_path: Path) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m", replication_mode="sync")) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        await in_sync(master)
        assert await create_topic(client, master, TOPIC) == ResponseCode.SUCCESS
        for q in range(2):
            await send(client, master, TOPIC, [b"a%d" % q, b"b%d" % q, b"c%d" % q], queue_id=q)
        _resp, msgs, handles = await pop(client, master, TOPIC)
        assert len(msgs) == 6
        assert (await ack(client, master, TOPIC, handles[0])).code == ResponseCode.SUCCESS
        popped = master.offsets.offsets(GROUP)
        # Pop progress is logged within metadata_offset_log_interval_ms (coalesced).
        await wait_until(lambda: slave.offsets.offsets(GROUP) == popped)
        secret = (tmp_path / "m" / "config" / "pop.secret").read_bytes()
        assert (tmp_path / "s" / "config" / "pop.secret").read_bytes() == secret
    async with running(small_broker_config(tmp_path / "s", ha_enable=True, ha_port=0)) as new:
        assert new.topics.get(TOPIC) is not None
        # A handle the old master issued is valid here (same secret, the CK replicated).
        assert (await ack(client, new, TOPIC, handles[1])).code == ResponseCode.SUCCESS
        # Nothing popped comes again while invisible: the offsets moved past all six.
        _resp, again, _h = await pop(client, new, TOPIC)
        assert again == []
    await client.close()


async def test_timers_fired_by_the_old_master_do_not_fire_again(tmp_path: Path) -> None:
    client = RemotingClient()
    checkpoint = Path("config") / "timer_checkpoint.json"
    async with (
        running(master_config(tmp_path / "m", replication_mode="sync")) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        await in_sync(master)
        assert await create_topic(client, master, "Later") == ResponseCode.SUCCESS
        resp = await client.invoke(
            master.address, send_frame("Later", [b"due"], 0, TIMER_DELAY_MS="200")
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_until(lambda: master.store.max_offset("Later", 0) == 1)
        # The fire checkpoint that covers the delivery reaches the slave (in log order).
        await wait_until(lambda: low_offset(tmp_path / "m" / checkpoint) >= 1)
        await wait_until(lambda: low_offset(tmp_path / "s" / checkpoint) >= 1)
        await wait_until(lambda: slave.store.max_offset("Later", 0) == 1)
    async with running(small_broker_config(tmp_path / "s", ha_enable=True, ha_port=0)) as new:
        await asyncio.sleep(1.0)  # a timer due while down fires at once after a start
        assert new.store.max_offset("Later", 0) == 1
    await client.close()
