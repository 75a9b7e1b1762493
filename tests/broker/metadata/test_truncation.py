"""A slave whose log is cut (a divergent tail) applies again from the cut: what it applied
from the tail is undone by the master's snapshot, and nothing after the cut is skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orbitmq.broker.metadata.records import METADATA_TOPIC, TopicPut, encode_envelopes
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import MessageBatch
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfig
from orbitmq.store.message_store import MessageStore
from tests.broker.ha.test_replication import master_config, running, slave_config, wait_until
from tests.broker.metadata.test_replicated import create_topic, meta


async def test_a_cut_tail_is_applied_again_from_the_cut(tmp_path: Path) -> None:
    client = RemotingClient()
    m_config = master_config(tmp_path / "m")
    async with running(m_config) as master:
        s_config = slave_config(tmp_path / "s", master)
        async with running(s_config) as slave:
            assert await create_topic(client, master, "A") == ResponseCode.SUCCESS
            await wait_until(lambda: slave.topics.get("A") is not None)
            epoch = slave.store.epochs.last_epoch
    # The slave's log gets a metadata record its master never had, in the master's epoch (as
    # a master that crashed before its slave copied them leaves), and applies it alone.
    store = MessageStore(s_config.store)
    store.open()
    ghost = encode_envelopes(0, epoch, [TopicPut(config=TopicConfig(topic_name="Ghost"))])
    store.put(MessageBatch(METADATA_TOPIC, 0, ghost, [b""]))
    # As on a broker that was master when it wrote it: no confirm offset kept (store/confirm.py),
    # so the restarted slave serves and applies it while its master is down.
    store.set_confirm_offset(None)
    store.close()
    async with running(s_config) as slave:
        await wait_until(lambda: slave.topics.get("Ghost") is not None)
    async with running(m_config) as master:
        assert await create_topic(client, master, "After") == ResponseCode.SUCCESS
        async with running(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: slave.topics.get("After") is not None)
            await wait_until(lambda: slave.topics.get("Ghost") is None)
            assert slave.store.truncations == 1
            assert slave.topics.get("A") is not None
            assert meta(slave).bad_records == 0
            await asyncio.to_thread(slave.store.wait_for_dispatch)
            assert set(slave.topics.topics) == set(master.topics.topics)
    await client.close()
