"""The heartbeat every consumer sends: who this client is and what its groups subscribe to.

A broker only knows a consumer through its heartbeats. HEART_BEAT (body
:class:`~orbitmq.protocol.consumer.HeartbeatData`) registers or refreshes the client's groups on
the connection it arrives on, and compiles every subscription, so the first beat is also where a
bad filter expression is found out. One :class:`HeartbeatService` serves any number of consumers
of one client id: each registers a *provider*, a function returning its current
:class:`~orbitmq.protocol.consumer.ConsumerData`, and every beat asks each provider afresh (so a
new subscription is sent with the next beat without telling the service).

A beat goes to the master of every broker that serves a read queue of any subscribed topic (the
retry topics live on the same brokers as the topics, so they need nothing extra), concurrently;
an error from one broker does not hold up the others. ``beat_now()`` raises what a broker
*answered* with when the answer is not one a later retry could change (SUBSCRIPTION_PARSE_FAILED
above all, as :class:`InvalidSubscriptionError`): a consumer calls it from ``start()``/``subscribe``
so the user sees a bad subscription at once. Unreachable brokers, timeouts and busy answers are
only logged: the periodic beat retries them every ``interval_s``, and a consumer that can reach
some brokers should run. The periodic beat logs everything and never stops.

``close()`` sends UNREGISTER_CLIENT (fields ``client_id``, ``group``) for every group it beat to
every broker it beat, best effort and within ``timeout_s`` in total, so the brokers rebalance at
once instead of waiting for the heartbeat to expire.

Not thread-safe: one service belongs to one event loop (the one its consumer runs on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from orbitmq import __version__
from orbitmq.client.route import TopicRouteCache, TopicRouteNotFoundError
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    RemoteError,
    error_for,
    remote_class,
)
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import encode_body
from orbitmq.protocol.consumer import ConsumerData, HeartbeatData
from orbitmq.protocol.requests import HeartbeatRequest, UnregisterClientRequest

log = logging.getLogger(__name__)

__all__ = ["ConsumerDataProvider", "HeartbeatService", "InvalidSubscriptionError"]

ConsumerDataProvider = Callable[[], ConsumerData]
"""Returns a consumer's current group settings and subscriptions; called on every beat."""


InvalidSubscriptionError = remote_class(ResponseCode.SUBSCRIPTION_PARSE_FAILED)
"""A broker refused a subscription expression (SUBSCRIPTION_PARSE_FAILED): what
``error_for`` makes of that answer, both a :class:`RemoteError` (``code``, ``remark`` say what
the broker answered) and a :class:`FilterExpressionError`, so it is caught as either."""


class HeartbeatService:
    """Beats every ``interval_s`` once :meth:`start` ran, and on :meth:`beat_now`.

    ``timeout_s`` bounds each HEART_BEAT request, and :meth:`close`'s unregistering as a whole.
    """

    def __init__(
        self,
        routes: TopicRouteCache,
        remoting: RemotingClient,
        client_id: str,
        *,
        interval_s: float = 10.0,
        timeout_s: float = 3.0,
        language: str = "PYTHON",
        version: str = __version__,
    ) -> None:
        """``language`` and ``version`` are what the brokers show of the client: the proxy beats
        for RocketMQ 5 clients of any language with their own."""
        if interval_s <= 0:
            raise ClientError(f"heartbeat interval must be positive, not {interval_s}")
        self.routes = routes
        self.remoting = remoting
        self.client_id = client_id
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.language = language
        self.version = version
        self._providers: list[ConsumerDataProvider] = []
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._beaten: set[str] = set()
        self._groups: set[str] = set()
        self._closed = False
        self.beats = 0
        """HEART_BEAT requests that got a SUCCESS answer (for tests and metrics)."""

    # ------------------------------------------------------------------ providers

    def add(self, provider: ConsumerDataProvider) -> None:
        """Include ``provider``'s ConsumerData in every beat from now on (the next periodic beat,
        or call :meth:`beat_now` to register at once)."""
        if provider not in self._providers:
            self._providers.append(provider)

    def remove(self, provider: ConsumerDataProvider) -> None:
        """Stop beating for ``provider``. Its group stays registered until the broker expires it
        or :meth:`unregister` / :meth:`close` tells the brokers."""
        if provider in self._providers:
            self._providers.remove(provider)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def brokers(self) -> frozenset[str]:
        """Addresses of the brokers beaten so far (what :meth:`close` unregisters from)."""
        return frozenset(self._beaten)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the periodic beat (from the event loop). The first periodic beat comes after
        ``interval_s``: call :meth:`beat_now` for one at once."""
        if self._closed:
            raise ClientError("heartbeat service is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"orbitmq-heartbeat-{self.client_id}"
            )

    async def close(self) -> None:
        """Stop beating and unregister from every broker beaten (best effort, bounded by
        ``timeout_s``). Idempotent; does not close the RemotingClient (its owner does)."""
        if self._closed:
            return
        self._closed = True
        # A beat under way finishes first (its answer received): cancelled after its request
        # went out, it could reach a broker after UNREGISTER_CLIENT and register us again.
        async with self._lock:
            task, self._task = self._task, None
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            groups = sorted(self._groups | {c.group for c in self._consumers(quiet=True)})
            await self._unregister(sorted(self._beaten), groups)
            self._providers.clear()

    async def unregister(self, group: str) -> None:
        """Tell every broker beaten that ``group`` of this client left (a consumer that closes
        while others keep the service). Best effort, bounded by ``timeout_s``."""
        self._groups.discard(group)
        await self._unregister(sorted(self._beaten), [group])

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self._closed:
                return
            try:
                await self.beat_now()
            except MQError as exc:
                log.warning("heartbeat of %s: %s", self.client_id, exc)
            except Exception:  # a provider's bug must not end the heartbeat
                log.exception("heartbeat of %s failed", self.client_id)

    # ------------------------------------------------------------------ beating

    async def beat_now(self) -> None:
        """One HEART_BEAT to the master of every broker serving a subscribed topic, now.

        Raises the first broker refusal that retrying cannot change (InvalidSubscriptionError
        for a bad subscription), after every broker was tried. Transport failures, timeouts,
        busy answers and topics without a route are logged, not raised.
        """
        if self._closed:
            raise ClientError("heartbeat service is closed")
        async with self._lock:
            if self.closed:  # closed while this beat waited: it would register us again
                return
            consumers = self._consumers(quiet=False)
            if not consumers:
                return
            addrs = await self._broker_addrs(consumers)
            if not addrs:
                log.warning(
                    "heartbeat of %s: no broker serves any subscribed topic yet", self.client_id
                )
                return
            body = encode_body(
                HeartbeatData(
                    client_id=self.client_id,
                    language=self.language,
                    version=self.version,
                    consumers=consumers,
                )
            )
            groups = {c.group for c in consumers}
            results = await asyncio.gather(*(self._beat_one(a, body, groups) for a in addrs))
        for refusal in results:
            if refusal is not None:
                raise refusal

    def _consumers(self, *, quiet: bool) -> list[ConsumerData]:
        out: list[ConsumerData] = []
        for provider in list(self._providers):
            try:
                out.append(provider())
            except Exception:
                if not quiet:
                    raise
                log.exception("consumer data provider failed")
        return out

    async def _broker_addrs(self, consumers: Iterable[ConsumerData]) -> list[str]:
        topics = sorted({s.topic for c in consumers for s in c.subscriptions})
        addrs: set[str] = set()
        for topic in topics:
            try:
                info = await self.routes.get(topic)
            except TopicRouteNotFoundError as exc:
                log.info("heartbeat: no route for %r yet: %s", topic, exc)
                continue
            except MQError as exc:
                log.warning("heartbeat: no route for %r: %s", topic, exc)
                continue
            for name in {q.broker_name for q in info.read_queues}:
                addr = info.broker_addrs.get(name)
                if addr:
                    addrs.add(addr)
        return sorted(addrs)

    async def _beat_one(self, addr: str, body: bytes, groups: set[str]) -> RemoteError | None:
        """Beat one broker; returns its refusal when it is one to raise."""
        try:
            resp = await self.remoting.invoke(addr, HeartbeatRequest().frame(body), self.timeout_s)
        except MQError as exc:
            log.warning("heartbeat to %s failed: %s", addr, exc)
            return None
        if resp.code == ResponseCode.SUCCESS:
            self._beaten.add(addr)
            self._groups |= groups
            self.beats += 1
            return None
        err = error_for(resp.code, resp.remark)
        log.warning("broker %s refused the heartbeat of %s: %s", addr, self.client_id, err)
        return None if err.retriable else err

    async def _unregister(self, addrs: list[str], groups: list[str]) -> None:
        if not addrs:
            return
        frames = [UnregisterClientRequest(client_id=self.client_id, group=g) for g in groups] or [
            UnregisterClientRequest(client_id=self.client_id)
        ]

        async def one(addr: str, header: UnregisterClientRequest) -> None:
            try:
                resp = await self.remoting.invoke(addr, header.frame(), self.timeout_s)
            except MQError as exc:
                log.info("unregistering %s from %s failed: %s", self.client_id, addr, exc)
                return
            if resp.code != ResponseCode.SUCCESS:
                log.info(
                    "broker %s refused to unregister %s: %s",
                    addr,
                    self.client_id,
                    error_for(resp.code, resp.remark),
                )

        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.gather(*(one(a, f) for a in addrs for f in frames))
        except TimeoutError:
            log.info("unregistering %s did not finish within %.1fs", self.client_id, self.timeout_s)
