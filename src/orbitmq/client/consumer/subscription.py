"""A topic subscription: validated where it is made, as the brokers get it, plus its tag set.

Every consumer kind uses this one class: the push and lite pull consumers send ``data`` with each
heartbeat, add ``pull_fields`` to each PULL_MESSAGE and re-check the exact tags with
:meth:`Subscription.accept` (the broker filters by tag hash only); the simple consumer sends
``data`` with each heartbeat and its expression with each POP_MESSAGE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orbitmq.common.clock import now_ms
from orbitmq.common.filter import compile_filter
from orbitmq.common.record import StoredMessage
from orbitmq.common.validation import validate_topic
from orbitmq.protocol.consumer import SubscriptionData

__all__ = ["ALL", "Subscription"]


@dataclass(frozen=True, slots=True)
class Subscription:
    """A topic subscription as sent to the brokers, plus the tag set re-checked here."""

    data: SubscriptionData
    tags: frozenset[str] | None
    """Exact tags to accept (None: every message the broker sends)."""
    pull_fields: Mapping[str, Any] = field(default_factory=dict)
    """The filter fields of a PULL_MESSAGE for this subscription."""

    @property
    def topic(self) -> str:
        return self.data.topic

    @property
    def expression_type(self) -> str:
        """ "TAG" or "SQL92"."""
        return self.data.expression_type

    @property
    def expression(self) -> str:
        return self.data.expression

    @property
    def sub_version(self) -> int:
        """When it was made (ms), so a broker keeps the newest."""
        return self.data.sub_version

    @classmethod
    def parse(cls, topic: str, expression: str = "*", expression_type: str = "TAG") -> Subscription:
        """Validate a subscription (SQL92 is compiled here too, so a typo fails at once);
        FilterExpressionError when it cannot be one."""
        validate_topic(topic)
        flt = compile_filter(expression_type, expression)
        data = SubscriptionData(
            topic=topic,
            expression_type=flt.expression_type,
            expression=expression.strip() or "*",
            sub_version=now_ms(),
        )
        fields: dict[str, Any] = {
            "expression_type": data.expression_type,
            "expression": data.expression,
        }
        if flt.tags is not None:
            fields["tags"] = sorted(flt.tags)  # what brokers without expression support read
        return cls(data, flt.tags, fields)

    def accept(self, msgs: list[StoredMessage]) -> list[StoredMessage]:
        tags = self.tags
        if tags is None:
            return msgs
        return [m for m in msgs if m.properties.get("TAGS") in tags]


ALL = Subscription(SubscriptionData(topic="*"), None)
"""What a queue with no subscription of its own accepts: everything."""
