"""A transaction decision is answered only once it is replicated (sync mode), as a send is.

Before this, END_TRANSACTION COMMIT answered SUCCESS as soon as the master had appended the
copy and its op record. A master SIGKILLed right after the answer took them with it: the new
master held the half as undecided while the producer (the Spark exactly-once sink's driver) had
been told COMMITTED and moved on; its rows reached the topic only if a check-back found a live
producer of the group before the half was discarded. The Spark topic -> topic HA run lost 240
rows that way (docs/ha.md). In one process: a sync master and its slave, the slave's writes
stalled through the same fault seam test_replication.py uses. A slave refuses decisions
(NO_PERMISSION): its transaction state is not the master's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from orbitmq.broker.ha.slave import HaSlave
from orbitmq.common.codes import ResponseCode
from orbitmq.net.client import RemotingClient
from tests.broker.ha.test_replication import in_sync, master_config, running, slave_config
from tests.broker.test_transaction import end, make_topic, prepare, visible

TOPIC = "TxReplicated"
SUCCESS = ResponseCode.SUCCESS


async def test_a_commit_is_answered_only_once_the_slave_holds_it(tmp_path: Path) -> None:
    client = RemotingClient()
    config = master_config(tmp_path / "m", replication_mode="sync", slave_timeout_ms=300)
    async with running(config) as master, running(slave_config(tmp_path / "s", master)) as slave:
        await in_sync(master)
        make_topic(master, TOPIC)

        # A healthy slave: when the COMMIT is answered, the slave's log holds the copy.
        resp, msg_id = await prepare(client, master, TOPIC, b"first")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        ok = await end(client, master, resp, msg_id, "COMMIT")
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        answered_at = master.store.commit_log.max_offset
        assert slave.store.commit_log.max_offset >= answered_at
        slave.topics.auto_create(TOPIC)
        assert [m.body for m in await visible(slave, TOPIC)] == [b"first"]
        # A slave decides nothing (its state is not the master's): the producer asks again.
        for state in ("COMMIT", "ROLLBACK", "UNKNOWN"):
            refused = await end(client, slave, resp, msg_id, state)
            assert refused.code == ResponseCode.NO_PERMISSION, (state, refused.remark)

        # The slave stalls after the half reached it: the COMMIT is applied on the master but
        # not confirmed, so it is not answered SUCCESS (FLUSH_SLAVE_TIMEOUT: send it again).
        resp, msg_id = await prepare(client, master, TOPIC, b"second")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert isinstance(slave.ha, HaSlave)
        gate = asyncio.Event()

        async def stuck(*_args: object) -> object:
            await gate.wait()
            raise ConnectionError("released")

        slave.ha._call = stuck  # type: ignore[method-assign]  # the fault seam, this test only
        cut = await end(client, master, resp, msg_id, "COMMIT")
        assert cut.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (cut.code, cut.remark)
        # Repeating it is not a way round the wait: the decision is applied once, but its
        # answer still waits for the slave.
        again = await end(client, master, resp, msg_id, "COMMIT")
        assert again.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (again.code, again.remark)
        # (Readers see only what the slaves confirmed, so not the second copy yet.)
        assert [m.body for m in await visible(master, TOPIC)] == [b"first"]
        gate.set()  # the slave links again (or leaves the in-sync set): then it is answered
        deadline = asyncio.get_running_loop().time() + 15
        while (done := await end(client, master, resp, msg_id, "COMMIT")).code != SUCCESS:
            assert done.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (done.code, done.remark)
            assert asyncio.get_running_loop().time() < deadline, "the slave never caught up"
            await asyncio.sleep(0.1)
        assert [m.body for m in await visible(master, TOPIC)] == [b"first", b"second"]
    await client.close()
