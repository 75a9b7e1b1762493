"""Recall (cancel) a delayed or timer message before it is due (docs/timers.md).

    result = await producer.send(Message("T", b"x").set_delay_ms(60_000))
    await recall_message(admin, "T", result.msg_id, broker_name=result.message_queue.broker_name)

The delayed copy lives on the broker that stored the send, so naming that broker (from the
SendResult) asks only it; without a name every broker of the topic is asked.
"""

from __future__ import annotations

import asyncio

from orbitmq.client.admin.client import AsyncAdminClient
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import ClientError, MQError, RemoteError, error_for
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.requests import RecallMessageRequest

_MISSES = (ResponseCode.TIMER_MESSAGE_NOT_FOUND, ResponseCode.TIMER_MESSAGE_NOT_PENDING)


async def recall_message(
    admin: AsyncAdminClient,
    topic: str,
    msg_id: str,
    *,
    broker_name: str | None = None,
    producer_group: str | None = None,
) -> str:
    """RECALL_MESSAGE: the message is not delivered. Returns the broker that held it.

    Raises RemoteError with TIMER_MESSAGE_NOT_PENDING when it was delivered (or recalled)
    already, TIMER_MESSAGE_NOT_FOUND when no broker asked knows it. ``producer_group``
    goes into the broker's Recall trace record.
    """
    info = await admin.routes.refresh(topic)
    names = sorted(info.broker_addrs) if broker_name is None else [broker_name]
    if broker_name is not None and broker_name not in info.broker_addrs:
        raise ClientError(f"broker {broker_name!r} serves no queue of {topic!r}")
    header = RecallMessageRequest(topic=topic, msg_id=msg_id, producer_group=producer_group)

    async def one(name: str) -> Frame:
        frame = header.frame()
        return await admin.remoting.invoke(info.broker_addrs[name], frame, admin.timeout_s)

    answers = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
    misses: list[RemoteError] = []
    failures: list[str] = []
    for name, resp in zip(names, answers, strict=True):
        if isinstance(resp, MQError):
            failures.append(f"{name}: {resp}")
        elif isinstance(resp, BaseException):
            raise resp
        elif resp.code == ResponseCode.SUCCESS:
            return name
        elif resp.code in _MISSES:
            misses.append(error_for(resp.code, resp.remark))
        else:
            raise error_for(resp.code, resp.remark)
    if failures and not misses:
        raise ClientError("no broker answered the recall: " + "; ".join(failures))
    misses.sort(key=lambda e: e.code != ResponseCode.TIMER_MESSAGE_NOT_PENDING)
    raise misses[0]
