"""``rocketmq_processor_watermark{processor}``: requests queued per request processor.

RocketMQ 5 records, at each scrape, the queue length of each request thread pool (send, pull,
ack, query_message, client_manager, heartbeat, transaction, consumer_manager, admin, ...):
requests read off the wire and not yet being served. OrbitMQ serves every request as a task on
one event loop, so it has no per-pool queue; the same figure here is the requests the broker
has read and not yet answered, per RocketMQ processor, **minus the long-polled pulls and pops**
(RocketMQ parks those in its hold services, outside the pools, and so does this count). A
request waiting on the loop, on a flush or on a replica is counted: on an overloaded broker
that is where the backlog builds, as it does in a RocketMQ pool's queue.

Request codes map to the pool RocketMQ's ``BrokerController.registerProcessor`` gives them;
unlisted codes go to ``admin`` (its default processor). The Dispatcher calls :meth:`enter` and
:meth:`leave` around each request (two list updates); the family is built at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orbitmq.protocol.codes import RequestCode

PROCESSORS = ("send", "async_put", "pull", "ack", "query_message", "client_manager",
              "heartbeat", "lite_pull", "transaction", "consumer_manager", "admin", "reply")  # fmt: skip
"""RocketMQ's ``processor`` label values, in its order (``async_put``, ``lite_pull`` and
``reply`` have no OrbitMQ request code and stay 0)."""

_POOL = {
    RequestCode.SEND_MESSAGE: "send",
    RequestCode.SEND_BATCH_MESSAGE: "send",
    RequestCode.CONSUMER_SEND_MSG_BACK: "send",
    RequestCode.RECALL_MESSAGE: "send",
    RequestCode.PULL_MESSAGE: "pull",
    RequestCode.POP_MESSAGE: "pull",
    RequestCode.ACK_MESSAGE: "ack",
    RequestCode.BATCH_ACK_MESSAGE: "ack",
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: "ack",
    RequestCode.QUERY_MESSAGE: "query_message",
    RequestCode.VIEW_MESSAGE_BY_ID: "query_message",
    RequestCode.HEART_BEAT: "heartbeat",
    RequestCode.UNREGISTER_CLIENT: "client_manager",
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: "consumer_manager",
    RequestCode.UPDATE_CONSUMER_OFFSET: "consumer_manager",
    RequestCode.QUERY_CONSUMER_OFFSET: "consumer_manager",
    RequestCode.END_TRANSACTION: "transaction",
}
_ADMIN = PROCESSORS.index("admin")
_INDEX = {int(code): PROCESSORS.index(pool) for code, pool in _POOL.items()}


def processor_of(code: int) -> str:
    """The RocketMQ processor (thread pool) that serves request ``code``."""
    return PROCESSORS[_INDEX.get(code, _ADMIN)]


class ProcessorWatermark(Collector):
    """Requests being served per processor; ``held`` lists the long-polled ones to leave out,
    as (processor, count source) pairs each service adds for itself, read at scrape time."""

    def __init__(self, base: tuple[str, str, str]) -> None:
        self.base = base
        self.active = [0] * len(PROCESSORS)
        self.held: list[tuple[str, Callable[[], int]]] = []

    def enter(self, code: int) -> int:
        """A request starts; returns the slot to give back to :meth:`leave`."""
        slot = _INDEX.get(code, _ADMIN)
        self.active[slot] += 1
        return slot

    def leave(self, slot: int) -> None:
        self.active[slot] -= 1

    def queued(self) -> dict[str, int]:
        """Processor -> requests read and not answered, long-polled ones left out."""
        out = dict(zip(PROCESSORS, self.active, strict=True))
        for name, held in list(self.held):
            out[name] = max(0, out[name] - held())
        return out

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "rocketmq_processor_watermark",
            "Requests read and not yet answered per processor (long polls excluded)",
            labels=["cluster", "node_type", "node_id", "processor"],
        )
        for name, n in self.queued().items():
            fam.add_metric([*self.base, name], n)
        yield fam
