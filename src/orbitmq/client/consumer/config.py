"""Consumer settings: each default, what it is for and its valid values written once.

``AsyncPushConsumer(namesrv, "G", PushConfig(consume_threads=4))``; the blocking consumers take
the same objects. Out-of-range values raise ClientError when the config is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orbitmq.client._settings import check_settings
from orbitmq.client.allocate import AllocateStrategy
from orbitmq.client.consumer_types import ConsumeFromWhere, MessageModel
from orbitmq.common.config import Check, above, at_least, between, one_of, optional, setting

__all__ = ["ConsumerConfig", "LitePullConfig", "PushConfig", "SimpleConfig"]


def _instance(cls: type) -> Check:
    return Check(lambda v: isinstance(v, cls), f"a {cls.__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """What every group member (push and lite pull consumers) is configured with."""

    message_model: MessageModel = setting(
        MessageModel.CLUSTERING, "CLUSTERING or BROADCASTING.", _instance(MessageModel)
    )
    consume_from_where: ConsumeFromWhere = setting(
        ConsumeFromWhere.LAST_OFFSET,
        "Where a queue with no committed offset starts.",
        _instance(ConsumeFromWhere),
    )
    consume_timestamp_ms: int | None = setting(None, "Where TIMESTAMP starts (ms).")
    allocate_strategy: str | AllocateStrategy = setting(
        "AVG", "A queue allocation strategy or its name (orbitmq.client.allocate)."
    )
    pull_batch_size: int = setting(64, "Messages asked for per pull.", between(1, 1024))
    max_cached_messages_per_queue: int = setting(
        1000, "Pulls of a queue pause while it caches more messages (flow control).", at_least(1)
    )
    max_cached_bytes_per_queue: int = setting(
        100 * 1024 * 1024, "...or more bytes than this.", at_least(1)
    )
    client_id: str | None = setting(
        None, "None: one made from the host, the process and instance_name."
    )
    instance_name: str | None = setting(None, "Names the broadcasting offset file's folder.")
    offset_store_dir: str | Path | None = setting(
        None, "Broadcasting offsets live here (None: ~/.orbitmq/offsets)."
    )
    heartbeat_interval_s: float = setting(10.0, "How often brokers hear from us.", above(0))
    rebalance_interval_s: float = setting(
        20.0, "How often queues are reassigned (and at once on a change).", above(0)
    )
    auto_commit_interval_s: float = setting(5.0, "How often offsets are committed.", above(0))
    suspend_timeout_ms: int = setting(15_000, "Long poll of one pull.", at_least(0))
    request_timeout_s: float = setting(
        3.0, "Timeout of every other request, and of connecting.", above(0)
    )
    removal_timeout_s: float = setting(
        10.0, "How long a handover waits for running listener calls of the queue.", at_least(0)
    )
    handover_delay_s: float = setting(
        1.0, "After a membership change, additions wait this long after removals.", at_least(0)
    )
    route_refresh_interval_s: float = setting(30.0, "How often cached routes are refreshed.")
    check_crc: bool = setting(
        False,
        "Check each pulled record's CRC32C in the client (off, as in RocketMQ's clients: the "
        "broker checks at append and on disk reads).",
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
        check_settings(self, "consumer")


@dataclass(frozen=True, slots=True, kw_only=True)
class PushConfig(ConsumerConfig):
    """A push consumer's settings: the group member's, and how the listener is called."""

    consume_threads: int = setting(
        20,
        "Listener calls running at once (a thread pool for plain functions, a semaphore for "
        "async def ones).",
        at_least(1),
    )
    consume_batch_size: int = setting(1, "The most messages per listener call.", at_least(1))
    max_reconsume_times: int | None = setting(
        None,
        "Retries before the dead-letter queue. None leaves it to the group's config on the "
        "broker; a number is sent with each send-back and overrides it. Orderly consumers "
        "count retries themselves (16 when None).",
        optional(between(0, 2**31 - 1)),
    )
    orderly_retry_interval_s: float = setting(
        3.0, "The pause before an orderly consumer retries a failed batch.", between(0, 3600)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LitePullConfig(ConsumerConfig):
    """A lite pull consumer's settings: the group member's, and how polls commit."""

    auto_commit: bool = setting(
        True,
        "Commit consumed positions every auto_commit_interval_s, at handovers and at close.",
    )
    poll_max: int = setting(32, "The most messages one poll returns.", at_least(1))


@dataclass(frozen=True, slots=True, kw_only=True)
class SimpleConfig:
    """A simple (Pop) consumer's settings."""

    await_duration_s: float = setting(5.0, "The long poll of one receive.", at_least(0))
    client_id: str | None = setting(None, "None: one made from the host and the process.")
    consume_from_where: ConsumeFromWhere = setting(
        ConsumeFromWhere.LAST_OFFSET,
        "Where the group starts in a queue it never read.",
        one_of(ConsumeFromWhere.LAST_OFFSET, ConsumeFromWhere.FIRST_OFFSET),
    )
    request_timeout_s: float = setting(3.0, "Timeout of one request to a broker.", above(0))
    heartbeat_interval_s: float = setting(10.0, "How often brokers hear from us.", above(0))
    namesrv_timeout_s: float = setting(3.0, "Timeout of one NameServer request.", above(0))
    route_refresh_interval_s: float = setting(30.0, "How often cached routes are refreshed.")
    connect_timeout_s: float = setting(3.0, "Timeout of one connection attempt.", above(0))
    check_crc: bool = setting(
        False, "Check each received record's CRC32C in the client (off, as in RocketMQ's clients)."
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
        check_settings(self, "simple consumer")
