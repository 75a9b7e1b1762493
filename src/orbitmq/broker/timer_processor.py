"""TimerProcessor: the request a client sends about a delayed message (RECALL_MESSAGE).

The answer's work (find the copy, store a cancel marker, drop the timer) is the
:class:`~orbitmq.broker.timer_service.TimerService`'s, which owns the pending timers; this only
reads the request and answers it (docs/timers.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbitmq.broker.timer_service import TimerService
from orbitmq.broker.trace import TraceService
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import RecallMessageRequest

if TYPE_CHECKING:
    from orbitmq.net.connection import Connection, Reply


class TimerProcessor:
    """Reads RECALL_MESSAGE; ``timer`` drops the pending copies; ``trace`` (when tracing)
    records each recall, done or refused, as a RocketMQ ``Recall`` trace record."""

    def __init__(self, timer: TimerService, trace: TraceService | None = None) -> None:
        self.timer = timer
        self.trace = trace

    async def recall(self, frame: Frame, conn: Connection) -> Reply:
        """RECALL_MESSAGE (topic, msg_id): cancel a delayed message before it is due."""
        req = RecallMessageRequest.decode(frame)  # msg_id: 1 to MAX_MSG_ID_LENGTH characters
        trace = self.trace if self.trace is not None and self.trace.enabled else None
        try:
            removed = await self.timer.recall(req.topic, req.msg_id)
        except MQError:
            if trace is not None:
                trace.on_recall(req.producer_group or "", req.topic, req.msg_id, False)
            raise
        if trace is not None:
            trace.on_recall(req.producer_group or "", req.topic, req.msg_id, True)
        return frame.reply(ResponseCode.SUCCESS, fields={"recalled": removed})
