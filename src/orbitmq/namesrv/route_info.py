"""The NameServer's route tables and their rules: pure, synchronous, no I/O, no event loop.

Four tables, as in RocketMQ's RouteInfoManager:

- clusters: cluster -> broker names in it;
- brokers: broker name -> (cluster, {broker id: address}); id 0 is the master;
- topics: topic -> {broker name: QueueData}: which broker groups hold the topic, how many
  queues and with which permissions;
- live: broker address -> when it last registered, its data version and the connection it
  registered on.

Plus one set, the broker names whose write permission an operator wiped (graceful scale-in).

Rules kept here rather than in the request handlers, so they can be tested without sockets:

- Only a master (id 0) defines a broker group's topics: its registration *replaces* the group's
  topic set, so a topic the master stopped reporting loses the group's QueueData, and a topic
  no group holds any more disappears. A slave's registration only records its address.
- A broker group whose last address goes (unregistered, expired or disconnected) takes its
  QueueData with it; a slave left alone keeps the group's routes, so consumers can still read.
- Wiping write permission masks PERM_WRITE in every route of that group until ADD_WRITE_PERM,
  whatever the brokers register meanwhile; a broker re-registering after a restart or a
  dropped connection must not make itself writable again behind the operator's back.
- Every address belongs to exactly one (broker name, id); registering an address under a new
  identity drops the old one first, so the tables never point at a broker twice.

Time comes from an injectable clock (seconds, monotonic) so expiry is testable without waiting.
Callers validate input first (see ``orbitmq.namesrv.processor``): nothing here rejects a value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from orbitmq.protocol.bodies import (
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    QueueData,
    TopicConfig,
    TopicList,
    TopicRouteData,
)

MASTER_ID = 0

Clock = Callable[[], float]


@dataclass(slots=True)
class BrokerLiveInfo:
    """What is known about one registered broker process (keyed by its address)."""

    cluster: str
    broker_name: str
    broker_id: int
    last_update: float
    """Clock time of its last registration (the heartbeat)."""
    data_version: int
    connection: Hashable | None
    """The connection it last registered on; when that closes, the broker is gone."""


@dataclass(slots=True)
class _BrokerGroup:
    cluster: str
    addrs: dict[int, str]


@dataclass(frozen=True, slots=True)
class Registration:
    """A validated REGISTER_BROKER request."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    topic_configs: Mapping[str, TopicConfig]
    data_version: int = 0


@dataclass(frozen=True, slots=True)
class RegisterResult:
    master_addr: str | None
    """The group's master address after this registration (slaves need it), or None."""
    first: bool
    """This address was not registered before (a new broker, or one that had been dropped)."""


class RouteInfoManager:
    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._clusters: dict[str, set[str]] = {}
        self._brokers: dict[str, _BrokerGroup] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._live: dict[str, BrokerLiveInfo] = {}
        self._write_wiped: set[str] = set()

    # ------------------------------------------------------------------ sizes (metrics)

    @property
    def broker_count(self) -> int:
        """Registered broker processes (addresses)."""
        return len(self._live)

    @property
    def broker_group_count(self) -> int:
        """Registered broker names (a master and its slaves share one)."""
        return len(self._brokers)

    @property
    def topic_count(self) -> int:
        return len(self._topics)

    @property
    def cluster_count(self) -> int:
        return len(self._clusters)

    def live_info(self, broker_addr: str) -> BrokerLiveInfo | None:
        return self._live.get(broker_addr)

    # ------------------------------------------------------------------ changes

    def register_broker(
        self, reg: Registration, connection: Hashable | None = None
    ) -> RegisterResult:
        """Record a broker, refresh its heartbeat and (from a master) replace its topic set."""
        name, bid, addr = reg.broker_name, reg.broker_id, reg.broker_addr
        prev = self._live.get(addr)
        if prev is not None and prev.broker_name != name:
            # The address now belongs to another group (a reconfigured broker): the old
            # identity is gone, with whatever only it held.
            self._remove_addr(addr)
            prev = None
        group = self._brokers.get(name)
        if group is None:
            group = self._brokers[name] = _BrokerGroup(reg.cluster, {})
        elif group.cluster != reg.cluster:
            self._discard_from_cluster(group.cluster, name)
            group.cluster = reg.cluster
        self._clusters.setdefault(reg.cluster, set()).add(name)
        for other_id, other_addr in list(group.addrs.items()):
            if other_addr == addr and other_id != bid:
                del group.addrs[other_id]  # same process, new role (slave promoted)
        old_addr = group.addrs.get(bid)
        if old_addr is not None and old_addr != addr:
            self._live.pop(old_addr, None)  # the id moved to a new address
        group.addrs[bid] = addr
        self._live[addr] = BrokerLiveInfo(
            cluster=reg.cluster,
            broker_name=name,
            broker_id=bid,
            last_update=self._clock(),
            data_version=reg.data_version,
            connection=connection,
        )
        if bid == MASTER_ID:
            self._replace_topics(name, reg.topic_configs)
        return RegisterResult(master_addr=group.addrs.get(MASTER_ID), first=prev is None)

    def unregister_broker(self, broker_name: str, broker_id: int, broker_addr: str) -> bool:
        """Remove that broker if the address is registered under that name and id."""
        info = self._live.get(broker_addr)
        if info is None or info.broker_name != broker_name or info.broker_id != broker_id:
            return False
        self._remove_addr(broker_addr)
        return True

    def scan_not_active_brokers(self, expired_s: float) -> list[str]:
        """Drop brokers that have not registered for more than ``expired_s``; their addresses."""
        now = self._clock()
        gone = [a for a, info in self._live.items() if now - info.last_update > expired_s]
        for addr in gone:
            self._remove_addr(addr)
        return gone

    def connection_closed(self, connection: Hashable) -> list[str]:
        """Drop the brokers whose latest registration came over ``connection``."""
        gone = [a for a, info in self._live.items() if info.connection is connection]
        for addr in gone:
            self._remove_addr(addr)
        return gone

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic (only its queues on ``cluster``'s brokers when a cluster is given)."""
        queues = self._topics.get(topic)
        if queues is None:
            return False
        if cluster is None:
            del self._topics[topic]
            return True
        names = self._clusters.get(cluster, set())
        hit = [n for n in queues if n in names]
        for n in hit:
            del queues[n]
        if not queues:
            del self._topics[topic]
        return bool(hit)

    def wipe_write_perm(self, broker_name: str) -> int:
        """Mask PERM_WRITE on every route of that group; how many topics it holds.

        An unknown group is left alone (0), so a mistyped name leaves nothing behind.
        """
        if broker_name not in self._brokers:
            return 0
        self._write_wiped.add(broker_name)
        return self._topics_of(broker_name)

    def add_write_perm(self, broker_name: str) -> int:
        """Undo a wipe: routes show the permissions the master registered again."""
        self._write_wiped.discard(broker_name)
        return self._topics_of(broker_name)

    def is_write_wiped(self, broker_name: str) -> bool:
        return broker_name in self._write_wiped

    # ------------------------------------------------------------------ queries

    def topic_route(self, topic: str) -> TopicRouteData | None:
        queues = self._topics.get(topic)
        if queues is None:
            return None
        names = sorted(queues)
        return TopicRouteData(
            queue_datas=[self._queue_data(queues[n]) for n in names],
            broker_datas=[self._broker_data(n) for n in names if n in self._brokers],
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={n: self._broker_data(n) for n in sorted(self._brokers)},
            cluster_addr_table={c: sorted(ns) for c, ns in sorted(self._clusters.items())},
        )

    def topic_list(self) -> TopicList:
        return TopicList(topics=sorted(self._topics))

    def snapshot(self) -> dict[str, Any]:
        """Every table as plain values, for tests to compare states (not for the wire)."""
        return {
            "clusters": {c: sorted(ns) for c, ns in self._clusters.items()},
            "brokers": {n: (g.cluster, dict(g.addrs)) for n, g in self._brokers.items()},
            "topics": {
                t: {n: (q.read_queue_nums, q.write_queue_nums, q.perm) for n, q in qs.items()}
                for t, qs in self._topics.items()
            },
            "live": {
                a: (i.cluster, i.broker_name, i.broker_id, i.last_update, i.data_version)
                for a, i in self._live.items()
            },
            "connections": {a: id(i.connection) for a, i in self._live.items()},
            "write_wiped": sorted(self._write_wiped),
        }

    def invariant_violations(self) -> list[str]:
        """The tables' consistency rules that do not hold (empty when all is well)."""
        out: list[str] = []
        for cluster, names in self._clusters.items():
            if not names:
                out.append(f"cluster {cluster} is empty")
            for n in names:
                g = self._brokers.get(n)
                if g is None or g.cluster != cluster:
                    out.append(f"cluster {cluster} lists {n}, which is not in it")
        seen: set[str] = set()
        for name, g in self._brokers.items():
            if not g.addrs:
                out.append(f"broker group {name} has no address")
            if name not in self._clusters.get(g.cluster, set()):
                out.append(f"broker group {name} is missing from cluster {g.cluster}")
            for bid, addr in g.addrs.items():
                info = self._live.get(addr)
                if info is None or (info.broker_name, info.broker_id) != (name, bid):
                    out.append(f"{name}/{bid} at {addr} has no matching live entry")
                if addr in seen:
                    out.append(f"address {addr} is listed twice")
                seen.add(addr)
        if seen != set(self._live):
            out.append(f"live entries without a group: {sorted(set(self._live) - seen)}")
        for topic, queues in self._topics.items():
            if not queues:
                out.append(f"topic {topic} has no queue data")
            out.extend(
                f"topic {topic} names unknown group {n}" for n in queues if n not in self._brokers
            )
        return out

    # ------------------------------------------------------------------ internals

    def _replace_topics(self, name: str, configs: Mapping[str, TopicConfig]) -> None:
        for topic in [t for t, qs in self._topics.items() if name in qs and t not in configs]:
            queues = self._topics[topic]
            del queues[name]
            if not queues:
                del self._topics[topic]
        for topic, tc in configs.items():
            self._topics.setdefault(topic, {})[name] = QueueData(
                broker_name=name,
                read_queue_nums=tc.read_queue_nums,
                write_queue_nums=tc.write_queue_nums,
                perm=tc.perm,
            )

    def _remove_addr(self, addr: str) -> None:
        info = self._live.pop(addr, None)
        if info is None:
            return
        name = info.broker_name
        group = self._brokers.get(name)
        if group is None:
            return
        for bid in [b for b, a in group.addrs.items() if a == addr]:
            del group.addrs[bid]
        if group.addrs:
            return
        del self._brokers[name]
        self._discard_from_cluster(group.cluster, name)
        for topic in [t for t, qs in self._topics.items() if name in qs]:
            queues = self._topics[topic]
            del queues[name]
            if not queues:
                del self._topics[topic]

    def _discard_from_cluster(self, cluster: str, name: str) -> None:
        names = self._clusters.get(cluster)
        if names is None:
            return
        names.discard(name)
        if not names:
            del self._clusters[cluster]

    def _topics_of(self, name: str) -> int:
        return sum(1 for qs in self._topics.values() if name in qs)

    def _queue_data(self, q: QueueData) -> QueueData:
        perm = q.perm & ~PERM_WRITE if q.broker_name in self._write_wiped else q.perm
        return QueueData(
            broker_name=q.broker_name,
            read_queue_nums=q.read_queue_nums,
            write_queue_nums=q.write_queue_nums,
            perm=perm,
        )

    def _broker_data(self, name: str) -> BrokerData:
        g = self._brokers[name]
        return BrokerData(
            cluster=g.cluster, broker_name=name, broker_addrs=dict(sorted(g.addrs.items()))
        )
