"""Topic message types (NORMAL, FIFO, DELAY, TRANSACTION, MIXED), as the brokers configure them.

Routes from the NameServer do not carry topic configs, but the proxy needs the type on two paths:
QueryRoute advertises it (``accept_message_types``: the clients refuse to send another type) and
SendMessage enforces it. So the proxy reads each broker's topic configs (GET_ALL_TOPIC_CONFIG, one
request per broker for every topic) and keeps them ``ttl_s``. The send path only ever reads the
cache: a stale entry is refreshed in the background, never on the caller's time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from orbitmq.client.route import TopicRouteCache
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, error_for
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import TopicConfigList, decode_body
from orbitmq.protocol.requests import GetAllTopicConfigRequest

log = logging.getLogger(__name__)

DEFAULT_TYPE = "NORMAL"
MISSING_RECHECK_S = 0.5


@dataclass(slots=True)
class _BrokerTopics:
    types: dict[str, str]
    fetched_at: float


class TopicTypes:
    def __init__(
        self,
        routes: TopicRouteCache,
        remoting: RemotingClient,
        *,
        ttl_s: float = 10.0,
        timeout_s: float = 3.0,
    ) -> None:
        self.routes = routes
        self.remoting = remoting
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._by_addr: dict[str, _BrokerTopics] = {}
        self._fetching: dict[str, asyncio.Task[_BrokerTopics]] = {}
        self._background: set[asyncio.Task[_BrokerTopics]] = set()

    async def get(self, topic: str, *, fresh: bool = False) -> str:
        """The topic's type on the first of its brokers (sorted by name); NORMAL when the broker
        does not list it (an auto-created topic). ``fresh`` waits for a stale entry's refresh."""
        info = await self.routes.get(topic)
        addrs = [info.broker_addrs[n] for n in sorted(info.broker_addrs)]
        for addr in addrs:
            entry = self._by_addr.get(addr)
            age = time.monotonic() - entry.fetched_at if entry is not None else float("inf")
            stale = age > self.ttl_s
            # A topic missing from the list may just have been created: ask again, at most
            # once per MISSING_RECHECK_S per broker, so a new typed topic is advertised as such.
            missing = entry is not None and topic not in entry.types and age > MISSING_RECHECK_S
            if entry is None or (stale and fresh) or missing:
                try:
                    entry = await self._fetch(addr)
                except MQError as exc:
                    log.warning("topic configs of %s unavailable: %s", addr, exc)
                    continue
            elif stale:
                self._refresh_soon(addr)
            if topic in entry.types:
                return entry.types[topic]
        return DEFAULT_TYPE

    def cached(self, topic: str) -> str | None:
        """The type from the cache only (None: unknown yet); refreshes in the background."""
        info = self.routes.cached(topic)
        if info is None:
            return None
        for name in sorted(info.broker_addrs):
            addr = info.broker_addrs[name]
            entry = self._by_addr.get(addr)
            if entry is None:
                self._refresh_soon(addr)
                continue
            if time.monotonic() - entry.fetched_at > self.ttl_s:
                self._refresh_soon(addr)
            kind = entry.types.get(topic)
            if kind is not None:
                return kind
        return None

    def _refresh_soon(self, addr: str) -> None:
        if addr in self._fetching:
            return
        task = asyncio.get_running_loop().create_task(self._fetch(addr))
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[_BrokerTopics]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.info("background refresh of topic configs failed: %s", exc)

    async def _fetch(self, addr: str) -> _BrokerTopics:
        task = self._fetching.get(addr)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._request(addr))
            self._fetching[addr] = task
            task.add_done_callback(lambda _t: self._fetching.pop(addr, None))
        return await asyncio.shield(task)

    async def _request(self, addr: str) -> _BrokerTopics:
        resp = await self.remoting.invoke(addr, GetAllTopicConfigRequest().frame(), self.timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        configs = decode_body(memoryview(resp.body), TopicConfigList).topic_configs
        entry = _BrokerTopics({c.topic_name: c.message_type for c in configs}, time.monotonic())
        self._by_addr[addr] = entry
        return entry

    def forget(self) -> None:
        self._by_addr.clear()

    async def close(self) -> None:
        tasks = [*self._background, *self._fetching.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
