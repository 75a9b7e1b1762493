"""One send frame to a broker, retried: the loop every send mode goes through.

:meth:`Sender.send` picks a queue (the fixed one, or one the fault strategy likes, avoiding the
broker that just failed), writes SEND_MESSAGE or SEND_BATCH_MESSAGE, and reads the answer. A
retriable failure (connection lost, or an answer whose error class is ``retriable``:
SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, TOPIC_NOT_EXIST, ...; not NO_PERMISSION) is tried again,
up to ``retry_times_when_send_failed`` more times, within one deadline for all tries.
For the automatic batches of ``send_async`` (``busy_waits=True``), SYSTEM_BUSY is the broker's
back-pressure, not a failure: the sender pauses (``busy_backoff_ms``, doubling up to
``busy_backoff_max_ms``, jittered) and sends again without using up a retry, until the
deadline; batches waiting so hold their in-flight slots, which is what slows ``send_async``
callers (the blocking Producer then blocks on ``max_buffered_bytes``). Likewise a batch whose
answer is late while the broker keeps answering the producer's other batches (its pipeline of
``max_in_flight_batches`` is deeper than a loaded broker works through in ``send_timeout_s``)
waits for that answer up to ``busy_timeout_s`` instead of failing (or being sent twice); a
connection with nothing read for the try's timeout still fails the try. A caller of ``send`` or
``send_batch`` waits for its own answer, so there SYSTEM_BUSY is a retriable failure as
RocketMQ's clients treat it: tried again at once, within the retry budget. ``oneway=True`` writes the frame with the ONEWAY flag and reads no
answer: only a failure to write is retried (nothing was written then).

Answers that mean "stored, but not as safely as asked" (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
SLAVE_NOT_AVAILABLE) become a SendResult with that status when the broker reports where the
message went, and are never retried (a retry would store the message twice).

A failure that says the group lost its master (:func:`orbitmq.client.route.master_gone`: refused
or lost connection, timeout, NO_PERMISSION from a slave or deposed master) or a route naming no
master follows the group (docs/ha.md): when the send must stay on that group (a fixed queue:
explicit, by selector or message group) or the topic has no other group, it re-reads the route
(at most every 200 ms) and tries the group's master again, new or restarted, until the deadline;
those tries do not count against ``retry_times_when_send_failed``. Otherwise it moves to another
group as any retriable failure does. SERVICE_NOT_AVAILABLE (a new master whose SyncStateSet is
still below ``min_in_sync_replicas``) is waited out the same way when the send cannot move.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Sequence
from itertools import accumulate

from orbitmq.client.fault import FaultStrategy
from orbitmq.client.producer.config import ProducerConfig
from orbitmq.client.producer.prepare import PreparedMessage
from orbitmq.client.producer.types import STATUS_BY_CODE, SendResult, SendStatus
from orbitmq.client.route import MessageQueue, TopicPublishInfo, TopicRouteCache, master_gone
from orbitmq.common.clock import now_ms
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    ProtocolError,
    RemoteError,
    RequestTimeoutError,
    SystemBusyError,
    TopicNotExistError,
    error_for,
)
from orbitmq.common.message import (
    PROPERTY_PRODUCER_COUNT,
    PROPERTY_PRODUCER_ID,
    PROPERTY_PRODUCER_SEQ,
)
from orbitmq.common.record import record_overhead
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.messages import encode_send_body
from orbitmq.protocol.requests import SendBatchMessageRequest, SendMessageRequest

__all__ = ["Sender", "check_queue"]

_MAX_FOLLOWS = 200
"""Tries at a group's (new) master within one send: the deadline bounds them first."""


class Sender:
    """Sends prepared messages as one frame, with retries; counts the frames written."""

    def __init__(
        self,
        config: ProducerConfig,
        remoting: RemotingClient,
        routes: TopicRouteCache,
        fault: FaultStrategy,
    ) -> None:
        self.config = config
        self.remoting = remoting
        self.routes = routes
        self.fault = fault
        self.frames_sent = 0
        """Send frames written (tries included); for tests and metrics."""
        self.producer_id = secrets.randbits(63) if config.idempotent else -1
        """Idempotent producers: a random id, unique with overwhelming probability."""
        self._sequences: dict[MessageQueue, int] = {}

    def _stamp(self, mq: MessageQueue, items: Sequence[PreparedMessage]) -> bytes:
        """The send body with the producer id and the next sequences of ``mq`` on the first
        message; the sequences are used up even if the send fails (the broker allows gaps)."""
        seq = self._sequences.get(mq, 0)
        self._sequences[mq] = seq + len(items)
        first = items[0].props
        if first and not first.endswith(b"\x02"):
            first += b"\x02"
        first += (
            f"{PROPERTY_PRODUCER_ID}\x01{self.producer_id}\x02{PROPERTY_PRODUCER_SEQ}\x01{seq}"
            f"\x02{PROPERTY_PRODUCER_COUNT}\x01{len(items)}\x02"
        ).encode()
        return encode_send_body([i.body for i in items], [first, *(i.props for i in items[1:])])

    def _busy_pause(self, busy: int) -> float:
        """Seconds to wait after the ``busy``-th SYSTEM_BUSY answer in a row: doubling from
        busy_backoff_ms up to busy_backoff_max_ms, jittered so batches do not come back in step."""
        cfg = self.config
        pause = min(cfg.busy_backoff_ms * (1 << min(busy - 1, 16)), cfg.busy_backoff_max_ms)
        return pause * random.uniform(0.5, 1.0) / 1000.0

    async def route(self, topic: str, remaining: float) -> TopicPublishInfo:
        """The topic's route, or RequestTimeoutError when it takes longer than ``remaining``."""
        try:
            async with asyncio.timeout(remaining):
                return await self.routes.get(topic)
        except TimeoutError:
            raise RequestTimeoutError(f"no route for {topic!r} within the send timeout") from None

    def _addr(self, info: TopicPublishInfo, mq: MessageQueue) -> str:
        # The freshest route naming the group first: another topic's re-read may have seen
        # its new master (or that it has none) after this topic's route was read.
        addr = self.routes.master_addr(mq.broker_name)
        if addr is None and not self.routes.masterless(mq.broker_name):
            addr = info.broker_addrs.get(mq.broker_name)
        if not addr:
            raise ClientError(f"no master address known for broker {mq.broker_name!r}")
        return addr

    @staticmethod
    def _frame(
        kind: type[SendMessageRequest], mq: MessageQueue, sys_flag: int, flag: int, body: bytes
    ) -> Frame:
        header = kind(
            topic=mq.topic, queue_id=mq.queue_id, flag=flag, sys_flag=sys_flag, born_ts=now_ms()
        )
        return header.frame(body)

    async def send(
        self,
        topic: str,
        items: Sequence[PreparedMessage],
        sys_flag: int,
        flag: int,
        *,
        queue: MessageQueue | None,
        deadline: float,
        oneway: bool = False,
        busy_waits: bool = False,
        packed: tuple[bytes, int] | None = None,
    ) -> list[SendResult]:
        """One send frame, tried up to 1 + retry_times_when_send_failed times before
        ``deadline`` (loop time); one SendResult per item ([] when ``oneway``).
        ``busy_waits``: SYSTEM_BUSY answers pause and resend without using up a try, and
        give the send its ``send_timeout_s`` again after the pause, up to ``busy_timeout_s``
        from now (a busy broker answers: it is loaded, not gone).
        ``packed``: (a send body already encoded, its message count) instead of ``items``;
        one SendResult for the whole send then (its first offsets, no message ids)."""
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + self.config.busy_timeout_s
        if packed is not None:
            body, count = packed
        else:
            body = encode_send_body([i.body for i in items], [i.props for i in items])
            count = len(items)
        kind = SendBatchMessageRequest if count > 1 else SendMessageRequest
        attempts = 1 + self.config.retry_times_when_send_failed
        last_broker: str | None = None
        last_exc: MQError | None = None
        tries: list[str] = []
        busy = 0
        follows = 0
        stamped = not self.config.idempotent or oneway or packed is not None
        while attempts > 0 and follows < _MAX_FOLLOWS:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            info = await self.route(topic, remaining)
            mq = None
            try:
                mq = queue or self.fault.select_queue(topic, info.write_queues, last_broker)
                addr = self._addr(info, mq)
            except ClientError as exc:  # no master for the queue's group, or no group at all
                last_exc = exc
                tries.append(f"{mq or topic}: {exc}")
                failed = mq.broker_name if mq is not None else None
                if await self._follow(topic, info, queue, failed, deadline):
                    follows += 1
                    continue
                if mq is not None:  # another topic's route saw the group lose its master
                    last_broker = mq.broker_name
                    self.routes.refresh_soon(topic)
                attempts -= 1
                continue
            if not stamped:
                # Idempotent: numbered once for this queue, and every retry goes there too
                # (the broker recognises a replay per queue).
                body, queue, stamped = self._stamp(mq, items), mq, True
            frame = self._frame(kind, mq, sys_flag, flag, body)
            started = loop.time()
            wait = min(remaining, self.config.try_timeout_s or remaining)
            try:
                if busy_waits and not oneway:
                    # A broker that keeps answering the producer's other batches is behind,
                    # not gone: this batch waits for its own answer (sending it again would
                    # store it twice) up to busy_timeout_s, as a SYSTEM_BUSY answer would.
                    # ``wait`` with nothing read still fails the try as before.
                    async with asyncio.timeout(max(wait, busy_until - loop.time())):
                        resp = await self.remoting.invoke(addr, frame, wait, alive_until=busy_until)
                else:
                    async with asyncio.timeout(wait):
                        if oneway:
                            await self.remoting.invoke_oneway(addr, frame)
                        else:
                            resp = await self.remoting.invoke(addr, frame, wait)
            except (RemoteError, TimeoutError) as exc:  # transport: connect, lost, timed out
                self.frames_sent += 1
                self.fault.update(mq.broker_name, (loop.time() - started) * 1000, failed=True)
                last_exc, last_broker = _as_mq_error(exc, mq), mq.broker_name
                tries.append(f"{mq} at {addr}: {last_exc}")
                silent = isinstance(exc, TimeoutError | RequestTimeoutError)
                if master_gone(exc) and await self._follow(
                    topic, info, queue, mq.broker_name, deadline, addr if silent else None
                ):
                    follows += 1
                    continue
                self.routes.master_failed(addr, exc)
                attempts -= 1
                continue
            self.frames_sent += 1
            if oneway:
                return []
            latency_ms = (loop.time() - started) * 1000
            status = STATUS_BY_CODE.get(resp.code)
            if status is not None and "queue_offset" in resp.fields:
                self.fault.update(mq.broker_name, latency_ms)
                if packed is not None:
                    return [_packed_result(resp, mq, status)]
                return _results(resp, mq, items, status)
            # What to do is the answer's class policy (orbitmq.common.errors): retried when
            # retriable, the route refreshed when refresh_route. A stored answer (message
            # stored, less safely than asked) without its offsets is raised, never resent.
            err = error_for(resp.code, resp.remark)
            if master_gone(err):  # a slave or a deposed master: follow the group's master
                self.fault.update(mq.broker_name, latency_ms, failed=True)
                last_exc, last_broker = err, mq.broker_name
                tries.append(f"{mq} at {addr}: {err}")
                if await self._follow(topic, info, queue, mq.broker_name, deadline):
                    follows += 1
                    continue
                self.routes.master_failed(addr, err)
                attempts -= 1
                continue
            if err.refresh_route:
                self.routes.refresh_soon(topic)
            retriable = err.retriable and not (
                isinstance(err, TopicNotExistError) and info.auto_create
            )
            self.fault.update(mq.broker_name, latency_ms, failed=retriable)
            if not retriable:
                raise err
            last_exc, last_broker = err, mq.broker_name
            if busy_waits and isinstance(err, SystemBusyError):
                # Back-pressure, not a failure: pause, then try again (on another broker if
                # the fault strategy has one), without using up a retry; the deadline bounds it.
                busy += 1
                pause = self._busy_pause(busy)
                deadline = max(
                    deadline, min(busy_until, loop.time() + pause + self.config.send_timeout_s)
                )
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
                continue
            tries.append(f"{mq} at {addr}: {err}")
            # A new master refuses sends until a slave rejoins its SyncStateSet ("in-sync
            # replicas not enough"): a send that cannot move waits for that too.
            if resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and await self._follow(
                topic, info, queue, mq.broker_name, deadline
            ):
                follows += 1
                continue
            attempts -= 1
        if busy:
            tries.append(f"{busy} SYSTEM_BUSY answer(s), the last from {last_broker}")
        if last_exc is None:
            last_exc = RequestTimeoutError(
                f"send to {topic!r} found no time left of its {self.config.send_timeout_s}s budget"
            )
        if len(tries) > 1:
            last = "; ".join(tries[-5:])  # a send following a master may try many times
            last_exc.add_note(f"send to {topic!r} failed {len(tries)} times; the last: {last}")
        raise last_exc

    async def _follow(
        self,
        topic: str,
        info: TopicPublishInfo,
        fixed: MessageQueue | None,
        failed: str | None,
        deadline: float,
        silent: str | None = None,
    ) -> bool:
        """After the master of group ``failed`` failed (or a group had none): whether to try
        that group again after re-reading the route (at most every 200 ms), without counting a
        retry. Yes for a send that must stay on its group (``fixed`` queue) and for one with
        no other group to go to; no when another group has writable queues, or no time is
        left.

        ``silent``: the master address that just let a try time out (a partition, a hung
        process). While the route still names it (the NameServers keep a partitioned master
        until its successor registers), the route is re-read again, up to ``try_timeout_s``,
        before that address is tried again: another try there would most likely cost a whole
        ``try_timeout_s`` more (partition failovers took 2 try timeouts instead of 1)."""
        if fixed is None and any(q.broker_name != failed for q in info.write_queues):
            return False
        loop = asyncio.get_running_loop()
        if await self.routes.reread(topic, deadline - loop.time()) is None:
            return False
        if silent is None or failed is None:
            return True
        until = min(deadline, loop.time() + (self.config.try_timeout_s or 0.0))
        while self.routes.master_addr(failed) == silent and loop.time() < until:
            if await self.routes.reread(topic, until - loop.time()) is None:
                break
        return deadline > loop.time()


def _results(
    resp: Frame, mq: MessageQueue, items: Sequence[PreparedMessage], status: SendStatus
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


def _packed_result(resp: Frame, mq: MessageQueue, status: SendStatus) -> SendResult:
    fields = resp.fields
    try:
        queue_id = int(fields.get("queue_id", mq.queue_id))
        queue_offset = int(fields["queue_offset"])
        offset = int(fields.get("offset", -1))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed send response fields {fields!r}") from exc
    real_mq = mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
    return SendResult(status, "", real_mq, queue_offset, offset, ())


def _as_mq_error(exc: BaseException, mq: MessageQueue) -> MQError:
    if isinstance(exc, MQError):
        return exc
    return RequestTimeoutError(f"send to {mq} timed out")


def check_queue(queue: MessageQueue, topic: str) -> None:
    """ClientError unless ``queue`` is a MessageQueue of ``topic``."""
    if not isinstance(queue, MessageQueue):
        raise ClientError(f"queue must be a MessageQueue, not {type(queue).__name__}")
    if queue.topic != topic:
        raise ClientError(f"queue {queue} is not a queue of topic {topic!r}")
