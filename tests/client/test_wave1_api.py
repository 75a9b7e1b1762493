"""The wave-1 client API that code outside the project calls, kept working.

The side-by-side benchmark harness (a folder beside the project that the project may not edit)
drives OrbitMQ through ``orbitmq.client`` with the calls below, written for wave 1's API:
``AdminClient`` as the asyncio admin client, settings as keywords of the constructors, and a few
attributes (``routes``, ``remoting``, ``async_producer``, ``_thread.loop``). These tests make the
same calls, in the same shapes, against a real NameServer and broker, so a change that breaks
that harness breaks here first. They copy the calls, not the harness's file.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from orbitmq.client import (
    AdminClient,
    AdminConfig,
    AsyncAdminClient,
    AsyncLitePullConsumer,
    AsyncProducer,
    AsyncPushConsumer,
    AsyncSimpleConsumer,
    AsyncTransactionProducer,
    BlockingAdminClient,
    ConsumeFromWhere,
    ConsumeResult,
    LitePullConsumer,
    LocalTransactionState,
    Message,
    Producer,
    ProducerConfig,
    PushConsumer,
    SendStatus,
    SimpleConsumer,
    TransactionProducer,
)
from orbitmq.client._settings import ClientConfigError
from tests.client.test_e2e import RealCluster, start_cluster, stop_cluster

_SEND_OK = SendStatus.SEND_OK
_SUCCESS = ConsumeResult.SUCCESS
_FIRST = ConsumeFromWhere.FIRST_OFFSET
N = 60


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[RealCluster]:
    c = await start_cluster(tmp_path)
    try:
        yield c
    finally:
        await stop_cluster(c)


async def run_blocking(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def prepare(admin: AdminClient, topic: str, queues: int) -> None:
    with contextlib.suppress(Exception):  # as the harness: a topic not there is fine
        await admin.delete_topic(topic)
    await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while True:  # bounded: until the NameServer routes it
        try:
            route = await admin.topic_route(topic)
            if route.queue_datas:
                break
        except Exception:
            if loop.time() > end:
                raise
        if loop.time() > end:
            raise AssertionError(f"no route for {topic} after 15 s")
        await asyncio.sleep(0.05)


async def warm(producer: AsyncProducer | Producer, topic: str) -> None:
    ap = producer.async_producer if isinstance(producer, Producer) else producer

    async def go() -> None:
        info = await ap.routes.get(topic)
        for addr in set(info.broker_addrs.values()):
            await ap.remoting.connection(addr)

    if isinstance(producer, Producer):
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(go(), producer._thread.loop))
    else:
        await go()


async def test_async_clients_as_the_harness_calls_them(real: RealCluster) -> None:
    admin = AdminClient(real.addr)
    await admin.start()
    try:
        masters = await admin.masters()
        assert masters
        versions = []
        for _name, addr in masters.items():
            info = await admin.broker_runtime_info(addr)
            versions.append(info.get("flush_disk_type", "?"))
        assert "?" not in versions
        topic = "Wave1Async"
        await prepare(admin, topic, 2)

        producer = await AsyncProducer(real.addr).start()
        lat_producer = await AsyncProducer(real.addr, linger_ms=0).start()
        assert lat_producer.config.linger_ms == 0
        try:
            await warm(producer, topic)
            await warm(lat_producer, topic)
            ok = failed = 0

            def done(fut: asyncio.Future[Any]) -> None:
                nonlocal ok, failed
                if not fut.cancelled() and fut.exception() is None:
                    ok += fut.result().status is _SEND_OK
                else:
                    failed += 1

            for i in range(N):
                producer.send_async(Message(topic, b"%d" % i)).add_done_callback(done)
            await producer.flush()
            r = await producer.send_batch([Message(topic, b"b%d" % i) for i in range(4)])
            assert r.status is _SEND_OK
            lat_producer.send_async(Message(topic, b"lat")).add_done_callback(done)
            await lat_producer.flush()
            for _ in range(1000):  # done callbacks run a loop turn later (bounded)
                if ok + failed == N + 1:
                    break
                await asyncio.sleep(0.001)
            assert (ok, failed) == (N + 1, 0)
        finally:
            await producer.close()
            await lat_producer.close()

        got: list[bytes] = []
        enough = asyncio.Event()

        async def listener(msgs: list[Any]) -> ConsumeResult:
            got.extend(m.body for m in msgs)
            if len(got) >= N + 5:
                enough.set()
            return _SUCCESS

        c = AsyncPushConsumer(
            real.addr, f"{topic}_bench", consume_from_where=_FIRST, consume_batch_size=32,
            pull_batch_size=64,
        )  # fmt: skip
        assert c.config.consume_batch_size == 32
        c.subscribe(topic, "*")
        c.register_listener(listener)
        await c.start()
        try:
            await asyncio.wait_for(enough.wait(), 20)
            assert len([q for q in c.assignment() if q.topic == topic]) == 2 * len(real.brokers)
        finally:
            await c.close()

        lp = AsyncLitePullConsumer(
            real.addr, f"{topic}_lp", consume_from_where=_FIRST, pull_batch_size=64, poll_max=32
        )
        lp.subscribe(topic, "*")
        await lp.start()
        try:
            polled = 0
            end = asyncio.get_running_loop().time() + 20
            while polled < N + 5 and asyncio.get_running_loop().time() < end:
                msgs = await lp.poll(timeout_s=1.0)
                assert len(msgs) <= 32
                polled += len(msgs)
            assert polled == N + 5
        finally:
            await lp.close()
        await asyncio.wait_for(admin.delete_topic(topic), 30)
    finally:
        await admin.close()


async def test_blocking_clients_as_the_harness_calls_them(real: RealCluster) -> None:
    async with AdminClient(real.addr) as admin:
        topic = "Wave1Blocking"
        await prepare(admin, topic, 2)
    producer: Producer = await run_blocking(lambda: Producer(real.addr, linger_ms=0))
    try:
        assert producer.config.linger_ms == 0
        await warm(producer, topic)
        cond = threading.Condition()
        st = {"done": 0, "ok": 0}

        def cb(result: Any, error: BaseException | None) -> None:  # the producer's I/O thread
            with cond:
                st["done"] += 1
                st["ok"] += error is None and result.status is _SEND_OK
                cond.notify_all()

        for i in range(N):
            producer.send_async(Message(topic, b"%d" % i), cb)

        def wait_all() -> None:
            with cond:
                assert cond.wait_for(lambda: st["done"] >= N, 30)

        await run_blocking(wait_all)
        assert st == {"done": N, "ok": N}
    finally:
        await run_blocking(producer.close)

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    lock = threading.Lock()
    seen: list[bytes] = []

    def listener(msgs: list[Any]) -> ConsumeResult:  # the consumer's thread pool
        with lock:
            seen.extend(m.body for m in msgs)
            if len(seen) >= N:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
        return _SUCCESS

    c = PushConsumer(
        real.addr, f"{topic}_bench", consume_from_where=_FIRST, consume_batch_size=32,
        pull_batch_size=64,
    )  # fmt: skip
    c.subscribe(topic, "*")
    c.register_listener(listener)
    await run_blocking(c.start)
    try:
        await asyncio.wait_for(asyncio.shield(done), 20)
        held = await run_blocking(c.assignment)
        assert len([q for q in held if q.topic == topic]) == 2 * len(real.brokers)
    finally:
        await run_blocking(c.close)
    assert sorted(seen) == sorted(b"%d" % i for i in range(N))


def test_async_admin_client_is_admin_client() -> None:
    assert AsyncAdminClient is AdminClient
    assert BlockingAdminClient.__name__ == "BlockingAdminClient"


class _Listener:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


NS = "127.0.0.1:1"  # nothing is contacted: constructors only
ASYNC_MAKERS: dict[str, Callable[..., Any]] = {
    "AsyncProducer": lambda **kw: AsyncProducer(NS, **kw),
    "AsyncPushConsumer": lambda **kw: AsyncPushConsumer(NS, "G", **kw),
    "AsyncLitePullConsumer": lambda **kw: AsyncLitePullConsumer(NS, "G", **kw),
    "AsyncSimpleConsumer": lambda **kw: AsyncSimpleConsumer(NS, "G", **kw),
    "AsyncTransactionProducer": lambda **kw: AsyncTransactionProducer(NS, "G", _Listener(), **kw),
    "AdminClient": lambda **kw: AdminClient(NS, **kw),
}
BLOCKING_MAKERS: dict[str, Callable[..., Any]] = {
    "Producer": lambda **kw: Producer(NS, **kw),
    "PushConsumer": lambda **kw: PushConsumer(NS, "G", **kw),
    "LitePullConsumer": lambda **kw: LitePullConsumer(NS, "G", **kw),
    "SimpleConsumer": lambda **kw: SimpleConsumer(NS, "G", **kw),
    "TransactionProducer": lambda **kw: TransactionProducer(NS, "G", _Listener(), **kw),
    "BlockingAdminClient": lambda **kw: BlockingAdminClient(NS, **kw),
}
# A field every config of that client has, and a valid and an invalid value for it.
FIELD = {
    "Producer": ("send_timeout_s", 7.0, -1.0),
    "AsyncProducer": ("send_timeout_s", 7.0, -1.0),
    "AsyncTransactionProducer": ("send_timeout_s", 7.0, -1.0),
    "TransactionProducer": ("send_timeout_s", 7.0, -1.0),
    "AsyncPushConsumer": ("pull_batch_size", 16, 0),
    "PushConsumer": ("pull_batch_size", 16, 0),
    "AsyncLitePullConsumer": ("pull_batch_size", 16, 0),
    "LitePullConsumer": ("pull_batch_size", 16, 0),
    "AsyncSimpleConsumer": ("request_timeout_s", 7.0, 0.0),
    "SimpleConsumer": ("request_timeout_s", 7.0, 0.0),
    "AdminClient": ("timeout_s", 7.0, 0.0),
    "BlockingAdminClient": ("timeout_s", 7.0, 0.0),
}


@pytest.mark.parametrize("name", sorted(BLOCKING_MAKERS))
def test_blocking_constructors_take_keyword_overrides(name: str) -> None:
    make = BLOCKING_MAKERS[name]
    field, good, bad = FIELD[name]
    with pytest.raises(TypeError, match="'no_such_setting'"):
        make(no_such_setting=1)
    with pytest.raises(ClientConfigError, match=field):
        make(**{field: bad})
    if name in ("Producer", "TransactionProducer"):
        return  # they start (and connect) on construction: checked with a broker above
    client = make(**{field: good})
    try:
        assert getattr(client._async.config, field) == good
    finally:
        client.close()


@pytest.mark.parametrize("name", sorted(ASYNC_MAKERS))
async def test_async_constructors_take_keyword_overrides(name: str) -> None:
    make = ASYNC_MAKERS[name]
    field, good, bad = FIELD[name]
    with pytest.raises(TypeError, match="'no_such_setting'"):
        make(no_such_setting=1)
    with pytest.raises(ClientConfigError, match=field):
        make(**{field: bad})
    client = make(**{field: good})
    assert getattr(client.config, field) == good


def test_overrides_replace_fields_of_the_given_config() -> None:
    base = ProducerConfig(linger_ms=2.0, batch_max_messages=64)
    p = AsyncProducer(NS, base, linger_ms=0)
    assert (p.config.linger_ms, p.config.batch_max_messages) == (0, 64)
    assert base.linger_ms == 2.0  # the caller's object is not changed
    a = AdminClient(NS, config=AdminConfig(timeout_s=4.0), connect_timeout_s=1.0)
    assert (a.config.timeout_s, a.config.connect_timeout_s) == (4.0, 1.0)
    t = AsyncTransactionProducer(NS, "G", _Listener(), check_concurrency=3)
    assert (t.config.group, t.config.check_concurrency) == ("G", 3)
