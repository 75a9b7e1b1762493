"""RocketMQ's first-consume rule: where a consumer group with no offset on a queue starts.

RocketMQ 5 lets a new group read a *young* queue from its start even with
CONSUME_FROM_LAST_OFFSET, so "send, then start a consumer" (every quick start) delivers:

* QUERY_CONSUMER_OFFSET with no stored offset answers offset 0 (instead of QUERY_NOT_FOUND,
  which makes the client start at the queue's end) when the queue's min offset is 0 and that
  message is still in memory (``ConsumerManageProcessor.queryConsumerOffset``);
* a Pop group's first offset is 0 under the same condition, otherwise max - 1
  (``PopMessageProcessor.getInitOffset`` with ``initPopOffsetByCheckMsgInMem``).

"In memory", for OrbitMQ as for RocketMQ (``checkInMemByConsumeOffset``): the queue's first
record is still stored (its CommitLog segment was never deleted by retention, so the queue's
min offset is 0) and lies within the newest ``access_message_in_memory_max_ratio`` percent of
physical RAM of the CommitLog, the part a log written in order keeps in the page cache. That is
the intent, a young topic whose start nobody deleted: replaying it costs no cold disk reads. A
queue whose start retention deleted, or an old one far behind the CommitLog's head, starts at
the end (Pop: at its last message). The switch ``first_consume_from_start_in_memory`` turns the
rule off. Everything here is a few mmap reads of the ConsumeQueue: fine on the event loop.
"""

from __future__ import annotations

import os

from orbitmq.broker.config import BrokerConfig
from orbitmq.store.message_store import MessageStore


def physical_memory_bytes() -> int:
    """The machine's RAM (0 when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class FirstConsume:
    """Answers "does a new group start this queue at 0?" for the offset query and Pop."""

    def __init__(
        self, config: BrokerConfig, store: MessageStore, memory: int | None = None
    ) -> None:
        self.enabled = config.first_consume_from_start_in_memory
        total = physical_memory_bytes() if memory is None else memory
        self.in_memory_bytes = total * config.access_message_in_memory_max_ratio // 100
        """Newest CommitLog bytes counted as in memory."""
        self.store = store

    def first_in_memory(self, topic: str, queue_id: int) -> bool:
        """The queue's offset 0 is still stored and within the CommitLog's in-memory tail."""
        store = self.store
        if store.min_offset(topic, queue_id) > 0:
            return False  # retention (or a TTL) took the start
        cq = store.queues.get(topic, queue_id)
        entry = cq.entry(0) if cq is not None else None
        if entry is None:
            return False  # an empty queue: nothing to start from
        physical = entry[0]
        log = store.commit_log
        if physical < log.min_offset:
            return False  # its segment is gone (the queue's min offset not yet corrected)
        return log.max_offset - physical <= self.in_memory_bytes

    def starts_at_zero(self, topic: str, queue_id: int) -> bool:
        """The rule applies (switch on) and the queue's start is in memory."""
        return self.enabled and self.first_in_memory(topic, queue_id)

    def pop_init_offset(self, topic: str, queue_id: int) -> int:
        """A Pop group's first offset on a queue with CONSUME_FROM_LAST_OFFSET: 0 when the
        start is in memory, else the queue's last message (max - 1, never below the min)."""
        if self.starts_at_zero(topic, queue_id):
            return 0
        high = self.store.max_offset(topic, queue_id)
        return max(high - 1, self.store.min_offset(topic, queue_id), 0)
