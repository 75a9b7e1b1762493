"""One framed TCP connection on asyncio, used by both servers and clients.

It turns bytes into frames with the sans-IO decoder, routes responses to the request that is
waiting for them (by opaque), hands requests to a handler, and applies back-pressure both ways:

- at most ``max_in_flight`` requests from the peer are processed at once; beyond that the
  connection stops reading until one finishes;
- at most ``max_pending_bytes`` of request frames are being handled at once (the same pause);
- when the peer reads our responses slower than we write them (the transport's write buffer
  passes its high-water mark), reading stops too, so a slow or hostile peer cannot make us
  buffer without limit.

It records when it last saw traffic and when a frame it has not finished receiving started,
so the server's sweeper can close idle and slow (slowloris) connections; over TLS it records
the peer's verified certificate (``peer_cert``, ``principal``: see
:func:`orbitmq.net.tls.peer_identity`).

Requests whose codes are in ``eager_codes`` start without a task: their handler runs at once,
in ``data_received``, up to its first wait (a send up to the queued append, a pull up to its
answer or its long poll), and is resumed from the done callback of the future it waits on
(:meth:`Connection._step`), the way a Task steps a coroutine but without the Task, its first
scheduled step and its done callback (three loop handles per request on the broker's hot path).
Such a handler must not need ``asyncio.current_task()`` (no ``asyncio.timeout``), nor
cancellation; anything else (every other code, every other server) runs as a task, as before.
Order and back-pressure are the same either way: requests start in arrival order (an eager
request behind a task that has not started yet runs in a task too) and count against
``max_in_flight`` until their handler returns.

A frame that cannot be decoded closes the connection, with the reason logged. A ``signer``
(orbitmq.protocol.signature.Signer) adds the sender's AccessKey and Signature to every request
this side sends, oneway ones included, never to a response.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import Any

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, ProtocolError, RemoteError, RequestTimeoutError
from orbitmq.common.tasks import TaskSet
from orbitmq.net.limits import REASON_PENDING, REASON_PROTOCOL, REASON_THROTTLED, Refusals
from orbitmq.net.quota import ByteQuotas
from orbitmq.net.tls import peer_identity
from orbitmq.protocol.frame import (
    FLAG_ONEWAY,
    VERSION,
    Buffer,
    Frame,
    FrameDecoder,
    encode,
)

log = logging.getLogger(__name__)

Reply = Frame | tuple[Frame, Sequence[Buffer]] | None
"""What a handler returns: a response, a response plus body buffers (zero-copy), or None."""
Handler = Callable[[Frame, "Connection"], Awaitable[Reply]]


class ConnectionClosedError(RemoteError):
    """The connection closed before the answer came. Retriable: another connection (or
    broker) may answer; whether the request was handled is unknown."""

    retriable = True

    def __init__(self, remark: str = "connection closed") -> None:
        super().__init__(ResponseCode.SYSTEM_ERROR, remark)


class Connection(asyncio.Protocol):
    def __init__(
        self,
        handler: Handler | None = None,
        *,
        max_frame_size: int,
        max_in_flight: int = 256,
        max_pending_bytes: int = 64 * 1024 * 1024,
        on_close: Callable[[Connection], None] | None = None,
        name: str = "conn",
        signer: Callable[[Frame], None] | None = None,
        refusals: Refusals | None = None,
        quotas: ByteQuotas | None = None,
        admit: Callable[[Connection, str], bool] | None = None,
        eager_codes: frozenset[int] = frozenset(),
    ) -> None:
        self.handler = handler
        self.eager_codes = eager_codes
        """Request codes whose handler starts in ``data_received``, without a task (module
        docstring)."""
        self.signer = signer
        self.decoder = FrameDecoder(max_frame_size)
        self.max_in_flight = max_in_flight
        self.max_pending_bytes = max_pending_bytes
        self.refusals = refusals
        self.quotas = quotas
        self.admit = admit
        """Called with the peer's address when the connection is made; False aborts it (a
        listener's admission caps when it did not run them before the connection)."""
        self._muted_until = 0.0
        self.on_close = on_close
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.closed = asyncio.Event()
        self.close_reason = ""
        self.attributes: dict[str, Any] = {}
        self._opaque = itertools.count(1)
        self._in_flight = 0
        self._in_flight_bytes = 0
        self.last_activity = time.monotonic()
        self.reads = 0
        """How many times bytes came in: a client tells a dead connection (a partition, a hung
        peer) from a slow answer by whether anything arrived while it waited."""
        self.frame_started = 0.0
        """monotonic time the first bytes of a still incomplete frame came (0: none)."""
        self.tls = False
        self.peer_cert: dict[str, Any] | None = None
        self.principal: str | None = None
        """The verified client certificate's identity (mutual TLS), else None."""
        self._backlog: collections.deque[Frame] = collections.deque()
        self._pumping = False
        self._unstarted = 0
        """Requests handed to a task whose first step has not run yet: an eager request after
        them must not overtake them."""
        self._tasks = TaskSet("request handlers", logger=log)
        self._write_paused = False
        self._read_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._tls_out: list[Buffer] = []
        """TLS only: what this loop pass wrote, sent as one write at its end (_flush_tls)."""

    # --------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport's interface without subclassing it.
        self.transport = typing.cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.tls = True
            self.peer_cert = ssl_object.getpeercert() or None
            self.principal = peer_identity(self.peer_cert)
        self.last_activity = time.monotonic()
        if self.admit is not None and not self.admit(
            self, peer[0] if isinstance(peer, tuple) else ""
        ):
            self.close_reason = "refused at accept"
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        now = self.last_activity = time.monotonic()
        self.reads += 1
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as exc:
            if self.refusals is not None:
                self.refusals.counts[REASON_PROTOCOL] += 1
            self.abort(f"protocol error from {self.peer}: {exc}")
            return
        if self.decoder.buffered:
            if not self.frame_started or frames:
                self.frame_started = now
        else:
            self.frame_started = 0.0
        for frame in frames:
            if frame.is_response:
                fut = self.pending.pop(frame.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(frame)
                continue
            if self._busy() or self._backlog:
                # Decoded together with frames already being handled: wait for a free slot
                # (reading is paused meanwhile, so this holds at most one read's worth).
                self._backlog.append(frame)
                self._update_reading()
                continue
            self._start_request(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.close_reason:
            self.close_reason = f"closed by peer{f': {exc}' if exc else ''}"
        err = ConnectionClosedError(f"connection to {self.peer} lost: {self.close_reason}")
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.closed.set()
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        self._update_reading()

    # --------------------------------------------------------------- requests in

    def _start_request(self, frame: Frame) -> None:
        if self.handler is None:
            self._send(frame.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "no handler here"))
            return
        if frame.version > VERSION:
            self._send(
                frame.reply(
                    ResponseCode.VERSION_NOT_SUPPORTED,
                    f"frame version {frame.version}, this server speaks {VERSION}",
                )
            )
            return
        self._in_flight += 1
        self._in_flight_bytes += len(frame.body)
        self._update_reading()
        if frame.code in self.eager_codes and not self._unstarted:
            self._step(self._run(frame))
        else:  # behind a task not yet started, an eager request waits its turn in one too
            self._unstarted += 1
            self._tasks.spawn(self._run(frame, tasked=True))

    def _step(self, coro: Coroutine[Any, Any, None], _done: object = None) -> None:
        """Run an eager request's coroutine up to its next wait, here and now; the future it
        waits on resumes it (asyncio's Task protocol: a blocking future is yielded, a bare
        ``yield`` asks for one loop turn). A failure is logged and counted like a task's."""
        try:
            waited = coro.send(None)
        except StopIteration:
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # _run answers handler errors: this is its own failure
            self._tasks.failures += 1
            log.error("%s: request handler failed", self.name, exc_info=exc)
            return
        if getattr(waited, "_asyncio_future_blocking", False):
            fut = typing.cast(asyncio.Future[Any], waited)
            fut._asyncio_future_blocking = False
            fut.add_done_callback(partial(self._step, coro))
        elif waited is None:
            asyncio.get_running_loop().call_soon(self._step, coro)
        else:
            self._tasks.failures += 1
            log.error("%s: request handler yielded %r, not a future", self.name, waited)
            coro.close()

    def _pump(self) -> None:
        """Start what waited in the backlog while there is room; not re-entered (an eager
        request that finishes at once would otherwise start the next from inside itself)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while self._backlog and not self._busy() and not self._muted_until:
                self._start_request(self._backlog.popleft())
        finally:
            self._pumping = False

    def _busy(self) -> bool:
        busy = (
            self._in_flight >= self.max_in_flight or self._in_flight_bytes >= self.max_pending_bytes
        )
        if busy and self.refusals is not None and not self._read_paused:
            self.refusals.counts[REASON_PENDING] += 1
        return busy

    async def _run(self, frame: Frame, tasked: bool = False) -> None:
        assert self.handler is not None
        if tasked:
            self._unstarted -= 1
        try:
            try:
                reply = await self.handler(frame, self)
            except MQError as exc:
                reply = frame.reply(exc.code, str(exc))
            except Exception as exc:
                log.exception("%s: request code %d failed", self.name, frame.code)
                reply = frame.reply(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
            if self.quotas is not None:
                await self._throttle(frame, reply)
        finally:
            self._in_flight -= 1
            self._in_flight_bytes -= len(frame.body)
            self.last_activity = time.monotonic()
            if self._backlog:
                self._pump()
            self._update_reading()
        if reply is None or frame.flags & FLAG_ONEWAY:
            return
        if isinstance(reply, tuple):
            self._send(reply[0], reply[1])
        else:
            self._send(reply)

    async def _throttle(self, frame: Frame, reply: Reply) -> None:
        """Kafka's quota enforcement: over its byte rate, the client's response waits, with
        ``throttle_time_ms`` set, and nothing more is read from it meanwhile."""
        assert self.quotas is not None
        head = reply[0] if isinstance(reply, tuple) else reply
        if reply is None:
            out = 0
        elif isinstance(reply, tuple):
            out = sum(len(p) for p in reply[1])
        else:
            out = len(reply.body)
        key = self.attributes.get("principal") or self.principal or self.attributes.get("ip")
        delay = self.quotas.charge(frame.code, len(frame.body), out, str(key or self.peer))
        if delay <= 0:
            return
        if head is not None:
            head.fields["throttle_time_ms"] = int(delay * 1000)
        if self.refusals is not None:
            self.refusals.counts[REASON_THROTTLED] += 1
        self._muted_until = time.monotonic() + delay
        self._update_reading()
        try:
            await asyncio.sleep(delay)
        finally:
            self._muted_until = 0.0
            self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        should_pause = (
            self._write_paused or self._busy() or bool(self._backlog) or bool(self._muted_until)
        )
        if should_pause and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # --------------------------------------------------------------- frames out

    def _send(self, frame: Frame, body_parts: Sequence[Buffer] | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.last_activity = time.monotonic()
        parts = encode(frame, body_parts)
        if not self.tls:
            self.transport.writelines(parts)  # plaintext: one writev, the parts not copied
            return
        # TLS: the SSL transport encrypts every buffer it is given into its own records (a pull
        # answer of 64 messages made 65 records of about 1 KiB, each a separate encrypt call),
        # so what this loop pass writes (every part, every frame) goes out as one write: full
        # 16 KiB records, one pass through the SSL layer. close() flushes first.
        if not self._tls_out:
            asyncio.get_running_loop().call_soon(self._flush_tls)
        self._tls_out.extend(parts)

    def _flush_tls(self) -> None:
        parts, self._tls_out = self._tls_out, []
        if parts and self.transport is not None and not self.transport.is_closing():
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def send_response(self, frame: Frame, body_parts: Sequence[Buffer] | None = None) -> None:
        """Answer a request now, outside its handler (a held pull answered on arrival); the
        handler then returns None so that nothing is sent twice."""
        self._send(frame, body_parts)

    async def request(self, frame: Frame, timeout: float) -> Frame:
        """Send a request and wait for its response (RequestTimeoutError after ``timeout``)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        opaque = frame.opaque = next(self._opaque) & 0xFFFFFFFF
        if self.signer is not None:
            self.signer(frame)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Frame] = loop.create_future()
        self.pending[opaque] = fut
        try:
            self._send(frame)
        except BaseException:
            self.pending.pop(opaque, None)
            raise
        # One timer handle that fails the future, rather than an asyncio.timeout() context
        # (which creates and reschedules its own handle and cancels the task): this is on the
        # path of every pull and send.
        timer = loop.call_later(timeout, self._expire, fut, frame.code, timeout)
        try:
            return await fut
        finally:
            timer.cancel()
            self.pending.pop(opaque, None)

    def _expire(self, fut: asyncio.Future[Frame], code: int, timeout: float) -> None:
        if not fut.done():
            fut.set_exception(
                RequestTimeoutError(
                    f"no answer from {self.peer} to code {code} within {timeout:.3f}s"
                )
            )

    def send_oneway(self, frame: Frame) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        frame.opaque = next(self._opaque) & 0xFFFFFFFF
        frame.flags |= FLAG_ONEWAY
        if self.signer is not None:
            self.signer(frame)
        self._send(frame)

    async def drain(self) -> None:
        """Wait while the peer is not reading what we wrote."""
        if not self._write_paused or self.transport is None:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        await fut

    # --------------------------------------------------------------- closing

    @property
    def is_idle(self) -> bool:
        """Nothing being handled, awaited or partly received."""
        return not (self._in_flight or self.pending or self._backlog or self.frame_started)

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def abort(self, reason: str, *, level: int = logging.WARNING) -> None:
        """Close at once (after a protocol error); the reason is logged."""
        log.log(level, "%s: closing connection to %s: %s", self.name, self.peer, reason)
        self.close_reason = reason
        if self.transport is not None:
            self.transport.abort()

    def close(self, reason: str = "closed locally") -> None:
        self.close_reason = self.close_reason or reason
        if self.transport is not None:
            self._flush_tls()  # what was written before close() goes first
            self.transport.close()
