"""Static-mode replication in one process: a master and a slave broker on loopback (docs/ha.md).

What is checked: a sync send is answered only once the slave holds its bytes; the slave's
CommitLog is byte-identical to the master's and its ConsumeQueues match; a restarted slave
catches up; a slave with a divergent tail cuts it; async sends do not wait for a slave; a
stalled slave makes sync sends answer FLUSH_SLAVE_TIMEOUT, a missing one below
min_in_sync_replicas gets them refused; a slave refuses sends and (without slave_read_enable)
pulls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from orbitmq.broker.controller import BrokerController
from orbitmq.broker.ha.master import HaMaster
from orbitmq.broker.ha.slave import HaSlave
from orbitmq.common.codes import ResponseCode
from orbitmq.common.message import MessageBatch, encode_properties
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.messages import decode_records
from orbitmq.store.message_store import MessageStore
from orbitmq.testing import small_broker_config
from tests.broker.test_broker import pull_frame, send_frame

TOPIC = "Replicated"


def master_config(path: Path, **overrides: Any) -> Any:
    return small_broker_config(path, ha_enable=True, ha_port=0, **overrides)


def slave_config(path: Path, master: BrokerController, **overrides: Any) -> Any:
    assert isinstance(master.ha, HaMaster)
    return small_broker_config(
        path,
        ha_enable=True,
        broker_id=1,
        ha_master_address=f"127.0.0.1:{master.ha.port}",
        **overrides,
    )


@contextlib.asynccontextmanager
async def running(config: Any) -> AsyncIterator[BrokerController]:
    broker = BrokerController(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def ha_of(master: BrokerController) -> HaMaster:
    assert isinstance(master.ha, HaMaster)
    return master.ha


async def in_sync(master: BrokerController, count: int = 2) -> None:
    ha = ha_of(master)
    await wait_until(lambda: ha.in_sync_replicas >= count)


def log_bytes(store: MessageStore) -> bytes:
    cl = store.commit_log
    out = bytearray()
    pos, end = cl.min_offset, cl.max_offset
    while pos < end:
        loc = cl.view_at(pos)
        assert loc is not None
        view, at, size = loc
        n = min(size - at, end - pos)
        out += view[at : at + n]
        pos += n
    return bytes(out)


async def send(client: RemotingClient, broker: BrokerController, i: int, queue_id: int = 0) -> Any:
    return await client.invoke(broker.address, send_frame(TOPIC, [b"m%d" % i], queue_id))


async def assert_identical(master: BrokerController, slave: BrokerController) -> None:
    await wait_until(
        lambda: (
            slave.store.commit_log.max_offset == master.store.commit_log.max_offset
            and slave.store.confirm_offset == master.store.commit_log.max_offset
        )
    )
    assert log_bytes(slave.store) == log_bytes(master.store)
    await asyncio.to_thread(master.store.wait_for_dispatch)
    await asyncio.to_thread(slave.store.wait_for_dispatch)
    for qid in range(4):
        assert slave.store.max_offset(TOPIC, qid) == master.store.max_offset(TOPIC, qid)


async def test_sync_sends_reach_the_slave_before_the_ack(tmp_path: Path) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m", replication_mode="sync")) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        await in_sync(master)
        for i in range(60):
            resp = await send(client, master, i, queue_id=i % 4)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            # Answered: the slave has written every byte of it.
            assert slave.store.commit_log.max_offset > resp.fields["offset"]
        await assert_identical(master, slave)
        # A slave refuses sends, and pulls without slave_read_enable.
        resp = await send(client, slave, 0)
        assert resp.code == ResponseCode.NO_PERMISSION and "slave" in (resp.remark or "")
        slave.topics.auto_create(TOPIC)
        resp = await client.invoke(slave.address, pull_frame(TOPIC, 0, 0))
        assert resp.code == ResponseCode.NO_PERMISSION
    await client.close()


async def test_a_slave_that_restarts_catches_up(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m", replication_mode="async")) as master:
        async with running(slave_config(tmp_path / "s", master)) as slave:
            await in_sync(master)
            for i in range(20):
                assert (await send(client, master, i, i % 4)).code == ResponseCode.SUCCESS
            await assert_identical(master, slave)
        # Async mode: sends go on without the slave.
        for i in range(20, 50):
            assert (await send(client, master, i, i % 4)).code == ResponseCode.SUCCESS
        async with running(slave_config(tmp_path / "s", master)) as slave:
            await assert_identical(master, slave)
            assert slave.store.max_offset(TOPIC, 0) > 0
    await client.close()


async def test_a_slave_with_a_divergent_tail_truncates_it(tmp_path: Path) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m")) as master,
        running(slave_config(tmp_path / "s", master)) as slave,
    ):
        for i in range(10):
            assert (await send(client, master, i, i % 4)).code == ResponseCode.SUCCESS
        await assert_identical(master, slave)
        common = master.store.commit_log.max_offset
    # The slave's store gets bytes its master never had, in the old epoch (as a master of it
    # that crashed before the slave copied them would leave).
    store = MessageStore(slave_config(tmp_path / "s", master).store)
    store.open()
    props = encode_properties({})
    store.put(MessageBatch(TOPIC, 0, [b"ghost%d" % i for i in range(5)], [props] * 5))
    assert store.commit_log.max_offset > common
    store.close()
    async with running(master_config(tmp_path / "m")) as master:
        assert master.store.epochs.entries[-1] == (ha_of(master).epoch, common)
        for i in range(10, 13):
            assert (await send(client, master, i, 0)).code == ResponseCode.SUCCESS
        async with running(slave_config(tmp_path / "s", master)) as slave:
            await assert_identical(master, slave)
            assert slave.store.epochs.entries == master.store.epochs.entries
            msgs = await asyncio.to_thread(slave.store.get_messages, TOPIC, 0, 0, 100, 1 << 20)
            assert b"ghost0" not in b"".join(bytes(p) for p in msgs.body_parts)
    await client.close()


async def test_async_mode_acks_without_a_slave(tmp_path: Path) -> None:
    client = RemotingClient()
    async with running(master_config(tmp_path / "m", replication_mode="async")) as master:
        for i in range(5):
            assert (await send(client, master, i)).code == ResponseCode.SUCCESS
    await client.close()


async def test_sync_mode_below_min_isr_refuses_before_storing(tmp_path: Path) -> None:
    client = RemotingClient()
    config = master_config(tmp_path / "m", replication_mode="sync", min_in_sync_replicas=2)
    async with running(config) as master:
        # The log holds the master's metadata snapshot (written as it took office), no send.
        assert master.metadata is not None
        journal = master.metadata.journal
        await wait_until(lambda: journal.idle and not master.bridge.pending)
        before = master.store.commit_log.max_offset
        resp = await send(client, master, 0)
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp.remark
        assert "in-sync replicas" in (resp.remark or "")
        assert master.store.commit_log.max_offset == before
        assert master.store.max_offset(TOPIC, 0) == 0
        async with running(slave_config(tmp_path / "s", master)):
            await in_sync(master)
            assert (await send(client, master, 1)).code == ResponseCode.SUCCESS
        # The slave is gone (its link closed): it left the in-sync set, sends are refused.
        await wait_until(lambda: ha_of(master).in_sync_replicas == 1)
        assert (await send(client, master, 2)).code == ResponseCode.SERVICE_NOT_AVAILABLE
    await client.close()


async def test_a_stalled_slave_makes_sync_sends_time_out(tmp_path: Path) -> None:
    client = RemotingClient()
    config = master_config(
        tmp_path / "m",
        replication_mode="sync",
        slave_timeout_ms=300,
        ha_max_time_slave_not_catchup_ms=1_000,
    )
    async with running(config) as master, running(slave_config(tmp_path / "s", master)) as slave:
        await in_sync(master)
        assert isinstance(slave.ha, HaSlave)
        gate = asyncio.Event()  # the slave's writes hang, as a paused process's would

        async def stuck(*_args: object) -> object:
            await gate.wait()
            raise ConnectionError("released")

        slave.ha._call = stuck  # type: ignore[method-assign]  # a fault seam for this test only
        resp = await send(client, master, 0)
        assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, resp.remark
        assert master.store.commit_log.max_offset > 0  # stored on the master
        # Behind for ha_max_time_slave_not_catchup_ms: it leaves the in-sync set, and with
        # min_in_sync_replicas 1 the master acknowledges alone again.
        await wait_until(lambda: ha_of(master).in_sync_replicas == 1)
        assert (await send(client, master, 1)).code == ResponseCode.SUCCESS
        gate.set()
    await client.close()


async def test_a_slave_with_slave_read_enable_serves_pulls(tmp_path: Path) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m", replication_mode="sync")) as master,
        running(slave_config(tmp_path / "s", master, slave_read_enable=True)) as slave,
    ):
        await in_sync(master)
        for i in range(5):
            assert (await send(client, master, i)).code == ResponseCode.SUCCESS
        await assert_identical(master, slave)
        slave.topics.auto_create(TOPIC)  # topics are not replicated yet (docs/ha.md)
        resp = await client.invoke(slave.address, pull_frame(TOPIC, 0, 0))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in decode_records(resp.body)] == [b"m%d" % i for i in range(5)]
    await client.close()


async def test_a_slave_acking_after_flush_has_fsynced_what_was_acknowledged(
    tmp_path: Path,
) -> None:
    client = RemotingClient()
    async with (
        running(master_config(tmp_path / "m", replication_mode="sync")) as master,
        running(slave_config(tmp_path / "s", master, ha_slave_ack_after_flush=True)) as slave,
    ):
        await in_sync(master)
        for i in range(10):
            resp = await send(client, master, i)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert slave.store.commit_log.flushed_offset > resp.fields["offset"]
    await client.close()


async def test_a_slave_with_no_common_history_is_refused(tmp_path: Path) -> None:
    """A store written before replication (no epoch file) cannot tell which of its bytes the
    master has: the slave must not join, and nothing of either log changes."""
    client = RemotingClient()
    async with running(master_config(tmp_path / "m")) as master:
        assert (await send(client, master, 0)).code == ResponseCode.SUCCESS
        store = MessageStore(slave_config(tmp_path / "s", master).store)
        store.open()
        store.put(MessageBatch(TOPIC, 0, [b"own"], [encode_properties({})]))
        own_end = store.commit_log.max_offset
        store.close()
        async with running(slave_config(tmp_path / "s", master)) as slave:
            assert isinstance(slave.ha, HaSlave)
            ha = slave.ha
            await wait_until(lambda: "epoch" in ha.last_error)
            assert not ha.connected.is_set() and ha_of(master).in_sync_replicas == 1
            assert slave.store.commit_log.max_offset == own_end
    await client.close()
