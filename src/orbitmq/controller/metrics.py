"""A controller node's Prometheus metrics, in their own registry (tests run several nodes in one
process).

The endpoint serves from its own thread. Counters are thread-safe; gauges that summarise tables
(groups, epochs, alive brokers) are set by the scan on the event loop, so the endpoint never
walks a table the loop or the Raft thread is changing. Per-group gauges are this node's view:
read them from the leader.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "orbitmq_controller_requests",
            "Requests by request code and response code",
            ["request", "response"],
            registry=r,
        )
        self.commands = Counter(
            "orbitmq_controller_commands",
            "Commands committed through this node, by command and result code",
            ["command", "result"],
            registry=r,
        )
        self.elections = Counter(
            "orbitmq_controller_elections",
            "Elections committed through this node that changed a group (elected, no_master)",
            ["result"],
            registry=r,
        )
        self.fenced = Counter(
            "orbitmq_controller_fenced",
            "Compare-and-set refusals: a stale master or SyncStateSet epoch, by command",
            ["command"],
            registry=r,
        )
        self.leader = Gauge(
            "orbitmq_controller_leader", "1 while this node believes it is Raft leader", registry=r
        )
        self.raft_term = Gauge("orbitmq_controller_raft_term", "Current Raft term", registry=r)
        self.groups = Gauge("orbitmq_controller_broker_groups", "Broker groups known", registry=r)
        self.alive_brokers = Gauge(
            "orbitmq_controller_alive_brokers", "Brokers with a live heartbeat here", registry=r
        )
        self.master_epoch = Gauge(
            "orbitmq_controller_master_epoch", "Master epoch per group", ["group"], registry=r
        )
        self.sync_state_set_size = Gauge(
            "orbitmq_controller_sync_state_set_size",
            "SyncStateSet members per group",
            ["group"],
            registry=r,
        )
        self.has_master = Gauge(
            "orbitmq_controller_has_master", "1 if the group has a master", ["group"], registry=r
        )
