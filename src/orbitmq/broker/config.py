"""BrokerConfig: the broker's settings (the ``[broker]`` table; the store's are in StoreConfig,
nested, the ``[store]`` table). Each is declared with :func:`orbitmq.common.config.setting`,
which documents and checks it."""

from __future__ import annotations

from dataclasses import dataclass, field

from orbitmq.common.config import (
    PORT,
    Check,
    above,
    at_least,
    between,
    check_settings,
    non_empty,
    one_of,
    optional,
    setting,
)
from orbitmq.net.settings import ListenerSettings
from orbitmq.store.config import StoreConfig


@dataclass(frozen=True, slots=True)
class BrokerConfig(ListenerSettings):
    cluster: str = setting(
        "DefaultCluster",
        "Cluster this broker belongs to (RocketMQ's brokerClusterName).",
        non_empty(),
    )
    broker_name: str = setting(
        "broker-a",
        "Name of the broker group; a master and its slaves share it.",
        non_empty(),
    )
    broker_id: int = setting(
        0,
        "0 is the master, as in RocketMQ.",
        at_least(0),
    )
    host: str = setting(
        "127.0.0.1",
        "Address to listen on.",
    )
    port: int = setting(
        10911,
        "RocketMQ's broker port; 0 picks a free one.",
        PORT,
    )
    advertised_host: str | None = setting(
        None,
        "Address registered with NameServers (default: host).",
    )
    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",),
        'NameServers to register with, every one of them ("host:port").',
    )
    register_interval_s: float = setting(
        30.0,
        "How often the broker (re-)registers with every NameServer: the heartbeat.",
        above(0),
    )
    auto_create_topic: bool = setting(
        False,
        "Create a topic on first send. Off by default; `make up`'s dev profile turns it on.",
    )
    default_queue_nums: int = setting(
        8,
        "Read and write queues of an auto-created topic.",
        at_least(1),
    )
    send_queue_capacity: int = setting(
        10_000,
        "Sends waiting for the store beyond this answer SYSTEM_BUSY at once.",
        at_least(1),
    )
    send_wait_timeout_ms: int = setting(
        1_000,
        "A send that waited this long for the store answers SYSTEM_BUSY (RocketMQ: 200 ms, fixed).",
        at_least(1),
    )
    gc_thresholds: tuple[int, ...] = setting(
        (10_000, 20, 100),
        "gc.set_threshold for the broker's process, applied at start (empty: leave "
        "CPython's 700/10/10). A young collection every ~10,000 net new objects instead of "
        "every 700 keeps the per-send GC work and pauses small (docs/benchmarks.md).",
        Check(lambda v: len(v) in (0, 3) and all(n >= 1 for n in v), "three counts >= 1, or empty"),
    )
    send_inline_max_bytes: int = setting(
        256 * 1024,
        "Sends with up to this many body bytes are appended on the event loop, those of one "
        "loop iteration together, and made readable there (no thread hand-off); larger ones "
        "on a writer thread, since encoding them would hold the loop. 0: every send on the "
        "writer thread.",
        at_least(0),
    )
    long_polling_max_ms: int = setting(
        30_000,
        "Upper bound on a pull's suspend time.",
        at_least(0),
    )
    metrics_port: int | None = setting(
        None,
        "Prometheus endpoint port (None: off; 0: a free port).",
        optional(PORT),
    )
    consumer_expiry_s: float = setting(
        40.0,
        "A consumer without a heartbeat for this long leaves its group (looked for every few "
        "seconds).",
        above(0),
    )
    rebalance_lock_ttl_s: float = setting(
        60.0,
        "An orderly consumer's queue lock lapses after this long without renewal (RocketMQ: 60 s).",
        above(0),
    )
    offset_persist_interval_s: float = setting(
        5.0,
        "How often consumer offsets changed only in memory (pull piggy-back, Pop) are written.",
        above(0),
    )
    # A new group's first offset (docs/consumer-groups.md, "A new group's first offset")
    first_consume_from_start_in_memory: bool = setting(
        True,
        "RocketMQ's first-consume rule: a group with no offset on a queue whose first message "
        "(queue offset 0) is still stored and in memory (see access_message_in_memory_max_ratio)"
        " starts at 0, so CONSUME_FROM_LAST_OFFSET push/lite-pull groups and Pop groups get the "
        "messages sent before they started on a young topic (QUERY_CONSUMER_OFFSET answers 0; "
        "RocketMQ's initPopOffsetByCheckMsgInMem for Pop). Off: a new push/lite-pull group starts "
        "at the queue's end, a new Pop group at its last message (max - 1).",
    )
    access_message_in_memory_max_ratio: int = setting(
        40,
        "A record counts as in memory while it lies within the newest this-percent-of-physical-"
        "RAM bytes of the CommitLog (what the page cache holds of a log written in order; "
        "RocketMQ's accessMessageInMemoryMaxRatio). Only the first-consume rule uses it.",
        between(0, 100),
    )
    # Pop
    pop_revive_interval_ms: int = setting(
        200,
        "How often Pop messages whose invisible time ended un-acked are looked for and copied to"
        " their group's pop retry topic (so they come back at most this late).",
        at_least(1),
    )
    pop_revive_compact_lag: int = setting(
        100_000,
        "Revive-log compaction: an open Pop checkpoint whose entry is this many entries behind "
        "the log's head is written again at the head (with its acks), so restart replay, which "
        "starts at the oldest open checkpoint, starts at most about this far back, and the "
        "entries below are never read again (docs/pop.md, The revive log).",
        at_least(1),
    )
    pop_max_inflight_per_group: int = setting(
        100_000,
        "Pop messages a group may hold un-acked on this broker; beyond it a pop answers "
        "POLLING_FULL (bounds the memory a consumer that never acks can take).",
        at_least(1),
    )
    pop_fifo_window: int = setting(
        1024,
        "FIFO Pop (docs/fifo.md): how many messages past a queue's oldest unfinished one a pop "
        "looks at for message groups free to deliver; a group stuck at the front holds back the "
        "others only once they are this far ahead.",
        at_least(1),
    )
    # Transactions
    transaction_timeout_ms: int = setting(
        6_000,
        "A half message without a decision this old gets its first check-back (RocketMQ's "
        "transactionTimeOut; a CHECK_IMMUNITY_TIME_IN_SECONDS property can ask for longer).",
        at_least(0),
    )
    transaction_check_interval_ms: int = setting(
        30_000,
        "How often undecided half messages are checked back with their producer group "
        "(RocketMQ's transactionCheckInterval).",
        at_least(1),
    )
    transaction_check_max: int = setting(
        15,
        "Check-backs a half message gets at most; after that it is discarded and logged "
        "(RocketMQ's transactionCheckMax).",
        at_least(1),
    )
    enforce_topic_message_type: bool = setting(
        False,
        "Refuse a send whose kind does not match the topic's message_type (a transactional send "
        "to a topic not typed TRANSACTION answers TRANSACTION_TYPE_MISMATCH).",
    )
    # Delayed and timer messages (docs/timers.md)
    timer_max_delay_ms: int = setting(
        40 * 24 * 3600 * 1000,
        "Longest delay a delayed or timer message may ask for (40 days); beyond it the send "
        "answers MESSAGE_ILLEGAL. Longer than the CommitLog retention is fine: long timers are "
        'stored again every timer_roll_window_ms ("roll"), so retention never takes a pending '
        "one.",
        at_least(1),
    )
    message_delay_level: str = setting(
        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        "The delays of DELAY levels 1, 2, ... (RocketMQ's messageDelayLevel; units s m h d); a "
        "level above the last means the last.",
    )
    timer_fire_batch: int = setting(
        4096,
        "Due timers one fire pass delivers at most; more due go in the next pass at once (under "
        "load a pass is the tick: every message of it is late by at most the pass's duration).",
        at_least(1),
    )
    timer_checkpoint_interval_ms: int = setting(
        1_000,
        "How often the timer fire checkpoint is written (after the copies it vouches for are "
        "fsynced): a crash re-delivers at most this much of the last fired messages.",
        at_least(1),
    )
    timer_roll_window_ms: int = setting(
        24 * 3600 * 1000,
        "No pending timer's stored copy gets older than this: a timer due later is stored again "
        "(rolled) in the timer topic every window until its last hop, so CommitLog retention "
        "(file_reserved_time_hours) never deletes a pending one. Must be well below the "
        "retention: above half of it, half of it is used (and a warning logged); at least 100 "
        "ms.",
        at_least(0),
    )
    produce_quota_bytes_per_s: float | None = setting(
        None,
        "Byte-rate quota per client (its authenticated user or certificate, else its IP) "
        "for sends; over it, responses are delayed with throttle_time_ms (Kafka's model). "
        "None: no quota.",
        optional(above(0)),
    )
    fetch_quota_bytes_per_s: float | None = setting(
        None,
        "The same for the bytes pulls and pops return. None: no quota.",
        optional(above(0)),
    )
    # Replication, static mode (docs/ha.md): a fixed master (broker_id 0) and its slaves.
    ha_enable: bool = setting(
        False,
        "Replicate this broker group (docs/ha.md, static mode): the master (broker_id 0) serves "
        "its CommitLog on ha_port, a slave (broker_id > 0) copies it from ha_master_address and "
        "refuses sends. Off: a single copy, as before.",
    )
    ha_port: int | None = setting(
        None,
        "Port of the HA link a master listens on (None: the broker port + 1, RocketMQ's "
        "haListenPort; 0 with port 0 picks a free one).",
        optional(PORT),
    )
    ha_master_address: str | None = setting(
        None,
        'A slave\'s master HA address ("host:port"); required on a slave with ha_enable.',
    )
    replication_mode: str = setting(
        "async",
        "sync: a send is answered once every in-sync slave holds it (SYNC_MASTER); async: on "
        "the master's write, the slaves' lag being the loss window (ASYNC_MASTER).",
        one_of("sync", "async"),
    )
    min_in_sync_replicas: int = setting(
        1,
        "sync mode: replicas (the master counted) that must be in sync for a send to be "
        "accepted; below it a send is refused before it is stored (SERVICE_NOT_AVAILABLE).",
        at_least(1),
    )
    slave_timeout_ms: int = setting(
        3_000,
        "sync mode: a send whose bytes no in-sync slave acknowledged this fast answers "
        "FLUSH_SLAVE_TIMEOUT (stored on the master; the producer does not resend it).",
        at_least(1),
    )
    ha_slave_ack_after_flush: bool = setting(
        False,
        "A slave acknowledges replicated bytes after its fdatasync instead of after its write "
        "(safer against a power cut of the whole group, slower).",
    )
    ha_max_time_slave_not_catchup_ms: int = setting(
        15_000,
        "A slave that has not caught up with the master for this long leaves the in-sync set "
        "(RocketMQ's haMaxTimeSlaveNotCatchup).",
        at_least(1),
    )
    ha_heartbeat_interval_ms: int = setting(
        1_000,
        "An idle HA link sends a heartbeat this often.",
        at_least(1),
    )
    ha_link_timeout_ms: int = setting(
        10_000,
        "An HA link with no frame for this long is dead and closed (the slave leaves the "
        "in-sync set; a slave reconnects).",
        at_least(1),
    )
    slave_read_enable: bool = setting(
        False,
        "A slave serves pulls (never above its confirm offset); off: it answers NO_PERMISSION.",
    )
    # Authentication and authorization (docs/security.md).
    auth_enabled: bool = setting(
        False,
        "Every request must be signed by a user (AK/SK) or come with a client certificate, and "
        "is authorized by that user's ACL; off: anyone who reaches the port may do anything.",
    )
    auth_file: str | None = setting(
        None,
        "The users-and-ACLs file, shared by every server of the cluster (None: "
        "<store_path>/config/auth.json). Only settable at start, never remotely.",
    )
    audit_file: str | None = setting(
        None,
        "The hash-chained audit log of admin changes and refusals (None: "
        "<store_path>/audit.jsonl).",
    )
    auth_controller_addrs: tuple[str, ...] = setting(
        (),
        """Controller nodes ("host:port") whose replicated users and ACLs this broker follows
        (`auth_store = "raft"` there; read-only here, cached in auth_file; the sealing key
        from ORBITMQ_AUTH_KEY or `<auth_file>.key`). Empty: the auth_file store.""",
    )
    access_key: str | None = setting(
        None,
        "The user this broker signs its own requests to NameServers and controllers with.",
    )
    secret_key: str | None = setting(
        None,
        "That user's secret (keep the config file private; or ORBITMQ_BROKER_SECRET_KEY).",
        secret=True,
    )
    # Controller mode (docs/ha.md): the controller gives the role, the id and the epoch.
    controller_addrs: tuple[str, ...] = setting(
        (),
        'Controller nodes ("host:port", every one of them). Set: controller mode, the broker '
        "takes its id and its role (master or slave) from the controller and switches roles "
        "without a restart; broker_id, ha_enable and ha_master_address are then ignored and "
        "the HA port is always the broker port + 1. Empty: static mode.",
    )
    election_priority: int = setting(
        2**31 - 1,
        "Controller mode: among equally up-to-date candidates the lowest priority wins.",
        at_least(0),
    )
    master_lease_ms: int = setting(
        2_000,
        "Controller mode: a master stops acknowledging sends this long after the send time of "
        "its last heartbeat the controller's Raft leader answered. Keep it at or below the "
        "controller's master_lease_ms.",
        at_least(100),
    )
    controller_heartbeat_interval_ms: int = setting(
        500,
        "Controller mode: how often the broker heartbeats every controller node.",
        at_least(10),
    )
    replica_info_poll_ms: int = setting(
        3_000,
        "Controller mode: how often the broker reads its group's replica info from the "
        "controller leader (the fallback for a lost role-change notification).",
        at_least(50),
    )
    metadata_offset_log_interval_ms: int = setting(
        1000,
        "Replicated brokers: consumer offsets set without a commit request (pull piggy-back "
        "commits, Pop) are logged for the slaves this often, coalesced (docs/ha.md, "
        '"Metadata replication").',
        at_least(10),
    )
    metadata_snapshot_interval_s: int = setting(
        3600,
        "Replicated brokers: the master logs its whole metadata (topics, groups, offsets, "
        "service checkpoints) this often, and when it takes office; keep it well below the "
        "CommitLog's retention so a new slave finds one.",
        at_least(1),
    )
    trace_enable: bool = setting(
        False,
        "Write RocketMQ-format message-trace records (Pub, SubBefore/SubAfter, EndTransaction) "
        "to RMQ_SYS_TRACE_TOPIC for sampled topics (docs/console.md#message-trace).",
    )
    trace_topics: tuple[str, ...] = setting(
        (),
        "With trace_enable: only these topics are traced (empty: every user topic).",
    )
    trace_sample_ratio: float = setting(
        1.0,
        "With trace_enable: the share of a traced topic's messages traced, chosen by a hash "
        "of the message id (so a message's Pub and Sub records are kept together).",
        between(0.0, 1.0),
    )
    trace_flush_interval_ms: int = setting(
        200,
        "Trace records wait at most this long before they are written, in batches.",
        at_least(1),
    )
    store: StoreConfig = field(default_factory=StoreConfig)

    @property
    def auth_path(self) -> str:
        """The users-and-ACLs file this broker reads: ``auth_file``, else the default in its
        store. The gateways and the proxy started beside it share it."""
        return self.auth_file or str(self.store.store_path / "config" / "auth.json")

    def __post_init__(self) -> None:
        check_settings(self, "broker")
        self.check_listener("broker")
