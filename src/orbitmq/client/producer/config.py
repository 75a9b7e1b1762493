"""Producer settings: each default, what it is for and its valid values written once.

``AsyncProducer(namesrv, ProducerConfig(linger_ms=0))``; the blocking Producer takes the same
object. Out-of-range values raise ClientError when the config is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.client._settings import check_settings
from orbitmq.common.config import above, at_least, between, one_of, setting
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, MAX_HEADER_SIZE

__all__ = ["MAX_BATCH_BYTES", "ProducerConfig"]

MAX_BATCH_BYTES = DEFAULT_MAX_FRAME_SIZE - 2 * MAX_HEADER_SIZE
"""The most message bytes one send frame may carry."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    group: str = setting("DEFAULT_PRODUCER", "Producer group (transactional check-backs).")
    send_timeout_s: float = setting(3.0, "Budget of one send, all retries included.", above(0))
    try_timeout_s: float = setting(
        0.0,
        "Longest wait for one try's answer (0: the whole send budget). Below send_timeout_s, a "
        "try at a master cut off by a partition fails in time to retry at its group's new "
        "master (docs/ha.md); keep it above the brokers' slave_timeout_ms.",
        at_least(0),
    )
    retry_times_when_send_failed: int = setting(
        2, "Tries after the first for a retriable failure, on another broker if any.", at_least(0)
    )
    idempotent: bool = setting(
        False,
        "Number every send per queue under a random producer id so the broker stores a retried "
        "send once and answers replays with the original offset (docs/client.md).",
    )
    compress_over_bytes: int = setting(
        4096, "Bodies larger than this are zstd-compressed (negative: never)."
    )
    compress_level: int = setting(3, "zstd level.", between(-7, 22))
    linger_ms: float = setting(
        5.0,
        "How long send_async waits for more messages to fill a batch (0: same loop iteration).",
        at_least(0),
    )
    batch_max_bytes: int = setting(
        1024 * 1024,
        "An automatic batch is sent once it holds this many bytes.",
        between(1, MAX_BATCH_BYTES),
    )
    batch_max_messages: int = setting(
        512, "An automatic batch is sent once it holds this many messages.", at_least(1)
    )
    max_message_size: int = setting(
        DEFAULT_MAX_MESSAGE_SIZE,
        "Largest body sent (after compression); the broker's default limit.",
        at_least(1),
    )
    max_in_flight_batches: int = setting(
        64,
        "Automatic batches awaiting an answer at once; beyond it batches queue up (and grow).",
        at_least(1),
    )
    linger_only_in_flight: bool = setting(
        False,
        "linger_ms applies only to a batch whose topic (queue) already has a batch awaiting "
        "its answer; a send while none is in flight leaves in the same loop iteration. Larger "
        "batches under load, no wait for a lone send (the gRPC proxy sets it).",
    )
    max_in_flight_per_key: int = setting(
        0,
        "Automatic batches of one topic (one queue, for sends to a queue) awaiting an answer "
        "at once; 0: no bound but max_in_flight_batches. While a topic is at its bound, its "
        "later sends wait in one open batch that leaves when an answer comes (the gRPC proxy "
        "sets it, so concurrent calls share broker requests).",
        at_least(0),
    )
    max_buffered_bytes: int = setting(
        64 * 1024 * 1024,
        "Blocking Producer only: bytes send_async may hold unanswered; beyond it send_async "
        "blocks (up to max_block_s, then ClientError).",
    )
    busy_backoff_ms: float = setting(
        5.0,
        "send_async: first pause before a batch answered SYSTEM_BUSY is sent again; busy "
        "answers do not use up retry_times_when_send_failed (busy_timeout_s bounds them).",
        above(0),
    )
    busy_backoff_max_ms: float = setting(
        200.0, "The pause after SYSTEM_BUSY doubles up to this.", above(0)
    )
    busy_timeout_s: float = setting(
        120.0,
        "send_async: how long a batch may keep being sent again while the broker answers "
        "SYSTEM_BUSY (Kafka's delivery.timeout.ms). A busy answer shows the broker alive and "
        "loaded, so after each one the batch has send_timeout_s again, up to this bound from "
        "its first try; meanwhile the blocking send_async holds its callers back "
        "(max_buffered_bytes). It also bounds how long a batch waits for a late answer while "
        "the broker keeps answering the producer's other batches (behind, not gone).",
        above(0),
    )
    max_block_s: float = setting(
        60.0,
        "Blocking Producer only: how long send_async may block for buffer space (Kafka's "
        "max.block.ms) before it raises ClientError.",
        at_least(0),
    )
    namesrv_timeout_s: float = setting(3.0, "Timeout of one NameServer request.", above(0))
    route_refresh_interval_s: float = setting(30.0, "How often cached routes are refreshed.")
    connect_timeout_s: float = setting(3.0, "Timeout of one connection attempt.", above(0))
    latency_fault_tolerance: bool = setting(
        True, "Avoid brokers that failed or answered slowly (orbitmq.client.fault)."
    )
    auto_create_fallback: bool = setting(
        True,
        "For a topic no NameServer knows, send to every master with queue id -1 (brokers with "
        "auto_create_topic on; others answer TOPIC_NOT_EXIST, then not retried).",
    )

    access_key: str | None = setting(
        None, "User to sign every request with (servers with authentication on; docs/security.md)."
    )
    secret_key: str | None = setting(None, "That user's secret key (never logged).", secret=True)
    signature_version: int = setting(
        2,
        "2: OrbitMQ's HMAC-SHA256 with timestamp and nonce; 1: RocketMQ's HMAC-SHA1.",
        one_of(1, 2),
    )

    def __post_init__(self) -> None:
        check_settings(self, "producer")
