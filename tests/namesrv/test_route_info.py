"""RouteInfoManager: the NameServer's tables and rules, without sockets or an event loop.

The example tests pin each rule; the state machine at the end drives random registrations,
unregistrations, expiry, closed connections, wipes and deletions against a small independent
model of who is registered and what each master last reported, and checks every table and the
consistency rules after each step. Replay a run with ``ORBITMQ_SEED=<n>`` (the seed is printed).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from orbitmq.namesrv.route_info import Registration, RouteInfoManager
from orbitmq.protocol.bodies import (
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    BrokerData,
    QueueData,
    TopicConfig,
)

EXPIRE = 120.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def topics(*names: str, perm: int = PERM_READ_WRITE, queues: int = 4) -> dict[str, TopicConfig]:
    return {
        n: TopicConfig(topic_name=n, read_queue_nums=queues, write_queue_nums=queues, perm=perm)
        for n in names
    }


def reg(
    name: str = "broker-a",
    bid: int = 0,
    addr: str = "10.0.0.1:10911",
    configs: dict[str, TopicConfig] | None = None,
    cluster: str = "c1",
    version: int = 1,
) -> Registration:
    return Registration(
        cluster=cluster,
        broker_name=name,
        broker_id=bid,
        broker_addr=addr,
        topic_configs=configs or {},
        data_version=version,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def routes(clock: FakeClock) -> RouteInfoManager:
    return RouteInfoManager(clock)


def check(routes: RouteInfoManager) -> None:
    assert routes.invariant_violations() == []


def route_groups(routes: RouteInfoManager, topic: str) -> dict[str, int]:
    """broker name -> perm in the topic's route ({} when there is no route)."""
    route = routes.topic_route(topic)
    if route is None:
        return {}
    assert [b.broker_name for b in route.broker_datas] == [q.broker_name for q in route.queue_datas]
    return {q.broker_name: q.perm for q in route.queue_datas}


# ---------------------------------------------------------------------- registration


def test_master_registration_fills_every_table(routes: RouteInfoManager) -> None:
    result = routes.register_broker(reg(configs=topics("T1", "T2")))
    assert result.first and result.master_addr == "10.0.0.1:10911"
    route = routes.topic_route("T1")
    assert route is not None
    assert route.queue_datas == [
        QueueData(broker_name="broker-a", read_queue_nums=4, write_queue_nums=4, perm=6)
    ]
    assert route.broker_datas == [
        BrokerData(cluster="c1", broker_name="broker-a", broker_addrs={0: "10.0.0.1:10911"})
    ]
    info = routes.cluster_info()
    assert info.cluster_addr_table == {"c1": ["broker-a"]}
    assert list(info.broker_addr_table) == ["broker-a"]
    assert routes.topic_list().topics == ["T1", "T2"]
    assert routes.topic_route("T3") is None
    assert (routes.broker_count, routes.topic_count, routes.cluster_count) == (1, 2, 1)
    check(routes)


def test_slave_adds_its_address_but_not_its_topics(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    result = routes.register_broker(reg(bid=1, addr="10.0.0.2:10911", configs=topics("X")))
    assert result.first  # the slave's first registration
    assert result.master_addr == "10.0.0.1:10911"
    assert routes.topic_list().topics == ["T1"]
    route = routes.topic_route("T1")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    check(routes)


def test_slave_alone_reports_no_master(routes: RouteInfoManager) -> None:
    result = routes.register_broker(reg(bid=1, addr="10.0.0.2:10911", configs=topics("T1")))
    assert result.master_addr is None
    assert routes.topic_list().topics == []
    assert routes.cluster_info().broker_addr_table["broker-a"].broker_addrs == {1: "10.0.0.2:10911"}
    check(routes)


def test_reregistration_replaces_the_topic_set(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1", "T2", "Shared")))
    routes.register_broker(reg(name="broker-b", addr="10.0.0.9:10911", configs=topics("Shared")))
    result = routes.register_broker(reg(configs=topics("T2", "T3", perm=PERM_READ), version=2))
    assert not result.first
    assert routes.topic_route("T1") is None  # only broker-a held it
    assert route_groups(routes, "Shared") == {"broker-b": PERM_READ_WRITE}
    assert route_groups(routes, "T2") == {"broker-a": PERM_READ}  # perm updated
    assert route_groups(routes, "T3") == {"broker-a": PERM_READ}
    assert routes.topic_list().topics == ["Shared", "T2", "T3"]
    info = routes.live_info("10.0.0.1:10911")
    assert info is not None and info.data_version == 2
    check(routes)


def test_empty_topic_set_drops_every_topic_of_the_group(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1", "T2")))
    routes.register_broker(reg(configs={}))
    assert routes.topic_list().topics == []
    assert "broker-a" in routes.cluster_info().broker_addr_table  # the broker itself stays
    check(routes)


# ---------------------------------------------------------------------- leaving


def test_unregister_removes_only_that_id(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(bid=1, addr="10.0.0.2:10911"))
    assert routes.unregister_broker("broker-a", 0, "10.0.0.1:10911")
    # the slave keeps the group's routes, so consumers can still read from it
    route = routes.topic_route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: "10.0.0.2:10911"}
    check(routes)
    assert routes.unregister_broker("broker-a", 1, "10.0.0.2:10911")
    assert routes.topic_route("T1") is None
    assert routes.cluster_info().cluster_addr_table == {}
    assert routes.broker_count == 0
    check(routes)


def test_unregister_with_a_wrong_identity_changes_nothing(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    before = routes.snapshot()
    assert not routes.unregister_broker("broker-a", 1, "10.0.0.1:10911")
    assert not routes.unregister_broker("broker-b", 0, "10.0.0.1:10911")
    assert not routes.unregister_broker("broker-a", 0, "10.0.0.7:10911")
    assert routes.snapshot() == before


def test_silent_broker_expires_and_heartbeats_keep_it(
    routes: RouteInfoManager, clock: FakeClock
) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(name="broker-b", addr="10.0.0.9:10911", configs=topics("T1")))
    clock.now += EXPIRE
    routes.register_broker(reg(name="broker-b", addr="10.0.0.9:10911", configs=topics("T1")))
    assert routes.scan_not_active_brokers(EXPIRE) == []  # exactly EXPIRE: not yet
    clock.now += 0.001
    assert routes.scan_not_active_brokers(EXPIRE) == ["10.0.0.1:10911"]
    assert route_groups(routes, "T1") == {"broker-b": PERM_READ_WRITE}
    clock.now += EXPIRE
    assert routes.scan_not_active_brokers(EXPIRE) == ["10.0.0.9:10911"]
    assert routes.topic_list().topics == []
    check(routes)


def test_closed_connection_drops_the_brokers_registered_on_it(routes: RouteInfoManager) -> None:
    conn_a, conn_b, other = object(), object(), object()
    routes.register_broker(reg(configs=topics("T1")), conn_a)
    routes.register_broker(reg(name="broker-b", addr="10.0.0.9:10911", configs=topics("T1")), other)
    # broker-a reconnects and registers on a new connection before the old one is noticed
    routes.register_broker(reg(configs=topics("T1")), conn_b)
    assert routes.connection_closed(conn_a) == []
    assert set(route_groups(routes, "T1")) == {"broker-a", "broker-b"}
    assert routes.connection_closed(conn_b) == ["10.0.0.1:10911"]
    assert set(route_groups(routes, "T1")) == {"broker-b"}
    check(routes)


# ---------------------------------------------------------------------- identity changes


def test_address_taken_over_by_another_group(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(name="broker-b", configs=topics("T2")))  # same address
    assert routes.topic_route("T1") is None
    assert list(routes.cluster_info().broker_addr_table) == ["broker-b"]
    check(routes)


def test_master_moves_to_a_new_address(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(addr="10.0.0.5:10911", configs=topics("T1")))
    assert routes.live_info("10.0.0.1:10911") is None
    route = routes.topic_route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "10.0.0.5:10911"}
    check(routes)


def test_slave_promoted_on_the_same_address(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(bid=1, addr="10.0.0.2:10911"))
    routes.unregister_broker("broker-a", 0, "10.0.0.1:10911")
    result = routes.register_broker(reg(bid=0, addr="10.0.0.2:10911", configs=topics("T1")))
    assert result.master_addr == "10.0.0.2:10911"
    assert routes.cluster_info().broker_addr_table["broker-a"].broker_addrs == {0: "10.0.0.2:10911"}
    check(routes)


def test_group_moves_to_another_cluster(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    routes.register_broker(reg(configs=topics("T1"), cluster="c2"))
    info = routes.cluster_info()
    assert info.cluster_addr_table == {"c2": ["broker-a"]}
    assert info.broker_addr_table["broker-a"].cluster == "c2"
    check(routes)


# ---------------------------------------------------------------------- admin


def test_wipe_write_perm_masks_routes_until_added_back(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1", "T2") | topics("RO", perm=PERM_READ)))
    routes.register_broker(reg(name="broker-b", addr="10.0.0.9:10911", configs=topics("T1")))
    assert routes.wipe_write_perm("broker-a") == 3
    assert route_groups(routes, "T1") == {"broker-a": PERM_READ, "broker-b": PERM_READ_WRITE}
    # the broker keeps registering with write permission: the wipe holds
    routes.register_broker(reg(configs=topics("T1", "T2", "New") | topics("RO", perm=PERM_READ)))
    assert route_groups(routes, "New") == {"broker-a": PERM_READ}
    assert route_groups(routes, "T2") == {"broker-a": PERM_READ}
    # it even holds across the broker dropping out and coming back (a restart)
    routes.unregister_broker("broker-a", 0, "10.0.0.1:10911")
    routes.register_broker(reg(configs=topics("T1")))
    assert route_groups(routes, "T1")["broker-a"] == PERM_READ
    routes.register_broker(reg(configs=topics("T1", "T2") | topics("RO", perm=PERM_READ)))
    assert routes.add_write_perm("broker-a") == 3
    assert route_groups(routes, "T1")["broker-a"] == PERM_READ_WRITE
    assert route_groups(routes, "RO")["broker-a"] == PERM_READ  # registered read-only
    check(routes)


def test_wipe_of_an_unknown_group_leaves_nothing_behind(routes: RouteInfoManager) -> None:
    assert routes.wipe_write_perm("nobody") == 0
    assert not routes.is_write_wiped("nobody")
    routes.register_broker(reg(name="nobody", configs=topics("T1")))
    assert route_groups(routes, "T1") == {"nobody": PERM_READ_WRITE}
    assert routes.add_write_perm("nobody") == 1


def test_wipe_clears_only_the_write_bit(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T", perm=PERM_READ_WRITE | 1)))
    routes.wipe_write_perm("broker-a")
    perm = route_groups(routes, "T")["broker-a"]
    assert perm == PERM_READ | 1 and not perm & PERM_WRITE


def test_delete_topic_everywhere_or_in_one_cluster(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1", "T2")))
    routes.register_broker(
        reg(name="broker-b", addr="10.0.0.9:10911", cluster="c2", configs=topics("T1", "T2"))
    )
    assert routes.delete_topic("T1")
    assert routes.topic_route("T1") is None
    assert not routes.delete_topic("T1")
    assert routes.delete_topic("T2", cluster="c2")
    assert route_groups(routes, "T2") == {"broker-a": PERM_READ_WRITE}
    assert not routes.delete_topic("T2", cluster="elsewhere")
    assert routes.delete_topic("T2", cluster="c1")
    assert routes.topic_list().topics == []
    check(routes)
    # the next registration reports the topics again (delete them on the broker first)
    routes.register_broker(reg(configs=topics("T1")))
    assert route_groups(routes, "T1") == {"broker-a": PERM_READ_WRITE}


def test_routes_are_copies(routes: RouteInfoManager) -> None:
    routes.register_broker(reg(configs=topics("T1")))
    route = routes.topic_route("T1")
    assert route is not None
    route.queue_datas[0].perm = 0
    route.broker_datas[0].broker_addrs[5] = "x:1"
    assert route_groups(routes, "T1") == {"broker-a": PERM_READ_WRITE}
    check(routes)


# ---------------------------------------------------------------------- state machine

NAMES = ("ga", "gb", "gc")
ADDRS = tuple(f"10.0.0.{i}:10911" for i in range(1, 6))
CLUSTERS = ("c1", "c2")
TOPIC_POOL = ("T0", "T1", "T2", "T3")
N_CONNS = 3
MACHINE_EXPIRE = 10.0

topic_sets = st.dictionaries(
    st.sampled_from(TOPIC_POOL),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 7)),
    max_size=len(TOPIC_POOL),
)


class RoutesMachine(RuleBasedStateMachine):
    """The model: who is registered (address -> identity) and what each master last reported."""

    @initialize()
    def setup(self) -> None:
        self.clock = FakeClock()
        self.routes = RouteInfoManager(self.clock)
        self.conns = [object() for _ in range(N_CONNS)]
        # address -> (cluster, name, id, connection index or None, last update)
        self.live: dict[str, tuple[str, str, int, int | None, float]] = {}
        self.group_cluster: dict[str, str] = {}
        self.group_topics: dict[str, dict[str, tuple[int, int, int]]] = {}
        self.wiped: set[str] = set()

    def _present(self) -> set[str]:
        return {name for _, name, _, _, _ in self.live.values()}

    def _forget_departed(self) -> None:
        present = self._present()
        for table in (self.group_cluster, self.group_topics):
            for name in [n for n in table if n not in present]:
                del table[name]

    @rule(
        cluster=st.sampled_from(CLUSTERS),
        name=st.sampled_from(NAMES),
        bid=st.sampled_from((0, 0, 1, 2)),
        addr=st.sampled_from(ADDRS),
        reported=topic_sets,
        conn=st.one_of(st.none(), st.integers(0, N_CONNS - 1)),
    )
    def register(
        self,
        cluster: str,
        name: str,
        bid: int,
        addr: str,
        reported: dict[str, tuple[int, int, int]],
        conn: int | None,
    ) -> None:
        configs = {
            t: TopicConfig(topic_name=t, read_queue_nums=r, write_queue_nums=w, perm=p)
            for t, (r, w, p) in reported.items()
        }
        result = self.routes.register_broker(
            reg(name=name, bid=bid, addr=addr, configs=configs, cluster=cluster),
            None if conn is None else self.conns[conn],
        )
        was = self.live.get(addr)
        assert result.first == (was is None or was[1] != name)
        for other in [a for a, v in self.live.items() if a != addr and v[1:3] == (name, bid)]:
            del self.live[other]
        self.live[addr] = (cluster, name, bid, conn, self.clock.now)
        self.group_cluster[name] = cluster
        if bid == 0:
            self.group_topics[name] = dict(reported)
        self._forget_departed()
        masters = [a for a, v in self.live.items() if v[1] == name and v[2] == 0]
        assert result.master_addr == (masters[0] if masters else None)

    @rule(addr=st.sampled_from(ADDRS), data=st.data())
    def unregister(self, addr: str, data: st.DataObject) -> None:
        entry = self.live.get(addr)
        if entry is not None and data.draw(st.booleans(), label="matching identity"):
            name, bid = entry[1], entry[2]
        else:
            name = data.draw(st.sampled_from(NAMES), label="name")
            bid = data.draw(st.sampled_from((0, 1, 2)), label="id")
        removed = self.routes.unregister_broker(name, bid, addr)
        expect = entry is not None and entry[1:3] == (name, bid)
        assert removed == expect
        if expect:
            del self.live[addr]
        self._forget_departed()

    @rule(seconds=st.sampled_from((0.5, 3.0, MACHINE_EXPIRE, 11.0)))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def scan(self) -> None:
        gone = self.routes.scan_not_active_brokers(MACHINE_EXPIRE)
        expect = [a for a, v in self.live.items() if self.clock.now - v[4] > MACHINE_EXPIRE]
        assert sorted(gone) == sorted(expect)
        for a in expect:
            del self.live[a]
        self._forget_departed()

    @rule(conn=st.integers(0, N_CONNS - 1))
    def close_connection(self, conn: int) -> None:
        gone = self.routes.connection_closed(self.conns[conn])
        expect = [a for a, v in self.live.items() if v[3] == conn]
        assert sorted(gone) == sorted(expect)
        for a in expect:
            del self.live[a]
        self._forget_departed()

    @rule(name=st.sampled_from((*NAMES, "unknown")))
    def wipe(self, name: str) -> None:
        count = self.routes.wipe_write_perm(name)
        if name in self._present():
            self.wiped.add(name)
            assert count == len(self.group_topics.get(name, {}))
        else:
            assert count == 0

    @rule(name=st.sampled_from((*NAMES, "unknown")))
    def add(self, name: str) -> None:
        count = self.routes.add_write_perm(name)
        self.wiped.discard(name)
        assert count == len(self.group_topics.get(name, {}))

    @rule(topic=st.sampled_from(TOPIC_POOL), cluster=st.sampled_from((None, *CLUSTERS)))
    def delete_topic(self, topic: str, cluster: str | None) -> None:
        hit = False
        for name, held in self.group_topics.items():
            if topic in held and (cluster is None or self.group_cluster[name] == cluster):
                del held[topic]
                hit = True
        assert self.routes.delete_topic(topic, cluster) == hit

    @invariant()
    def tables_match_the_model(self) -> None:
        if not hasattr(self, "routes"):
            return
        assert self.routes.invariant_violations() == []
        info = self.routes.cluster_info()
        expect_addrs: dict[str, dict[int, str]] = {}
        for addr, (_c, name, bid, _conn, _t) in self.live.items():
            expect_addrs.setdefault(name, {})[bid] = addr
        assert {n: b.broker_addrs for n, b in info.broker_addr_table.items()} == expect_addrs
        assert {n: b.cluster for n, b in info.broker_addr_table.items()} == self.group_cluster
        expect_clusters: dict[str, list[str]] = {}
        for name, cluster in sorted(self.group_cluster.items()):
            expect_clusters.setdefault(cluster, []).append(name)
        assert info.cluster_addr_table == expect_clusters
        expect_topics = sorted({t for held in self.group_topics.values() for t in held})
        assert self.routes.topic_list().topics == expect_topics
        for topic in TOPIC_POOL:
            expect: dict[str, tuple[int, int, int]] = {}
            for name, held in self.group_topics.items():
                if topic in held:
                    r, w, p = held[topic]
                    expect[name] = (r, w, p & ~PERM_WRITE if name in self.wiped else p)
            route = self.routes.topic_route(topic)
            got: dict[str, Any] = {}
            if route is not None:
                got = {
                    q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm)
                    for q in route.queue_datas
                }
                assert [b.broker_name for b in route.broker_datas] == sorted(got)
            assert got == expect


def _seed() -> int:
    env = os.environ.get("ORBITMQ_SEED")
    return int(env) if env else random.randrange(2**32)


def test_routes_match_model() -> None:
    n = _seed()
    print(f"ORBITMQ_SEED={n}")
    machine: Any = hyp_seed(n)(RoutesMachine)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("ORBITMQ_STATEFUL_EXAMPLES", "60")),
            stateful_step_count=40,
            deadline=None,
            database=None,
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
