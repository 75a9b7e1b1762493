"""PartitionOrder: the appends of one partition, on one connection, in request order.

The gateway works on several Produce requests of a connection at once (`KafkaGateway`,
``max_inflight_produce``), so two of them may hold a batch for the same partition. Kafka keeps
a partition's batches in the order their requests arrived, and an idempotent producer's
sequence checks assume it, so each (topic, partition) job takes a ticket when its request is
started, in arrival order, before anything is awaited, and forwards its batches only after the
job holding the ticket before it has finished (stored, refused or failed). What does not
depend on the order (parsing, CRC checks, decompression, the route lookup) runs before the
wait, beside the earlier request's broker round trip.

Jobs are chained by completion, not by the time they were sent: a batch is forwarded after the
previous one's answer, so the idempotence table (`ProducerStates`) has recorded or refused the
previous batch when the next is judged, and a failed batch is never followed by a stored later
one of the same partition (the later one gets OUT_OF_ORDER_SEQUENCE_NUMBER, which Kafka's
idempotent clients retry after the earlier one, as with Kafka). Different partitions, and other
connections, do not wait for each other.
"""

from __future__ import annotations

import asyncio

Key = tuple[str, int]


class Ticket:
    __slots__ = ("_owner", "done", "key", "prev")

    def __init__(self, owner: PartitionOrder, key: Key, prev: asyncio.Future[None] | None) -> None:
        self._owner = owner
        self.key = key
        self.prev = prev
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait(self) -> None:
        """Until the job before this one on the partition has finished."""
        if self.prev is not None and not self.prev.done():
            # asyncio.wait, not await: cancelling this job must not cancel the earlier one's
            await asyncio.wait([self.prev])

    def release(self) -> None:
        """This job has finished (whatever its outcome); idempotent."""
        if not self.done.done():
            self.done.set_result(None)
        self._owner._forget(self)


class PartitionOrder:
    """One per connection: the last ticket of each partition a request of it is working on."""

    def __init__(self) -> None:
        self._tails: dict[Key, Ticket] = {}

    def take(self, topic: str, partition: int) -> Ticket:
        """Called synchronously in request order: a ticket behind the partition's last one."""
        key = (topic, partition)
        last = self._tails.get(key)
        ticket = Ticket(self, key, None if last is None else last.done)
        self._tails[key] = ticket
        return ticket

    def busy(self) -> int:
        """Partitions with a job not finished yet (for tests)."""
        return len(self._tails)

    def _forget(self, ticket: Ticket) -> None:
        if self._tails.get(ticket.key) is ticket:
            del self._tails[ticket.key]  # nothing waits behind it: keep the map small
