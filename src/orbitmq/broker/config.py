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
    pop_fifo_window: int = 1024
    """FIFO Pop (docs/fifo.md): how many messages past a queue's oldest unfinished one a pop
    looks at for message groups free to deliver; a group stuck at the front holds back the
    others only once they are this far ahead."""
    # Transactions
    transaction_timeout_ms: int = 6_000
    """A half message without a decision this old gets its first check-back (RocketMQ's
    transactionTimeOut; a CHECK_IMMUNITY_TIME_IN_SECONDS property can ask for longer)."""
    transaction_check_interval_ms: int = 30_000
    """How often undecided half messages are checked back with their producer group
    (RocketMQ's transactionCheckInterval)."""
    transaction_check_max: int = 15
    """Check-backs a half message gets at most; after that it is discarded and logged
    (RocketMQ's transactionCheckMax)."""
    enforce_topic_message_type: bool = False
    """Refuse a send whose kind does not match the topic's message_type (a transactional send
    to a topic not typed TRANSACTION answers TRANSACTION_TYPE_MISMATCH)."""
    # Delayed and timer messages (docs/timers.md)
    timer_max_delay_ms: int = 40 * 24 * 3600 * 1000
    """Longest delay a delayed or timer message may ask for (40 days); beyond it the send
    answers MESSAGE_ILLEGAL. Longer than the CommitLog retention is fine: long timers are
    stored again every timer_roll_window_ms ("roll"), so retention never takes a pending one."""
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    """The delays of DELAY levels 1, 2, ... (RocketMQ's messageDelayLevel; units s m h d); a
    level above the last means the last."""
    timer_fire_batch: int = 4096
    """Due timers one fire pass delivers at most; more due go in the next pass at once (under
    load a pass is the tick: every message of it is late by at most the pass's duration)."""
    timer_checkpoint_interval_ms: int = 1_000
    """How often the timer fire checkpoint is written (after the copies it vouches for are
    fsynced): a crash re-delivers at most this much of the last fired messages."""
    timer_roll_window_ms: int = 24 * 3600 * 1000
    """No pending timer's stored copy gets older than this: a timer due later is stored again
    (rolled) in the timer topic every window until its last hop, so CommitLog retention
    (file_reserved_time_hours) never deletes a pending one. Must be well below the retention:
    above half of it, half of it is used (and a warning logged); at least 100 ms."""
    store: StoreConfig = field(default_factory=StoreConfig)
