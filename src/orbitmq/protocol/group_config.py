"""Per-consumer-group settings kept by each broker: the retry policy and the dead-letter rule.

A broker keeps one :class:`SubscriptionGroupConfig` per group it was told about
(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) in ``<store>/config/subscriptionGroup.json``; a group it
was never told about gets :meth:`SubscriptionGroupConfig.default` (RocketMQ's defaults), so
nothing has to be created before consuming. docs/retry-dlq.md describes how the fields are used.

The body of UPDATE_AND_CREATE_SUBSCRIPTIONGROUP is one config, the answer to
GET_ALL_SUBSCRIPTIONGROUP_CONFIG a :class:`SubscriptionGroupConfigList`. Both are validated by
:func:`validate_group_config` on the broker (and by the admin client before sending).
"""

from __future__ import annotations

import msgspec

from orbitmq.common.errors import MessageIllegalError
from orbitmq.common.validation import validate_group

__all__ = [
    "DEFAULT_RETRY_DELAYS_MS",
    "DLQ_REASONS",
    "MAX_ORDERLY_RETRY_INTERVAL_MS",
    "MAX_RETRY_DELAYS",
    "MAX_RETRY_DELAY_MS",
    "MAX_RETRY_TIMES",
    "MIN_ORDERLY_RETRY_INTERVAL_MS",
    "PROPERTY_DLQ_ORIGIN_MESSAGE_ID",
    "PROPERTY_DLQ_ORIGIN_TOPIC",
    "PROPERTY_DLQ_REASON",
    "SubscriptionGroupConfig",
    "SubscriptionGroupConfigList",
    "validate_group_config",
]

DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (
    10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
    540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip
"""RocketMQ's retry schedule: delay levels 3..18 (10s 30s 1m 2m ... 10m 20m 30m 1h 2h). A
message delivered with ``reconsume_times = n`` that fails waits ``delays[min(n, len - 1)]``."""
DEFAULT_RETRY_MAX_TIMES = 16
DEFAULT_ORDERLY_RETRY_INTERVAL_MS = 3_000

MAX_RETRY_TIMES = 1_000
"""Upper bound of ``retry_max_times`` (a message failing this often is not going to succeed)."""
MAX_RETRY_DELAYS = 64
"""Most entries of a delay list."""
MAX_RETRY_DELAY_MS = 7 * 24 * 3600 * 1000
"""Longest single retry delay: 7 days (the timer allows more, a retry schedule needs less)."""
MIN_ORDERLY_RETRY_INTERVAL_MS = 10
MAX_ORDERLY_RETRY_INTERVAL_MS = 3600 * 1000

PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
"""On a dead-lettered copy: the topic the message was first sent to (RocketMQ 5's name)."""
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
"""On a dead-lettered copy: the message's unique id (RocketMQ 5's name)."""
PROPERTY_DLQ_REASON = "DLQ_REASON"
"""On a dead-lettered copy: why it is there (one of DLQ_REASONS)."""
DLQ_REASONS = ("max_reconsume_times", "orderly", "pop")
"""Reasons: a push send-back past the limit, an orderly consumer giving up on a message in
place, a Pop message revived past the limit."""


class SubscriptionGroupConfig(msgspec.Struct, kw_only=True):
    """One consumer group's settings on a broker (RocketMQ's SubscriptionGroupConfig, the
    fields OrbitMQ acts on)."""

    group_name: str
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    """Deliveries a message gets beyond the first before it goes to ``%DLQ%<group>``: one
    delivered with ``reconsume_times >= retry_max_times`` that fails is dead-lettered. A push
    send-back's ``max_reconsume_times`` field (sent when the client sets the option)
    overrides it for that request."""
    retry_delays_ms: list[int] = msgspec.field(
        default_factory=lambda: list(DEFAULT_RETRY_DELAYS_MS)
    )
    """Push (and lite pull) send-back backoff: a message delivered with
    ``reconsume_times = n`` that fails is redelivered ``retry_delays_ms[min(n, len - 1)]`` ms
    after the send-back (through ``%RETRY%<group>``). At least one entry."""
    pop_retry_delays_ms: list[int] | None = None
    """Pop backoff *beyond the invisible time*: a message popped with ``reconsume_times = n``
    and not acked becomes visible again (in ``%RETRY%<group>+<topic>``) at its invisible-time
    end plus ``pop_retry_delays_ms[min(n, len - 1)]``. None: the same list as
    ``retry_delays_ms``; ``[]``: no backoff, the invisible time alone is the retry interval
    (RocketMQ 5's SimpleConsumer behaviour)."""
    orderly_retry_interval_ms: int = DEFAULT_ORDERLY_RETRY_INTERVAL_MS
    """Orderly consumers retry a failing message in place this often (RocketMQ's
    suspendCurrentQueueTimeMillis). Kept for tools; push consumers take it as the client
    option ``orderly_retry_interval_s`` since they do not read group configs."""
    consume_enable: bool = True
    """RocketMQ's consumeEnable: off, Pop and the group's pulls answer NO_PERMISSION."""
    fifo: bool = False
    """RocketMQ 5's consumeMessageOrderly for Pop FIFO groups (used by FIFO consumption)."""

    @classmethod
    def default(cls, group: str) -> SubscriptionGroupConfig:
        return cls(group_name=group)

    def retry_delay_ms(self, reconsume_times: int) -> int:
        """Push backoff for a message that failed at delivery ``reconsume_times``."""
        delays = self.retry_delays_ms
        return delays[min(max(reconsume_times, 0), len(delays) - 1)]

    def pop_retry_delay_ms(self, reconsume_times: int) -> int:
        """Pop backoff beyond the invisible time for a message popped with ``reconsume_times``
        and not acked (0 when the Pop list is empty)."""
        delays = (
            self.retry_delays_ms if self.pop_retry_delays_ms is None else self.pop_retry_delays_ms
        )
        if not delays:
            return 0
        return delays[min(max(reconsume_times, 0), len(delays) - 1)]


class SubscriptionGroupConfigList(msgspec.Struct, kw_only=True):
    """Answer of GET_ALL_SUBSCRIPTIONGROUP_CONFIG: every group configured on the broker
    (groups only ever used with the defaults are not listed), sorted by name."""

    configs: list[SubscriptionGroupConfig]


def _check_delays(name: str, delays: list[int], *, allow_empty: bool) -> None:
    if not delays and not allow_empty:
        raise MessageIllegalError(f"{name} needs at least one delay")
    if len(delays) > MAX_RETRY_DELAYS:
        raise MessageIllegalError(
            f"{name} has {len(delays)} entries, the limit is {MAX_RETRY_DELAYS}"
        )
    for i, d in enumerate(delays):
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_RETRY_DELAY_MS:
            raise MessageIllegalError(
                f"{name}[{i}] = {d!r}: a delay is 0..{MAX_RETRY_DELAY_MS} ms (7 days)"
            )


def validate_group_config(config: SubscriptionGroupConfig) -> None:
    """Raise MessageIllegalError naming the first field out of range."""
    validate_group(config.group_name)
    if not 0 <= config.retry_max_times <= MAX_RETRY_TIMES:
        raise MessageIllegalError(
            f"retry_max_times {config.retry_max_times} is outside 0..{MAX_RETRY_TIMES}"
        )
    _check_delays("retry_delays_ms", config.retry_delays_ms, allow_empty=False)
    if config.pop_retry_delays_ms is not None:
        _check_delays("pop_retry_delays_ms", config.pop_retry_delays_ms, allow_empty=True)
    interval = config.orderly_retry_interval_ms
    if not MIN_ORDERLY_RETRY_INTERVAL_MS <= interval <= MAX_ORDERLY_RETRY_INTERVAL_MS:
        raise MessageIllegalError(
            f"orderly_retry_interval_ms {interval} is outside "
            f"{MIN_ORDERLY_RETRY_INTERVAL_MS}..{MAX_ORDERLY_RETRY_INTERVAL_MS}"
        )
