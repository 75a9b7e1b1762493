"""Requests started without a task (``eager_codes``): run in the read callback up to their first
wait, resumed by the future they wait on; arrival order, ``max_in_flight`` and error answers as
for task-run requests."""

from __future__ import annotations

import asyncio

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MessageIllegalError
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection, Reply
from orbitmq.net.server import RemotingServer
from orbitmq.protocol.frame import Frame

EAGER, WAITING, FAILING, BARE_YIELD, TASKED = 1, 2, 3, 4, 5


class Recorder:
    def __init__(self) -> None:
        self.started: list[int] = []
        self.in_task: dict[int, bool] = {}
        self.running = 0
        self.most = 0
        self.gate: asyncio.Future[None] | None = None

    async def handle(self, frame: Frame, conn: Connection) -> Reply:
        i = int(frame.fields.get("i", -1))
        self.started.append(i)
        self.in_task[i] = asyncio.current_task() is not None
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if frame.code == WAITING:
                if self.gate is None:
                    self.gate = asyncio.get_running_loop().create_future()
                await self.gate
            elif frame.code == FAILING:
                raise MessageIllegalError("bad send")
            elif frame.code == BARE_YIELD:
                await asyncio.sleep(0)
                await asyncio.sleep(0.01)
        finally:
            self.running -= 1
        return frame.reply(ResponseCode.SUCCESS, fields={"i": i})


async def test_eager_requests_start_in_order_without_a_task_and_answer() -> None:
    rec = Recorder()
    codes = frozenset({EAGER, WAITING, FAILING, BARE_YIELD})
    server = RemotingServer(rec.handle, eager_codes=codes)
    await server.start()
    client = RemotingClient()

    async def pipelined(kinds: list[int], first: int) -> None:
        frames = [Frame(k, fields={"i": first + i}) for i, k in enumerate(kinds)]
        replies = await asyncio.gather(
            *(client.invoke(server.address, f, timeout=5) for f in frames)
        )
        for i, (kind, reply) in enumerate(zip(kinds, replies, strict=True)):
            if kind == FAILING:  # the handler's error answered as its code
                assert reply.code == ResponseCode.MESSAGE_ILLEGAL, reply
            else:
                assert reply.code == ResponseCode.SUCCESS and reply.fields["i"] == first + i

    try:
        eager = [EAGER, BARE_YIELD, FAILING, EAGER] * 8
        await pipelined(eager, 0)
        assert rec.started == list(range(len(eager)))
        assert not any(rec.in_task.values())  # none ran in a task
        # Mixed with task-run codes: still started in arrival order (an eager request behind
        # a task not yet started runs in a task as well).
        rec.started.clear()
        mixed = [EAGER, TASKED, EAGER, BARE_YIELD, TASKED, FAILING] * 6
        await pipelined(mixed, 100)
        assert rec.started == [100 + i for i in range(len(mixed))]
        assert all(rec.in_task[100 + i] for i, k in enumerate(mixed) if k == TASKED)
        conn = next(iter(server.connections))
        assert conn.is_idle and conn._unstarted == 0 and conn._tasks.failures == 0
    finally:
        await client.close()
        await server.stop()


async def test_eager_requests_count_against_max_in_flight() -> None:
    rec = Recorder()
    server = RemotingServer(rec.handle, max_in_flight=3, eager_codes=frozenset({WAITING}))
    await server.start()
    client = RemotingClient()
    try:
        calls = [
            asyncio.ensure_future(
                client.invoke(server.address, Frame(WAITING, fields={"i": i}), timeout=5)
            )
            for i in range(12)
        ]
        for _ in range(200):  # bounded: until the first three hold the connection's slots
            if len(rec.started) >= 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert rec.started == [0, 1, 2] and rec.most == 3  # the rest wait unread
        assert rec.gate is not None
        rec.gate.set_result(None)  # every waiter resumes; the backlog starts in order
        replies = await asyncio.gather(*calls)
        assert [r.fields["i"] for r in replies] == list(range(12))
        assert rec.started == list(range(12))
        assert rec.most <= 3
    finally:
        await client.close()
        await server.stop()
