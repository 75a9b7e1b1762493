"""The producer: :class:`AsyncProducer` on asyncio, :class:`Producer` blocking on top of it.

Send modes:

- ``send``: one SEND_MESSAGE, waits for the broker's answer. A retriable failure (connection lost,
  SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, TOPIC_NOT_EXIST, NO_PERMISSION, ...) is retried up to
  ``retry_times_when_send_failed`` more times, on another broker when there is one, within one
  ``send_timeout_s`` budget for all tries.
- ``send_batch``: several messages of one topic as one SEND_BATCH_MESSAGE (one queue, one result).
- ``send_oneway``: one SEND_MESSAGE with the ONEWAY flag; no answer, no result.
- ``send_async``: returns a future at once. Messages are accumulated per (topic, queue, sys_flag,
  flag) for up to ``linger_ms``, ``batch_max_bytes`` or ``batch_max_messages`` and go out as one
  SEND_BATCH_MESSAGE; each message's future gets its own SendResult (queue offset = the batch's
  first + index). Messages without an explicit queue or selector are batched per topic and the
  whole batch goes to one queue picked round-robin, so batches stay large however many queues
  the topic has. Sends to an explicit queue (or through a selector) keep their order: one batch
  per queue is in flight at a time. A message with a message group (``__SHARDINGKEY``, see
  :mod:`orbitmq.client.fifo`) and no queue or selector goes to its group's queue.

Every message gets its unique id (UNIQ_CLIENT_MESSAGE_ID_KEYIDX) here, before it is sent, so a
SendResult's ``msg_id`` is the id the broker stores and indexes. A body larger than
``compress_over_bytes`` is zstd-compressed and flagged ``SYSFLAG_COMPRESSED |
SYSFLAG_COMPRESSION_ZSTD``; the flag is per send frame, so compressed and plain messages never
share a batch.

Answers that mean "stored, but not as safely as asked" (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
SLAVE_NOT_AVAILABLE) become a SendResult with that status when the broker reports where the
message went, and are never retried (a retry would store the message twice).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol

import crc32c

from orbitmq.client import _codec
from orbitmq.client._loop_thread import BlockingFacade, LoopThread
from orbitmq.client.fault import FaultStrategy
from orbitmq.client.fifo import check_batch_groups, selector_for
from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    EmptyBodyError,
    MessageIllegalError,
    MessageTooLargeError,
    MQError,
    PropertiesTooLargeError,
    ProtocolError,
    RemoteError,
    RequestTimeoutError,
)
from orbitmq.common.ids import default_generator
from orbitmq.common.message import (
    PROPERTY_SHARDING_KEY,
    PROPERTY_UNIQ_KEY,
    Message,
    encode_properties,
)
from orbitmq.common.record import record_overhead
from orbitmq.common.validation import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_PROPERTIES_SIZE,
    validate_topic,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, MAX_HEADER_SIZE, Frame
from orbitmq.protocol.messages import encode_send_body

log = logging.getLogger(__name__)

__all__ = [
    "AsyncProducer",
    "MessageQueueSelector",
    "Producer",
    "ProducerConfig",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "hash_selector",
]


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    """Stored, but not fsynced within the broker's sync-flush timeout."""
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# Broker answers worth another try, possibly elsewhere. Not the "stored but" codes above.
_SEND_RETRY_CODES = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.STORE_IO_ERROR,
        ResponseCode.STORE_CLOSED,
    }
)
# Answers that suggest the cached route is stale.
_REFRESH_ROUTE_CODES = frozenset({ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION})
_SEND_ITEM_OVERHEAD = 6  # u32 body length + u16 properties length in a send body


@dataclass(slots=True)
class SendResult:
    """The outcome of a send. Treat it as read-only. (Not a frozen dataclass on purpose: an
    automatic batch resolves hundreds per frame, and frozen construction costs 5x more.)"""

    status: SendStatus
    msg_id: str
    """The message's unique id (UNIQ_CLIENT_MESSAGE_ID_KEYIDX); for send_batch, all of the
    batch's ids joined with commas, as RocketMQ reports them."""
    message_queue: MessageQueue
    queue_offset: int
    """Offset in the queue's ConsumeQueue (send_batch: of the first message)."""
    offset: int
    """CommitLog offset (send_batch: of the first message). For the second and later messages
    of an automatic batch it is derived from record sizes, unless the broker reports each one;
    it is exact unless the batch crossed a CommitLog segment end."""
    msg_ids: tuple[str, ...] = ()
    """Every id of the send (one for a single message)."""


class MessageQueueSelector(Protocol):
    """Chooses the queue for a message: ``selector(queues, msg, arg) -> queue``.

    ``queues`` are the topic's writable queues, sorted by broker name and queue id, so a
    deterministic selector sends equal keys to the same queue while the route stays the same.
    """

    def __call__(
        self, queues: Sequence[MessageQueue], msg: Message, arg: Any, /
    ) -> MessageQueue: ...


def hash_selector(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Same sharding key -> same queue: CRC32C of the key modulo the number of queues.

    The key is ``arg``, else the message's ``__SHARDINGKEY`` property, else its first key.
    Stable across processes and runs (unlike ``hash()``).
    """
    key: Any = arg
    if key is None:
        key = msg.properties.get(PROPERTY_SHARDING_KEY) or (msg.keys[0] if msg.keys else None)
    if key is None:
        raise ClientError("hash_selector needs an arg, a __SHARDINGKEY property or a key")
    if not queues:
        raise ClientError(f"topic {msg.topic!r} has no writable queue")
    data = bytes(key) if isinstance(key, bytes | bytearray) else str(key).encode()
    return queues[int(crc32c.crc32c(data)) % len(queues)]


SendCallback = Callable[[SendResult | None, BaseException | None], None]
"""``callback(result, error)``: exactly one of the two is None."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    group: str = "DEFAULT_PRODUCER"
    send_timeout_s: float = 3.0
    """Budget of one send, all retries included."""
    retry_times_when_send_failed: int = 2
    compress_over_bytes: int = 4096
    """Bodies larger than this are zstd-compressed (negative: never)."""
    compress_level: int = 3
    linger_ms: float = 5.0
    """How long send_async waits for more messages to fill a batch (0: same loop iteration)."""
    batch_max_bytes: int = 1024 * 1024
    batch_max_messages: int = 512
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    """Largest body sent (after compression); the broker's default limit."""
    max_in_flight_batches: int = 64
    """Automatic batches awaiting an answer at once; beyond it batches queue up (and grow)."""
    namesrv_timeout_s: float = 3.0
    route_refresh_interval_s: float = 30.0
    connect_timeout_s: float = 3.0
    latency_fault_tolerance: bool = True
    """Avoid brokers that failed or answered slowly (see :mod:`orbitmq.client.fault`)."""
    auto_create_fallback: bool = True
    """For a topic no NameServer knows, send to every master with queue id -1 (for brokers with
    auto_create_topic on; others answer TOPIC_NOT_EXIST, which is then not retried)."""

    def __post_init__(self) -> None:
        checks = {
            "send_timeout_s": self.send_timeout_s > 0,
            "retry_times_when_send_failed": self.retry_times_when_send_failed >= 0,
            "linger_ms": self.linger_ms >= 0,
            "batch_max_bytes": 0
            < self.batch_max_bytes
            <= DEFAULT_MAX_FRAME_SIZE - 2 * MAX_HEADER_SIZE,
            "batch_max_messages": self.batch_max_messages >= 1,
            "max_message_size": self.max_message_size >= 1,
            "max_in_flight_batches": self.max_in_flight_batches >= 1,
            "namesrv_timeout_s": self.namesrv_timeout_s > 0,
            "connect_timeout_s": self.connect_timeout_s > 0,
            "compress_level": -7 <= self.compress_level <= 22,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ClientError(f"producer setting out of range: {', '.join(bad)}")


_UNIQ_PREFIX = PROPERTY_UNIQ_KEY.encode() + b"\x01"


@dataclass(slots=True)
class _Item:
    """A message ready for the wire."""

    msg: Message
    body: bytes
    props: bytes
    msg_id: str
    sys_flag: int

    @property
    def size(self) -> int:
        return len(self.body) + len(self.props) + _SEND_ITEM_OVERHEAD


_BatchKey = tuple[str, MessageQueue | None, int, int]  # topic, queue, sys_flag, flag


@dataclass(slots=True)
class _Batch:
    key: _BatchKey
    items: list[_Item] = field(default_factory=list)
    futures: list[asyncio.Future[SendResult]] = field(default_factory=list)
    nbytes: int = 0
    timer: asyncio.TimerHandle | asyncio.Handle | None = None
    flushed: bool = False


_Waiter = tuple[_Item, MessageQueueSelector, Any, asyncio.Future[SendResult]]


class _State(enum.Enum):
    NEW = 0
    RUNNING = 1
    CLOSING = 2
    CLOSED = 3


class AsyncProducer:
    """The asyncio producer. Use it from one event loop: ``start()`` there, then send.

    ``async with AsyncProducer(["127.0.0.1:9876"]) as p: await p.send(Message("T", b"x"))``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        group: str = "DEFAULT_PRODUCER",
        send_timeout_s: float = 3.0,
        retry_times_when_send_failed: int = 2,
        compress_over_bytes: int = 4096,
        compress_level: int = 3,
        linger_ms: float = 5.0,
        batch_max_bytes: int = 1024 * 1024,
        batch_max_messages: int = 512,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_in_flight_batches: int = 64,
        namesrv_timeout_s: float = 3.0,
        route_refresh_interval_s: float = 30.0,
        connect_timeout_s: float = 3.0,
        latency_fault_tolerance: bool = True,
        auto_create_fallback: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.config = ProducerConfig(
            group=group,
            send_timeout_s=send_timeout_s,
            retry_times_when_send_failed=retry_times_when_send_failed,
            compress_over_bytes=compress_over_bytes,
            compress_level=compress_level,
            linger_ms=linger_ms,
            batch_max_bytes=batch_max_bytes,
            batch_max_messages=batch_max_messages,
            max_message_size=max_message_size,
            max_in_flight_batches=max_in_flight_batches,
            namesrv_timeout_s=namesrv_timeout_s,
            route_refresh_interval_s=route_refresh_interval_s,
            connect_timeout_s=connect_timeout_s,
            latency_fault_tolerance=latency_fault_tolerance,
            auto_create_fallback=auto_create_fallback,
        )
        cfg = self.config
        self.remoting = RemotingClient(
            connect_timeout=cfg.connect_timeout_s, ssl_context=ssl_context, name="producer"
        )
        self.routes = TopicRouteCache(
            namesrv_addrs,
            self.remoting,
            timeout_s=cfg.namesrv_timeout_s,
            refresh_interval_s=cfg.route_refresh_interval_s,
            auto_create_fallback=cfg.auto_create_fallback,
        )
        self.fault = FaultStrategy(enabled=cfg.latency_fault_tolerance)
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batches: dict[_BatchKey, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._queue_locks: dict[_BatchKey, asyncio.Lock] = {}
        self._in_flight = asyncio.Semaphore(cfg.max_in_flight_batches)
        self._route_waiters: dict[str, list[_Waiter]] = {}
        self._valid_topics: set[str] = set()
        self._sending = 0
        self.frames_sent = 0
        """Send frames written (tries included); for tests and metrics."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncProducer:
        if self._state is not _State.NEW:
            raise ClientError(f"producer is {self._state.name.lower()}, cannot start")
        self._loop = asyncio.get_running_loop()
        self.routes.start()
        self._state = _State.RUNNING
        return self

    async def close(self) -> None:
        """Send what is batched, wait for every pending send, then disconnect."""
        if self._state in (_State.CLOSING, _State.CLOSED):
            return
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        self._state = _State.CLOSING
        try:
            await self.flush()
        finally:
            await self.routes.close()
            await self.remoting.close()
            self._state = _State.CLOSED

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Send every batch now and wait until all sends so far have their answer."""
        while self._batches or self._tasks:
            for batch in list(self._batches.values()):
                self._flush(batch)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _check_running(self) -> asyncio.AbstractEventLoop:
        if self._state is not _State.RUNNING or self._loop is None:
            state = "not started" if self._state is _State.NEW else "closed"
            raise ClientError(f"producer is {state}")
        return self._loop

    @property
    def pending(self) -> int:
        """Messages handed to send_async and not answered yet."""
        n = sum(len(b.items) for b in self._batches.values())
        return n + sum(len(w) for w in self._route_waiters.values()) + self._sending

    # ------------------------------------------------------------------ preparing messages

    def _prepare(self, msg: Message, *, compress: bool | None = None) -> _Item:
        """Validate, assign the unique id, encode properties and maybe compress.

        Pure and thread-safe: the blocking Producer calls it in the caller's thread, so a bad
        message raises there, and compression runs off the I/O thread.
        """
        topic = msg.topic
        if topic not in self._valid_topics:
            validate_topic(topic)
            if len(self._valid_topics) < 10_000:
                self._valid_topics.add(topic)
        body = msg.body if type(msg.body) is bytes else bytes(msg.body)
        if not body:
            raise EmptyBodyError("a message must carry a body of at least one byte")
        threshold = self.config.compress_over_bytes
        if not (msg.properties or msg.tags or msg.keys or compress) and (
            threshold < 0 or len(body) <= threshold
        ):
            # The common case, kept short: only the unique id to encode.
            if len(body) > self.config.max_message_size:
                raise MessageTooLargeError(
                    f"body is {len(body)} bytes, limit {self.config.max_message_size}"
                )
            new_id = default_generator.next_id()
            return _Item(msg, body, _UNIQ_PREFIX + new_id.encode() + b"\x02", new_id, 0)
        props_map = msg.system_properties()
        msg_id = props_map.get(PROPERTY_UNIQ_KEY)
        if not msg_id:
            msg_id = props_map[PROPERTY_UNIQ_KEY] = default_generator.next_id()
        props = encode_properties(props_map)
        n = len(props_map)
        if props.count(b"\x01") != n or props.count(b"\x02") != n:
            raise MessageIllegalError("property names and values may not contain \\x01 or \\x02")
        if len(props) > DEFAULT_MAX_PROPERTIES_SIZE:
            raise PropertiesTooLargeError(
                f"properties are {len(props)} bytes encoded, limit {DEFAULT_MAX_PROPERTIES_SIZE}"
            )
        item = _Item(msg, body, props, msg_id, 0)
        if compress or (compress is None and 0 <= threshold < len(body)):
            self._compress(item, force=bool(compress))
        if len(item.body) > self.config.max_message_size:
            raise MessageTooLargeError(
                f"body is {len(item.body)} bytes"
                f"{' compressed' if item.sys_flag else ''}, limit {self.config.max_message_size}"
            )
        return item

    def _compress(self, item: _Item, *, force: bool) -> None:
        packed = _codec.compress(item.body, self.config.compress_level)
        if force or len(packed) < len(item.body):
            item.body = packed
            item.sys_flag |= _codec.ZSTD_FLAGS

    # ------------------------------------------------------------------ sending, waiting

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer (retrying retriable failures)."""
        loop = self._check_running()
        item = self._prepare(msg)
        deadline = loop.time() + self.config.send_timeout_s
        queue = await self._choose_fixed_queue(msg, queue, selector, arg, deadline)
        results = await self._send_items(
            msg.topic, [item], item.sys_flag, msg.flag, queue=queue, deadline=deadline
        )
        return results[0]

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (to one queue).

        If any body is over ``compress_over_bytes`` every body of the batch is compressed (the
        compression flag is per frame). ``flag`` is taken from the first message.
        """
        loop = self._check_running()
        if not msgs:
            raise EmptyBodyError("batch holds no message")
        topic = msgs[0].topic
        if any(m.topic != topic for m in msgs):
            raise ClientError("send_batch: all messages must have the same topic")
        check_batch_groups(msgs)
        items = [self._prepare(m, compress=False) for m in msgs]
        threshold = self.config.compress_over_bytes
        if threshold >= 0 and any(len(i.body) > threshold for i in items):
            for item in items:
                self._compress(item, force=True)
                if len(item.body) > self.config.max_message_size:
                    raise MessageTooLargeError(f"body is {len(item.body)} bytes compressed")
        total = sum(i.size for i in items)
        if total > DEFAULT_MAX_FRAME_SIZE - 2 * MAX_HEADER_SIZE:
            raise MessageTooLargeError(f"batch is {total} bytes, too large for one frame")
        deadline = loop.time() + self.config.send_timeout_s
        queue = await self._choose_fixed_queue(msgs[0], queue, selector, arg, deadline)
        results = await self._send_items(
            topic, items, items[0].sys_flag, msgs[0].flag, queue=queue, deadline=deadline
        )
        first = results[0]
        ids = tuple(r.msg_id for r in results)
        return SendResult(
            first.status, ",".join(ids), first.message_queue, first.queue_offset, first.offset, ids
        )

    async def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        """Write the message with the ONEWAY flag and return: no answer, no delivery report.

        Only a failure to connect is retried (on another broker); nothing was written then.
        """
        loop = self._check_running()
        item = self._prepare(msg)
        deadline = loop.time() + self.config.send_timeout_s
        fixed = await self._choose_fixed_queue(msg, queue, selector, arg, deadline)
        body = encode_send_body([item.body], [item.props])
        last_broker: str | None = None
        last_exc: MQError | None = None
        for _ in range(1 + self.config.retry_times_when_send_failed):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            info = await self._route(msg.topic, remaining)
            mq = fixed or self.fault.select_queue(msg.topic, info.write_queues, last_broker)
            addr = self._addr(info, mq)
            frame = self._send_frame(RequestCode.SEND_MESSAGE, mq, item.sys_flag, msg.flag, body)
            try:
                async with asyncio.timeout(remaining):
                    await self.remoting.invoke_oneway(addr, frame)
            except (RemoteError, TimeoutError) as exc:
                self.fault.update(mq.broker_name, 0, failed=True)
                last_exc = _as_mq_error(exc, mq)
                last_broker = mq.broker_name
                continue
            self.frames_sent += 1
            return
        raise last_exc or RequestTimeoutError(f"oneway send to {msg.topic} timed out")

    def send_async(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        callback: SendCallback | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue the message for an automatic batch; the future resolves with its SendResult.

        Call it from the producer's event loop (it is not a coroutine: it never waits). A bad
        message raises here; send failures go to the future (and the callback, which runs on
        the event loop).
        """
        loop = self._check_running()
        item = self._prepare(msg)
        fut: asyncio.Future[SendResult] = loop.create_future()
        if callback is not None:
            fut.add_done_callback(_callback_adapter(callback))
        self._submit(item, queue, selector, arg, fut)
        return fut

    def _submit(
        self,
        item: _Item,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        fut: asyncio.Future[SendResult],
    ) -> None:
        if self._state is not _State.RUNNING:
            fut.set_exception(ClientError("producer is closed"))
            return
        topic = item.msg.topic
        if queue is not None:
            try:
                _check_queue(queue, topic)
            except ClientError as exc:
                fut.set_exception(exc)
                return
        elif selector is not None or (selector := selector_for(item.msg)) is not None:
            info = self.routes.cached(topic)
            waiters = self._route_waiters.get(topic)
            if info is None or waiters is not None:
                if waiters is None:
                    waiters = self._route_waiters[topic] = []
                    self._track(self._resolve_waiters(topic))
                waiters.append((item, selector, arg, fut))
                return
            try:
                queue = _select(info, item.msg, selector, arg)
            except Exception as exc:  # noqa: BLE001 - the selector's error goes to the caller
                fut.set_exception(exc)
                return
        self._enqueue(item, queue, fut)

    async def _resolve_waiters(self, topic: str) -> None:
        try:
            info: TopicPublishInfo | None = await self.routes.get(topic)
            error: BaseException | None = None
        except MQError as exc:
            info, error = None, exc
        waiters = self._route_waiters.pop(topic, [])
        for item, selector, arg, fut in waiters:
            if fut.done():
                continue
            if info is None:
                fut.set_exception(error or ClientError(f"no route for {topic!r}"))
                continue
            try:
                queue = _select(info, item.msg, selector, arg)
            except Exception as exc:  # noqa: BLE001 - the selector's error goes to the caller
                fut.set_exception(exc)
                continue
            self._enqueue(item, queue, fut)

    # ------------------------------------------------------------------ batching

    def _enqueue(
        self, item: _Item, queue: MessageQueue | None, fut: asyncio.Future[SendResult]
    ) -> None:
        cfg = self.config
        key: _BatchKey = (item.msg.topic, queue, item.sys_flag, item.msg.flag)
        batch = self._batches.get(key)
        size = item.size
        if batch is not None and batch.nbytes + size > cfg.batch_max_bytes:
            self._flush(batch)
            batch = None
        if batch is None:
            loop = self._loop
            assert loop is not None
            batch = self._batches[key] = _Batch(key)
            if cfg.linger_ms <= 0:
                batch.timer = loop.call_soon(self._flush, batch)
            else:
                batch.timer = loop.call_later(cfg.linger_ms / 1000.0, self._flush, batch)
        batch.items.append(item)
        batch.futures.append(fut)
        batch.nbytes += size
        if len(batch.items) >= cfg.batch_max_messages or batch.nbytes >= cfg.batch_max_bytes:
            self._flush(batch)

    def _flush(self, batch: _Batch) -> None:
        if self._batches.get(batch.key) is batch:
            del self._batches[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if batch.flushed or not batch.items:
            return
        batch.flushed = True
        self._sending += len(batch.items)
        self._track(self._send_batch(batch))

    def _track(self, coro: Any) -> None:
        assert self._loop is not None
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_batch(self, batch: _Batch) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.send_timeout_s
        topic, queue, sys_flag, flag = batch.key
        try:
            if queue is None:
                async with self._in_flight:
                    results = await self._send_items(
                        topic, batch.items, sys_flag, flag, queue=None, deadline=deadline
                    )
            else:
                # One batch per explicit queue at a time, in order: the broker may process
                # pipelined requests concurrently, which would reorder them.
                lock = self._queue_locks.get(batch.key)
                if lock is None:
                    lock = self._queue_locks[batch.key] = asyncio.Lock()
                async with lock, self._in_flight:
                    results = await self._send_items(
                        topic, batch.items, sys_flag, flag, queue=queue, deadline=deadline
                    )
        except asyncio.CancelledError:
            _fail_all(batch.futures, ClientError("producer closed before the send completed"))
            raise
        except Exception as exc:  # noqa: BLE001 - every error reaches the senders' futures
            _fail_all(batch.futures, exc)
        else:
            for fut, result in zip(batch.futures, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            self._sending -= len(batch.items)

    # ------------------------------------------------------------------ the wire

    async def _route(self, topic: str, remaining: float) -> TopicPublishInfo:
        try:
            async with asyncio.timeout(remaining):
                return await self.routes.get(topic)
        except TimeoutError:
            raise RequestTimeoutError(f"no route for {topic!r} within the send timeout") from None

    async def _choose_fixed_queue(
        self,
        msg: Message,
        queue: MessageQueue | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        deadline: float,
    ) -> MessageQueue | None:
        if queue is not None:
            _check_queue(queue, msg.topic)
            return queue
        if selector is None and (selector := selector_for(msg)) is None:
            return None  # any queue; a message group picks its group's queue
        loop = asyncio.get_running_loop()
        info = await self._route(msg.topic, deadline - loop.time())
        return _select(info, msg, selector, arg)

    def _addr(self, info: TopicPublishInfo, mq: MessageQueue) -> str:
        addr = info.broker_addrs.get(mq.broker_name) or self.routes.master_addr(mq.broker_name)
        if not addr:
            raise ClientError(f"no master address known for broker {mq.broker_name!r}")
        return addr

    @staticmethod
    def _send_frame(code: int, mq: MessageQueue, sys_flag: int, flag: int, body: bytes) -> Frame:
        fields = {
            "topic": mq.topic,
            "queue_id": mq.queue_id,
            "flag": flag,
            "sys_flag": sys_flag,
            "born_ts": time.time_ns() // 1_000_000,
            "reconsume_times": 0,
        }
        return Frame(code, fields=fields, body=body)

    async def _send_items(
        self,
        topic: str,
        items: Sequence[_Item],
        sys_flag: int,
        flag: int,
        *,
        queue: MessageQueue | None,
        deadline: float,
    ) -> list[SendResult]:
        """One send frame, tried up to 1 + retry_times_when_send_failed times before deadline."""
        loop = asyncio.get_running_loop()
        code = RequestCode.SEND_BATCH_MESSAGE if len(items) > 1 else RequestCode.SEND_MESSAGE
        body = encode_send_body([i.body for i in items], [i.props for i in items])
        attempts = 1 + self.config.retry_times_when_send_failed
        last_broker: str | None = None
        last_exc: MQError | None = None
        tries: list[str] = []
        for _ in range(attempts):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            info = await self._route(topic, remaining)
            mq = queue or self.fault.select_queue(topic, info.write_queues, last_broker)
            try:
                addr = self._addr(info, mq)
            except ClientError as exc:
                last_exc, last_broker = exc, mq.broker_name
                tries.append(f"{mq}: {exc}")
                continue
            frame = self._send_frame(code, mq, sys_flag, flag, body)
            started = loop.time()
            try:
                async with asyncio.timeout(remaining):
                    resp = await self.remoting.invoke(addr, frame, remaining)
            except (RemoteError, TimeoutError) as exc:  # transport: connect, lost, timed out
                self.frames_sent += 1
                self.fault.update(mq.broker_name, (loop.time() - started) * 1000, failed=True)
                last_exc, last_broker = _as_mq_error(exc, mq), mq.broker_name
                tries.append(f"{mq} at {addr}: {last_exc}")
                continue
            self.frames_sent += 1
            latency_ms = (loop.time() - started) * 1000
            status = _STATUS_BY_CODE.get(resp.code)  # type: ignore[call-overload]
            if status is not None and "queue_offset" in resp.fields:
                self.fault.update(mq.broker_name, latency_ms)
                return _results(resp, mq, items, status)
            err = RemoteError(resp.code, resp.remark)
            if resp.code in _REFRESH_ROUTE_CODES:
                self.routes.refresh_soon(topic)
            retriable = resp.code in _SEND_RETRY_CODES and not (
                resp.code == ResponseCode.TOPIC_NOT_EXIST and info.auto_create
            )
            self.fault.update(mq.broker_name, latency_ms, failed=retriable)
            if not retriable:
                raise err
            last_exc, last_broker = err, mq.broker_name
            tries.append(f"{mq} at {addr}: {err}")
        if last_exc is None:
            last_exc = RequestTimeoutError(
                f"send to {topic!r} found no time left of its {self.config.send_timeout_s}s budget"
            )
        if len(tries) > 1:
            last_exc.add_note(f"send to {topic!r} failed {len(tries)} times: " + "; ".join(tries))
        raise last_exc


def _results(
    resp: Frame, mq: MessageQueue, items: Sequence[_Item], status: SendStatus
) -> list[SendResult]:
    fields = resp.fields
    try:
        queue_id = int(fields.get("queue_id", mq.queue_id))
        queue_offset = int(fields["queue_offset"])
        offset = int(fields.get("offset", -1))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed send response fields {fields!r}") from exc
    real_mq = mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
    offsets = fields.get("offsets")
    if isinstance(offsets, list) and len(offsets) == len(items):
        offsets = [int(o) for o in offsets]
    else:  # derived from record sizes: records of a batch are stored back to back
        overhead = record_overhead(len(mq.topic.encode()))
        sizes = [overhead + len(item.body) + len(item.props) for item in items]
        offsets = [offset + end - size for end, size in zip(accumulate(sizes), sizes, strict=True)]
    return [
        SendResult(status, item.msg_id, real_mq, q, o, (item.msg_id,))
        for item, q, o in zip(
            items, range(queue_offset, queue_offset + len(items)), offsets, strict=True
        )
    ]


def _as_mq_error(exc: BaseException, mq: MessageQueue) -> MQError:
    if isinstance(exc, MQError):
        return exc
    return RequestTimeoutError(f"send to {mq} timed out")


def _check_queue(queue: MessageQueue, topic: str) -> None:
    if not isinstance(queue, MessageQueue):
        raise ClientError(f"queue must be a MessageQueue, not {type(queue).__name__}")
    if queue.topic != topic:
        raise ClientError(f"queue {queue} is not a queue of topic {topic!r}")


def _select(
    info: TopicPublishInfo, msg: Message, selector: MessageQueueSelector, arg: Any
) -> MessageQueue:
    if not info.write_queues:
        raise ClientError(f"topic {msg.topic!r} has no writable queue")
    mq = selector(info.write_queues, msg, arg)
    _check_queue(mq, msg.topic)
    return mq


def _fail_all(futures: Sequence[asyncio.Future[SendResult]], exc: BaseException) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_exception(exc)


def _callback_adapter(callback: SendCallback) -> Callable[[asyncio.Future[SendResult]], None]:
    def done(fut: asyncio.Future[SendResult]) -> None:
        result: SendResult | None = None
        error: BaseException | None
        if fut.cancelled():
            error = asyncio.CancelledError()
        else:
            error = fut.exception()
            result = None if error is not None else fut.result()
        try:
            callback(result, error)
        except Exception:
            log.exception("send callback %r raised", callback)

    return done


class Producer(BlockingFacade[AsyncProducer]):
    """The blocking producer: an :class:`AsyncProducer` on a private event loop thread.

    Starts on construction (connections are made on first use) and is safe to share between
    threads. ``send_async`` callbacks run on the producer's I/O thread: keep them short and do
    not call blocking producer methods from them. ``max_buffered_bytes`` bounds what send_async
    may hold unanswered; beyond it send_async blocks (up to send_timeout_s, then ClientError).

    ``with Producer("127.0.0.1:9876") as p: p.send(Message("T", b"x"))``
    """

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        **options: Any,
    ) -> None:
        self._async = AsyncProducer(namesrv_addrs, **options)
        self.config = self._async.config
        self.max_buffered_bytes = max_buffered_bytes
        self._buffered = 0
        self._space = threading.Condition()
        self._thread = LoopThread("orbitmq-producer")
        try:
            self._thread.run(self._async.start())
        except BaseException:
            self._thread.stop()
            raise
        self._closed = False

    @property
    def async_producer(self) -> AsyncProducer:
        return self._async

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        return self._thread.run(self._async.send(msg, queue=queue, selector=selector, arg=arg))

    def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        return self._thread.run(
            self._async.send_batch(msgs, queue=queue, selector=selector, arg=arg)
        )

    def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        self._thread.run(self._async.send_oneway(msg, queue=queue, selector=selector, arg=arg))

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Batch the message (see AsyncProducer.send_async); a bad message raises here."""
        if self._closed:
            raise ClientError("producer is closed")
        item = self._async._prepare(msg)
        size = item.size
        self._reserve(size)
        out: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()

        def done(fut: asyncio.Future[SendResult]) -> None:
            self._release(size)
            if fut.cancelled():
                out.set_exception(ClientError("send cancelled"))
            elif (exc := fut.exception()) is not None:
                out.set_exception(exc)
            else:
                out.set_result(fut.result())

        def submit() -> None:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[SendResult] = loop.create_future()
            fut.add_done_callback(done)
            if callback is not None:
                fut.add_done_callback(_callback_adapter(callback))
            self._async._submit(item, queue, selector, arg, fut)

        try:
            self._thread.call_soon(submit)
        except BaseException:
            self._release(size)
            raise
        return out

    def _reserve(self, size: int) -> None:
        # From a callback (the I/O thread) waiting would block the releases: do not wait there.
        timeout = 0.0 if self._thread.in_loop_thread else self.config.send_timeout_s
        with self._space:
            if not self._space.wait_for(
                lambda: self._buffered == 0 or self._buffered + size <= self.max_buffered_bytes,
                timeout=timeout,
            ):
                raise ClientError(
                    f"send_async buffer full ({self._buffered} bytes) for {self.config.send_timeout_s}s"
                )
            self._buffered += size

    def _release(self, size: int) -> None:
        with self._space:
            self._buffered -= size
            self._space.notify_all()

    def flush(self) -> None:
        """Send every batch now and wait for all answers."""
        self._thread.run(self._async.flush())

    def close(self) -> None:
        """Send what is batched, wait for the answers, stop the I/O thread. Idempotent."""
        super().close()
