"""TransactionProcessor: answers END_TRANSACTION, a producer's COMMIT, ROLLBACK or UNKNOWN for
one half message (docs/transactions.md). Applying the decision exactly once is the
:class:`~orbitmq.broker.transaction.service.TransactionService`'s work; this reads the request,
finds the half message and answers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from orbitmq.broker.context import BrokerContext
from orbitmq.broker.trace import TraceService
from orbitmq.broker.transaction.records import HALF_TOPIC, PROPERTY_PRODUCER_GROUP
from orbitmq.broker.transaction.service import TransactionService, check_conflict
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MessageIllegalError, TransactionNotFoundError
from orbitmq.common.record import decode
from orbitmq.common.validation import validate_group
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import EndTransactionRequest

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply

log = logging.getLogger(__name__)

DECISIONS = ("COMMIT", "ROLLBACK", "UNKNOWN")


class TransactionProcessor:
    """Reads END_TRANSACTION; ``service`` applies the decision."""

    def __init__(
        self, ctx: BrokerContext, service: TransactionService, trace: TraceService | None = None
    ) -> None:
        self.ctx = ctx
        self.service = service
        self.trace = trace
        self.system_log = ctx.log

    async def end_transaction(self, frame: Frame, conn: Connection) -> Reply:
        req = EndTransactionRequest.decode(frame)
        group = req.producer_group
        validate_group(group)
        decision = req.tran_state
        if decision not in DECISIONS:
            raise MessageIllegalError(
                f"tran_state {decision[:40]!r} is not one of {', '.join(DECISIONS)}"
            )
        offset = req.commit_log_offset
        msg_id = req.msg_id
        from_check = req.from_check
        # Only a master decides (RocketMQ answers SLAVE_NOT_AVAILABLE): a slave's transaction
        # state is stale or empty, and "not tracked" there would read as final to a producer
        # that followed a stale route. NO_PERMISSION: it asks the group's master again.
        self.ctx.replication.check_send()
        half = self.service.state.by_phys.get(offset)
        if half is None:
            return await self._end_outside_window(frame, offset, msg_id, group, decision)
        if half.msg_id != msg_id or half.group != group:
            raise TransactionNotFoundError(
                f"the half message at offset {offset} is not message {msg_id[:64]} "
                f"of producer group {group}"
            )
        if decision == "UNKNOWN":
            log.debug(
                "transaction %s of %s: state unknown (from_check=%s)", msg_id, group, from_check
            )
            return frame.reply(ResponseCode.SUCCESS, fields={"state": half.status.value})
        if decision == "COMMIT":
            await self.service.commit(half)
        else:
            await self.service.rollback(half)
        await self._replicated()
        latency = max(0, self.ctx.clock.now_ms() - half.store_ms)
        self.ctx.metrics.rmq.on_end_transaction(half.topic, decision == "COMMIT", latency)
        if self.trace is not None:
            state = "COMMIT_MESSAGE" if decision == "COMMIT" else "ROLLBACK_MESSAGE"
            self.trace.on_end_transaction(group, half.topic, msg_id, state, from_check)
        return frame.reply(ResponseCode.SUCCESS, fields={"state": half.status.value})

    async def _replicated(self) -> None:
        """Answer a decision only once it is as replicated as a send would be (sync mode: on
        every in-sync slave). The copy and the op record are appended by the decision, or were
        by an earlier one this repeats, so everything up to the log's end now is waited for.
        Answering before that let a master SIGKILLed right after the answer take the copy
        with it: the new master held the half as undecided while the producer, told
        COMMITTED, had moved on (the Spark sink then lost that half's rows). Raises
        FlushSlaveTimeoutError (FLUSH_SLAVE_TIMEOUT, outcome unknown: send the decision
        again; a repeated decision is applied once)."""
        await self.ctx.replication.wait_replicated(self.ctx.store.commit_log.max_offset)

    async def _end_outside_window(
        self, frame: Frame, offset: int, msg_id: str, group: str, decision: str
    ) -> Reply:
        """A decision for a half message the window no longer (or never) held: one decided and
        pruned answers as decided; anything else is TRANSACTION_NOT_FOUND."""
        raw = (await self.system_log.read_records([offset]))[0]
        msg = decode(raw) if raw is not None else None
        if (
            msg is None
            or msg.topic != HALF_TOPIC
            or msg.msg_id != msg_id
            or msg.properties.get(PROPERTY_PRODUCER_GROUP) != group
        ):
            raise TransactionNotFoundError(
                f"no half message {msg_id[:64]} of producer group {group} at offset {offset}"
            )
        if msg.queue_offset >= self.service.state.floor_q:
            raise TransactionNotFoundError(f"half message {msg_id[:64]} is not tracked")
        status = self.service.state.recent.get(offset)
        if status is not None and decision != "UNKNOWN":
            check_conflict(status, decision, msg_id)
        await self._replicated()
        remark = f"transaction {msg_id} was resolved earlier"
        fields = {"state": status.value if status is not None else "RESOLVED"}
        return frame.reply(ResponseCode.SUCCESS, remark, fields=fields)
