"""Producer settings: each default and its rule written once (see :mod:`orbitmq.client._settings`).

``AsyncProducer(namesrv, ProducerConfig(linger_ms=0))``; the blocking Producer takes the same
object. Out-of-range values raise ClientError when the config is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbitmq.client._settings import check_settings, setting
from orbitmq.common.validation import DEFAULT_MAX_MESSAGE_SIZE
from orbitmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, MAX_HEADER_SIZE

__all__ = ["MAX_BATCH_BYTES", "ProducerConfig"]

MAX_BATCH_BYTES = DEFAULT_MAX_FRAME_SIZE - 2 * MAX_HEADER_SIZE
"""The most message bytes one send frame may carry."""


def _positive(v: float) -> bool:
    return v > 0


def _at_least_one(v: int) -> bool:
    return v >= 1


def _not_negative(v: float) -> bool:
    return v >= 0


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    group: str = "DEFAULT_PRODUCER"
    send_timeout_s: float = setting(3.0, _positive)
    """Budget of one send, all retries included."""
    retry_times_when_send_failed: int = setting(2, _not_negative)
    compress_over_bytes: int = 4096
    """Bodies larger than this are zstd-compressed (negative: never)."""
    compress_level: int = setting(3, lambda v: -7 <= v <= 22)
    linger_ms: float = setting(5.0, _not_negative)
    """How long send_async waits for more messages to fill a batch (0: same loop iteration)."""
    batch_max_bytes: int = setting(1024 * 1024, lambda v: 0 < v <= MAX_BATCH_BYTES)
    batch_max_messages: int = setting(512, _at_least_one)
    max_message_size: int = setting(DEFAULT_MAX_MESSAGE_SIZE, _at_least_one)
    """Largest body sent (after compression); the broker's default limit."""
    max_in_flight_batches: int = setting(64, _at_least_one)
    """Automatic batches awaiting an answer at once; beyond it batches queue up (and grow)."""
    max_buffered_bytes: int = 64 * 1024 * 1024
    """Blocking Producer only: the most bytes ``send_async`` may hold unanswered; beyond it
    send_async blocks (up to send_timeout_s, then ClientError)."""
    namesrv_timeout_s: float = setting(3.0, _positive)
    route_refresh_interval_s: float = 30.0
    connect_timeout_s: float = setting(3.0, _positive)
    latency_fault_tolerance: bool = True
    """Avoid brokers that failed or answered slowly (see :mod:`orbitmq.client.fault`)."""
    auto_create_fallback: bool = True
    """For a topic no NameServer knows, send to every master with queue id -1 (for brokers with
    auto_create_topic on; others answer TOPIC_NOT_EXIST, which is then not retried)."""

    def __post_init__(self) -> None:
        check_settings(self, "producer")
