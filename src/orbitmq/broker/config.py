"""BrokerConfig: the broker's settings (the store's are in StoreConfig, nested)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orbitmq.store.config import StoreConfig


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    cluster: str = "DefaultCluster"
    """Cluster this broker belongs to (RocketMQ's brokerClusterName)."""
    broker_name: str = "broker-a"
    """Name of the broker group; a master and its slaves share it."""
    broker_id: int = 0
    """0 is the master, as in RocketMQ."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 10911
    """RocketMQ's broker port; 0 picks a free one."""
    advertised_host: str | None = None
    """Address registered with NameServers (default: host)."""
    namesrv_addrs: tuple[str, ...] = ("127.0.0.1:9876",)
    """NameServers to register with, every one of them ("host:port")."""
    register_interval_s: float = 30.0
    """How often the broker (re-)registers with every NameServer: the heartbeat."""
    auto_create_topic: bool = False
    """Create a topic on first send. Off by default; `make up`'s dev profile turns it on."""
    default_queue_nums: int = 8
    """Read and write queues of an auto-created topic."""
    send_queue_capacity: int = 10_000
    """Sends waiting for the store beyond this answer SYSTEM_BUSY at once."""
    send_wait_timeout_ms: int = 1_000
    """A send that waited this long for the store answers SYSTEM_BUSY (RocketMQ: 200 ms, fixed)."""
    long_polling_max_ms: int = 30_000
    """Upper bound on a pull's suspend time."""
    metrics_port: int | None = None
    """Prometheus endpoint port (None: off; 0: a free port)."""
    consumer_expiry_s: float = 40.0
    """A consumer without a heartbeat for this long leaves its group (looked for every few seconds)."""
    rebalance_lock_ttl_s: float = 60.0
    """An orderly consumer's queue lock lapses after this long without renewal (RocketMQ: 60 s)."""
    offset_persist_interval_s: float = 5.0
    """How often consumer offsets changed only in memory (pull piggy-back, Pop) are written."""
    # Pop
    pop_revive_interval_ms: int = 200
    """How often Pop messages whose invisible time ended un-acked are looked for and copied to
    their group's pop retry topic (so they come back at most this late)."""
    pop_max_inflight_per_group: int = 100_000
    """Pop messages a group may hold un-acked on this broker; beyond it a pop answers
    POLLING_FULL (bounds the memory a consumer that never acks can take)."""
    store: StoreConfig = field(default_factory=StoreConfig)
