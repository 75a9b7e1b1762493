"""Consumer settings: each default and its rule written once (see :mod:`orbitmq.client._settings`).

``AsyncPushConsumer(namesrv, "G", PushConfig(consume_threads=4))``; the blocking consumers take
the same objects. Out-of-range values raise ClientError when the config is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orbitmq.client._settings import check_settings, setting
from orbitmq.client.allocate import AllocateStrategy
from orbitmq.client.consumer_types import ConsumeFromWhere, MessageModel

__all__ = ["ConsumerConfig", "LitePullConfig", "PushConfig", "SimpleConfig"]


def _positive(v: float) -> bool:
    return v > 0


def _not_negative(v: float) -> bool:
    return v >= 0


def _at_least_one(v: int) -> bool:
    return v >= 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """What every group member (push and lite pull consumers) is configured with."""

    message_model: MessageModel = setting(
        MessageModel.CLUSTERING, lambda v: isinstance(v, MessageModel)
    )
    consume_from_where: ConsumeFromWhere = setting(
        ConsumeFromWhere.LAST_OFFSET, lambda v: isinstance(v, ConsumeFromWhere)
    )
    consume_timestamp_ms: int | None = None
    """Where TIMESTAMP starts (ms)."""
    allocate_strategy: str | AllocateStrategy = "AVG"
    """A strategy or its name (see :mod:`orbitmq.client.allocate`)."""
    pull_batch_size: int = setting(64, lambda v: 1 <= v <= 1024)
    max_cached_messages_per_queue: int = setting(1000, _at_least_one)
    """Pulls of a queue pause while it caches more (flow control)."""
    max_cached_bytes_per_queue: int = setting(100 * 1024 * 1024, _at_least_one)
    client_id: str | None = None
    """None: one made from the host, the process and ``instance_name``."""
    instance_name: str | None = None
    offset_store_dir: str | Path | None = None
    """Broadcasting offsets live here (None: ``~/.orbitmq/offsets``)."""
    heartbeat_interval_s: float = setting(10.0, _positive)
    rebalance_interval_s: float = setting(20.0, _positive)
    auto_commit_interval_s: float = setting(5.0, _positive)
    suspend_timeout_ms: int = setting(15_000, _not_negative)
    """Long poll of one pull."""
    request_timeout_s: float = setting(3.0, _positive)
    removal_timeout_s: float = setting(10.0, _not_negative)
    """How long a handover waits for running listener calls of the queue."""
    handover_delay_s: float = setting(1.0, _not_negative)
    route_refresh_interval_s: float = 30.0

    def __post_init__(self) -> None:
        check_settings(self, "consumer")


@dataclass(frozen=True, slots=True, kw_only=True)
class PushConfig(ConsumerConfig):
    """A push consumer's settings: the group member's, and how the listener is called."""

    consume_threads: int = setting(20, _at_least_one)
    """Listener calls running at once (a thread pool for plain functions, a semaphore for
    ``async def`` ones)."""
    consume_batch_size: int = setting(1, _at_least_one)
    """The most messages per listener call."""
    max_reconsume_times: int | None = setting(None, lambda v: v is None or 0 <= v <= 2**31 - 1)
    """Retries before the dead-letter queue. None leaves it to the group's config on the broker
    (``retry_max_times``); a number is sent with each send-back and overrides it. Orderly
    consumers count retries themselves and use it too (ORDERLY_MAX_RECONSUME_TIMES when None)."""
    orderly_retry_interval_s: float = setting(3.0, lambda v: 0 <= v <= 3600)
    """The pause before an orderly consumer retries a failed batch in place."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LitePullConfig(ConsumerConfig):
    """A lite pull consumer's settings: the group member's, and how polls commit."""

    auto_commit: bool = True
    """Commit consumed positions every ``auto_commit_interval_s``, at handovers and at close."""
    poll_max: int = setting(32, _at_least_one)
    """The most messages one poll returns."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimpleConfig:
    """A simple (Pop) consumer's settings."""

    await_duration_s: float = setting(5.0, _not_negative)
    """The long poll of one receive."""
    client_id: str | None = None
    consume_from_where: ConsumeFromWhere = setting(
        ConsumeFromWhere.LAST_OFFSET,
        lambda v: v in (ConsumeFromWhere.LAST_OFFSET, ConsumeFromWhere.FIRST_OFFSET),
    )
    """LAST_OFFSET or FIRST_OFFSET."""
    request_timeout_s: float = setting(3.0, _positive)
    heartbeat_interval_s: float = setting(10.0, _positive)
    namesrv_timeout_s: float = setting(3.0, _positive)
    route_refresh_interval_s: float = 30.0
    connect_timeout_s: float = setting(3.0, _positive)

    def __post_init__(self) -> None:
        check_settings(self, "simple consumer")
