"""Topic routes from the NameServers, cached per topic.

:class:`TopicRouteCache` asks the NameServers for a topic's route (GET_ROUTEINFO_BY_TOPIC) and
keeps the answer, turned into a :class:`TopicPublishInfo`: the writable and readable
:class:`MessageQueue` lists and each broker's master address. Routes are refreshed every
``refresh_interval_s`` by a background task and on demand (a broker answering TOPIC_NOT_EXIST or
NO_PERMISSION asks for one).

NameServers are tried in random order, ones that failed recently last; a connection error, a
timeout or a busy answer moves on to the next. When every NameServer is down the cached routes
stay in use (with a warning): brokers do not move often, and a producer that can still reach
them should keep sending.

**Following a new master** (replicated broker groups, docs/ha.md). A request that fails as a
dead or deposed master's would (:func:`master_gone`: connection refused or lost, a timeout,
NO_PERMISSION from a slave or a former master, a fenced master epoch) is a hint that the group
has, or will soon have, another master: the caller re-reads the route with :meth:`reread` (at
most every :data:`FAILOVER_POLL_S` per topic, however many requests failed) or, when it cannot
wait, :meth:`master_failed` (in the background). :meth:`master_addr` answers from the freshest
route that named the group, so one topic's re-read moves every topic of that group. A group
without a master keeps its queues in :attr:`TopicPublishInfo.order_queues`, so an ordered send
hashes over the same queues during a failover and waits for its group instead of moving.

Not thread-safe: one cache belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    NoPermissionError,
    RemoteError,
    RequestTimeoutError,
    error_class,
    error_for,
)
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import ConnectionClosedError
from orbitmq.protocol.bodies import (
    PERM_READ,
    PERM_WRITE,
    ClusterInfo,
    TopicRouteData,
    decode_body,
)
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.header import Header
from orbitmq.protocol.requests import GetBrokerClusterInfoRequest, GetRouteInfoRequest

log = logging.getLogger(__name__)

AUTO_CREATE_QUEUE_ID = -1
"""Queue id of the stand-in queues of a topic no NameServer knows yet: the broker picks one."""

_NAMESRV_FAILURE_MEMORY_S = 30.0

FAILOVER_POLL_S = 0.2
"""While a group's master is gone, a topic's route is re-read at most this often."""

_FENCED = frozenset({ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH})
_NOT_MASTER = ("not master", "is a slave", "not the master")
"""What a slave's or a deposed master's NO_PERMISSION remark says (broker/ha): NO_PERMISSION
alone also means a read-only topic, which no re-read of the route changes."""


def master_gone(exc: BaseException) -> bool:
    """Whether a failed request says "the broker at that address is not (or no longer) its
    group's master": worth a fresh route, since the group may have another master by now."""
    if isinstance(exc, (ConnectionClosedError, RequestTimeoutError, TimeoutError)):
        return True
    if not isinstance(exc, MQError):
        return False
    if exc.code in _FENCED:
        return True
    if isinstance(exc, NoPermissionError):
        remark = (exc.remark if isinstance(exc, RemoteError) else str(exc)).lower()
        return any(words in remark for words in _NOT_MASTER)
    return False


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker; sorts by topic, broker name, then queue id."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}/{self.queue_id}"


@dataclass(frozen=True, slots=True)
class TopicPublishInfo:
    """A topic's route as clients use it."""

    topic: str
    write_queues: tuple[MessageQueue, ...]
    """Queues of brokers with PERM_WRITE and a master, sorted: where a producer may send."""
    read_queues: tuple[MessageQueue, ...]
    """Queues of brokers with PERM_READ and a master, sorted."""
    broker_addrs: Mapping[str, str]
    """broker name -> master address ("host:port")."""
    fetched_at: float
    route: TopicRouteData | None = None
    """What the NameServer answered (None for an auto-create stand-in)."""
    auto_create: bool = False
    """No NameServer knows the topic: the queues are one stand-in per master broker
    (queue id -1), for brokers that create topics on first send."""
    order_queues: tuple[MessageQueue, ...] = ()
    """Writable queues of every group in the route, with a master or not (between two masters):
    what an ordered send's selector chooses from, so a failover does not move its key."""

    @property
    def selectable_queues(self) -> tuple[MessageQueue, ...]:
        """The queues an ordered send chooses among (``order_queues``, else ``write_queues``)."""
        return self.order_queues or self.write_queues

    @classmethod
    def from_route(cls, topic: str, route: TopicRouteData, fetched_at: float) -> TopicPublishInfo:
        addrs: dict[str, str] = {}
        for bd in route.broker_datas:
            master = bd.master_addr()
            if master:
                addrs[bd.broker_name] = master
        write: list[MessageQueue] = []
        read: list[MessageQueue] = []
        order: list[MessageQueue] = []
        for qd in route.queue_datas:
            if qd.perm & PERM_WRITE:
                order += (
                    MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums)
                )
            if qd.broker_name not in addrs:
                continue  # no master: nowhere to send or read
            if qd.perm & PERM_WRITE:
                write += (
                    MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums)
                )
            if qd.perm & PERM_READ:
                read += (MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return cls(
            topic, tuple(sorted(write)), tuple(sorted(read)), addrs, fetched_at, route,
            order_queues=tuple(sorted(set(order))),
        )  # fmt: skip

    @classmethod
    def stand_in(cls, topic: str, cluster: ClusterInfo, fetched_at: float) -> TopicPublishInfo:
        """Route for a topic no NameServer knows: every master broker, queue id -1."""
        addrs = {
            name: master
            for name, bd in cluster.broker_addr_table.items()
            if (master := bd.master_addr())
        }
        queues = tuple(MessageQueue(topic, name, AUTO_CREATE_QUEUE_ID) for name in sorted(addrs))
        return cls(topic, queues, (), addrs, fetched_at, None, auto_create=True)


class NameServerUnavailableError(ClientError):
    """No NameServer answered (all down, unreachable or busy)."""


class TopicRouteNotFoundError(ClientError):
    """No NameServer knows the topic (and no broker would create it)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"no route for topic {topic!r}: no NameServer knows it")
        self.topic = topic


def parse_namesrv_addrs(addrs: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:9876;b:9876"`` (RocketMQ's form) or a sequence of "host:port"."""
    items = addrs.replace(",", ";").split(";") if isinstance(addrs, str) else list(addrs)
    out = tuple(dict.fromkeys(a.strip() for a in items if a.strip()))
    if not out:
        raise ClientError("no NameServer address given")
    return out


class TopicRouteCache:
    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        remoting: RemotingClient,
        *,
        timeout_s: float = 3.0,
        refresh_interval_s: float = 30.0,
        auto_create_fallback: bool = True,
        stand_in_recheck_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.namesrv_addrs = parse_namesrv_addrs(namesrv_addrs)
        self.remoting = remoting
        self.timeout_s = timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.auto_create_fallback = auto_create_fallback
        self.stand_in_recheck_s = stand_in_recheck_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._routes: dict[str, TopicPublishInfo] = {}
        self._fetching: dict[str, asyncio.Task[TopicPublishInfo]] = {}
        self._failed_at: dict[str, float] = {}
        self._preferred: str | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._soon: dict[str, asyncio.Task[None]] = {}
        self._read_at: dict[str, float] = {}
        self._masters: dict[str, tuple[float, str | None]] = {}
        """broker name -> (when read, its master or None) from the freshest route naming it."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the periodic refresh (call from the event loop)."""
        if self._refresh_task is None and self.refresh_interval_s > 0:
            self._refresh_task = asyncio.get_running_loop().create_task(
                self._refresh_loop(), name="orbitmq-route-refresh"
            )

    async def close(self) -> None:
        tasks: list[asyncio.Task[Any]] = [*self._soon.values(), *self._fetching.values()]
        if self._refresh_task is not None:
            tasks.append(self._refresh_task)
        self._refresh_task = None
        self._soon.clear()
        self._fetching.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            await self.refresh_all()

    async def refresh_all(self) -> None:
        """Refresh every cached topic; failures are logged, cached routes kept."""
        for topic in list(self._routes):
            try:
                await self.refresh(topic)
            except MQError as exc:
                log.warning("route refresh of %r failed, keeping the cached route: %s", topic, exc)

    # ------------------------------------------------------------------ routes

    def cached(self, topic: str) -> TopicPublishInfo | None:
        return self._routes.get(topic)

    def topics(self) -> list[str]:
        return sorted(self._routes)

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def get(self, topic: str) -> TopicPublishInfo:
        """The cached route, fetched first if there is none."""
        info = self._routes.get(topic)
        if info is None:
            return await self.refresh(topic)
        if info.auto_create and self._clock() - info.fetched_at >= self.stand_in_recheck_s:
            self.refresh_soon(topic)  # the broker may have created it by now
        return info

    def refresh_soon(self, topic: str, *, after_s: float = 0.0) -> None:
        """Refresh ``topic`` in the background, ``after_s`` from now (once, however often this
        is called meanwhile)."""
        if topic in self._soon:
            return
        task = asyncio.get_running_loop().create_task(self._refresh_quietly(topic, after_s))
        self._soon[topic] = task
        task.add_done_callback(lambda _t: self._soon.pop(topic, None))

    async def _refresh_quietly(self, topic: str, after_s: float = 0.0) -> None:
        if after_s > 0:
            await asyncio.sleep(after_s)
        try:
            await self.refresh(topic)
        except MQError as exc:
            log.warning("route refresh of %r failed: %s", topic, exc)

    async def refresh(self, topic: str) -> TopicPublishInfo:
        """Ask the NameServers now. Concurrent calls for one topic share one request.

        When no NameServer answers, the cached route is returned (with a warning); without one
        this raises NameServerUnavailableError. When none knows the topic: the cached route if
        there is one (a broker may be re-registering), else an auto-create stand-in
        (``auto_create_fallback``), else TopicRouteNotFoundError.
        """
        task = self._fetching.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(topic))
            self._fetching[topic] = task
            task.add_done_callback(lambda t: self._fetch_done(topic, t))
        return await asyncio.shield(task)

    def _fetch_done(self, topic: str, task: asyncio.Task[TopicPublishInfo]) -> None:
        if self._fetching.get(topic) is task:
            del self._fetching[topic]
        if not task.cancelled():
            task.exception()  # whoever awaited it has it; nobody else needs a log line

    async def _fetch(self, topic: str) -> TopicPublishInfo:
        cached = self._routes.get(topic)
        try:
            resp = await self.request(
                GetRouteInfoRequest(topic=topic),
                move_on=frozenset({ResponseCode.TOPIC_NOT_EXIST}),
            )
        except NameServerUnavailableError as exc:
            if cached is None:
                raise
            log.warning("no NameServer reachable, using the cached route of %r: %s", topic, exc)
            return cached
        now = self._clock()
        self._read_at[topic] = now  # any answer: re-reads after a failure wait from here
        if resp.code == ResponseCode.SUCCESS:
            route = _decode(resp.body, TopicRouteData, "route")
            info = TopicPublishInfo.from_route(topic, route, now)
            self._routes[topic] = info
            for bd in route.broker_datas:
                if self._masters.get(bd.broker_name, (-math.inf, None))[0] <= now:
                    self._masters[bd.broker_name] = (now, bd.master_addr())
            return info
        if resp.code != ResponseCode.TOPIC_NOT_EXIST:
            raise error_for(resp.code, resp.remark)
        if cached is not None and not cached.auto_create:
            log.info("no NameServer knows %r now; keeping its cached route", topic)
            return cached
        if not self.auto_create_fallback:
            raise TopicRouteNotFoundError(topic)
        cluster = await self.cluster_info()
        info = TopicPublishInfo.stand_in(topic, cluster, now)
        if not info.write_queues:
            raise TopicRouteNotFoundError(topic)
        self._routes[topic] = info
        return info

    async def cluster_info(self) -> ClusterInfo:
        resp = await self.request(GetBrokerClusterInfoRequest())
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return _decode(resp.body, ClusterInfo, "cluster info")

    def master_addr(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` in the freshest route that named it (None
        when that route named no master: the group is between two masters)."""
        fresh = self._masters.get(broker_name)
        if fresh is not None:
            return fresh[1]
        for info in self._routes.values():
            addr = info.broker_addrs.get(broker_name)
            if addr:
                return addr
        return None

    def masterless(self, broker_name: str) -> bool:
        """Whether the freshest route naming ``broker_name`` named no master for it."""
        fresh = self._masters.get(broker_name)
        return fresh is not None and fresh[1] is None

    # ------------------------------------------------------------------ following a master

    async def reread(self, topic: str, timeout_s: float) -> TopicPublishInfo | None:
        """Re-read ``topic``'s route after a :func:`master_gone` failure: at once when the last
        read is at least :data:`FAILOVER_POLL_S` old, else when it is (one request for every
        caller meanwhile). None when that does not fit in ``timeout_s``; the cached route when
        no NameServer answers."""
        wait = self._read_at.get(topic, -math.inf) + FAILOVER_POLL_S - self._clock()
        if wait >= timeout_s:
            return None
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            async with asyncio.timeout(max(timeout_s - max(wait, 0.0), 0.001)):
                return await self.refresh(topic)
        except TimeoutError:
            return None
        except MQError as exc:
            log.warning("re-reading the route of %r failed: %s", topic, exc)
            return self._routes.get(topic)

    def master_failed(self, addr: str, exc: BaseException) -> None:
        """A request to ``addr`` failed with ``exc``: when :func:`master_gone` says so, re-read
        (in the background) every cached route naming ``addr`` as a master, no sooner than
        :data:`FAILOVER_POLL_S` after its last read. For callers that cannot wait: their next
        request finds the group's new master through :meth:`master_addr`."""
        if not master_gone(exc):
            return
        now = self._clock()
        for topic, info in list(self._routes.items()):
            if addr in info.broker_addrs.values() and topic not in self._soon:
                log.info("master %s failed (%s): re-reading the route of %r", addr, exc, topic)
                wait = self._read_at.get(topic, -math.inf) + FAILOVER_POLL_S - now
                self.refresh_soon(topic, after_s=max(wait, 0.0))

    # ------------------------------------------------------------------ NameServer requests

    def namesrv_order(self) -> list[str]:
        """NameServers to try: the one that answered last, then the others in random order,
        those that failed in the last 30 s at the end."""
        now = self._clock()
        healthy: list[str] = []
        failed: list[tuple[float, str]] = []
        preferred: str | None = None
        for addr in self.namesrv_addrs:
            at = self._failed_at.get(addr)
            if at is not None and now - at < _NAMESRV_FAILURE_MEMORY_S:
                failed.append((at, addr))
            elif addr == self._preferred:
                preferred = addr
            else:
                healthy.append(addr)
        self._rng.shuffle(healthy)
        if preferred is not None:
            healthy.insert(0, preferred)
        return healthy + [addr for _at, addr in sorted(failed)]

    async def request(
        self,
        header: Header,
        body: Buffer = b"",
        *,
        move_on: frozenset[int] = frozenset(),
        timeout_s: float | None = None,
    ) -> Frame:
        """Send a request to one NameServer, failing over to the next.

        A transport failure (connect, timeout, connection lost) or a SYSTEM_BUSY/SYSTEM_ERROR
        answer moves on to the next NameServer; so does an answer whose code is in ``move_on``
        (the last such answer is returned when no NameServer gives a better one). Any other
        answer is returned as is. NameServerUnavailableError when none answered.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        fallback: Frame | None = None
        errors: list[str] = []
        for addr in self.namesrv_order():
            try:
                resp = await self.remoting.invoke(addr, header.frame(body), timeout)
            except (RemoteError, ClientError) as exc:
                self._note_failure(addr)
                errors.append(f"{addr}: {exc}")
                continue
            if _namesrv_unwell(resp.code):
                self._note_failure(addr)
                errors.append(f"{addr}: {error_for(resp.code, resp.remark)}")
                continue
            self._failed_at.pop(addr, None)
            self._preferred = addr
            if resp.code in move_on:
                fallback = resp
                continue
            return resp
        if fallback is not None:
            return fallback
        raise NameServerUnavailableError("no NameServer answered: " + "; ".join(errors))

    def _note_failure(self, addr: str) -> None:
        self._failed_at[addr] = self._clock()
        if self._preferred == addr:
            self._preferred = None

    async def broadcast(
        self, header: Header, *, timeout_s: float | None = None
    ) -> dict[str, Frame | MQError]:
        """Send a request to every NameServer; each one's answer or error."""
        timeout = self.timeout_s if timeout_s is None else timeout_s

        async def one(addr: str) -> Frame | MQError:
            try:
                return await self.remoting.invoke(addr, header.frame(), timeout)
            except (RemoteError, ClientError) as exc:
                self._note_failure(addr)
                return exc

        answers = await asyncio.gather(*(one(a) for a in self.namesrv_addrs))
        return dict(zip(self.namesrv_addrs, answers, strict=True))


_T = TypeVar("_T")


def _decode(body: Buffer, typ: type[_T], what: str) -> _T:
    try:
        return decode_body(bytes(body) if isinstance(body, bytearray) else body, typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ClientError(f"NameServer sent a malformed {what}: {exc}") from exc


def _namesrv_unwell(code: int) -> bool:
    """An answer that says "try again" (its error class is retriable: SYSTEM_BUSY, SYSTEM_ERROR,
    ...) without saying the route is stale (refresh_route, as TOPIC_NOT_EXIST does, a real
    answer about the topic): ask the next NameServer."""
    if code == ResponseCode.SUCCESS:
        return False
    cls = error_class(code)
    return cls.retriable and not cls.refresh_route
