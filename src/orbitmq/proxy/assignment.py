"""QueryAssignment: which queues a RocketMQ 5 push consumer runs a receive loop for.

A push consumer asks every 5 s and keeps one receive loop per assigned queue. Consumption is
Pop, so nothing is assigned exclusively: every member of a group gets every readable queue of
the topic (on every broker with a master), and the brokers decide who gets which message. One
loop per queue, rather than RocketMQ's one per broker, because each loop then pops its own
queue (the proxy honours the queue id of a push consumer's receive): no two loops of a client
contend for one queue's lock, and a topic with more queues gets more parallel pops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orbitmq.client.route import MessageQueue
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb

if TYPE_CHECKING:
    from orbitmq.proxy.context import ProxyContext

__all__ = ["CONSUMER_ACCEPT_TYPES", "assignments"]

CONSUMER_ACCEPT_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
"""A consumer does not check a queue's message types; every type can be read from a topic."""


def assignments(
    ctx: ProxyContext,
    queues: Sequence[MessageQueue],
    topic: pb.Resource,
    endpoints: pb.Endpoints,
) -> list[pb.Assignment]:
    """One assignment per readable queue, pointing back at the proxy (``endpoints``)."""
    return [
        pb.Assignment(
            message_queue=ctx.to_pb_queue(mq, topic, endpoints, pb.READ, CONSUMER_ACCEPT_TYPES)
        )
        for mq in queues
    ]
