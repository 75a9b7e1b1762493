"""Fake brokers for controller tests: they apply for ids, register, heartbeat every controller
node and ask for elections, as a real broker will (docs/ha.md, "What a broker does")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, TypeVar

import msgspec

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError
from orbitmq.net.client import RemotingClient
from orbitmq.net.connection import Connection
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import (
    ApplyBrokerIdRequest,
    ElectMasterRequest,
    GetNextBrokerIdRequest,
    GetReplicaInfoRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    NextBrokerId,
    RegisterRequest,
    ReplicaInfo,
)
from orbitmq.protocol.frame import Frame

T = TypeVar("T")


class ControllerClient:
    """Finds the leader: asks any node, follows CONTROLLER_NOT_LEADER's leader_addr."""

    def __init__(self, addrs: list[str], *, name: str = "test-broker") -> None:
        self.addrs = list(addrs)
        self.leader: str | None = None
        self.notifications: list[ReplicaInfo] = []
        self.client = RemotingClient(name=name, handler=self._incoming)

    async def _incoming(self, frame: Frame, _conn: Connection) -> Frame | None:
        if frame.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            self.notifications.append(decode_body(frame.body, ReplicaInfo))
        return None

    async def once(self, addr: str, code: int, body: msgspec.Struct | None = None) -> Frame:
        frame = Frame(code, body=b"" if body is None else encode_body(body))
        return await self.client.invoke(addr, frame, timeout=3.0)

    async def call(
        self, code: int, body: msgspec.Struct | None = None, *, timeout: float = 10.0
    ) -> Frame:
        """The leader's answer (any code but NOT_LEADER and SYSTEM_BUSY); AssertionError if no
        node leads within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for addr in [a for a in (self.leader, *self.addrs) if a is not None]:
                try:
                    resp = await self.once(addr, code, body)
                except (MQError, OSError):
                    continue
                if resp.code == ResponseCode.CONTROLLER_NOT_LEADER:
                    self.leader = resp.fields.get("leader_addr") or None
                    continue
                if resp.code == ResponseCode.SYSTEM_BUSY:
                    continue
                self.leader = addr
                return resp
            await asyncio.sleep(0.1)
        raise AssertionError(f"no controller leader answered code {code} in {timeout} s")

    async def replica_info(self, broker_name: str) -> ReplicaInfo:
        resp = await self.call(
            RequestCode.CONTROLLER_GET_REPLICA_INFO, GetReplicaInfoRequest(broker_name=broker_name)
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        return decode_body(resp.body, ReplicaInfo)

    async def close(self) -> None:
        await self.client.close(1.0)


class FakeBroker:
    def __init__(
        self, controllers: list[str], broker_name: str, address: str, *, cluster: str = "c1"
    ) -> None:
        self.ctl = ControllerClient(controllers, name=f"broker-{address}")
        self.cluster = cluster
        self.broker_name = broker_name
        self.address = address
        self.broker_id = -1
        self.epoch = 0
        self.max_offset = 0
        self.beating = True
        self.leader_acks = 0
        self._task: asyncio.Task[None] | None = None

    async def join(self) -> int:
        """Apply for the next id, then register; returns the id."""
        ident: dict[str, Any] = {"cluster": self.cluster, "broker_name": self.broker_name}
        for _ in range(10):
            resp = await self.ctl.call(
                RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, GetNextBrokerIdRequest(**ident)
            )
            want = decode_body(resp.body, NextBrokerId).next_broker_id
            resp = await self.ctl.call(
                RequestCode.CONTROLLER_APPLY_BROKER_ID,
                ApplyBrokerIdRequest(
                    **ident,
                    broker_id=want,
                    address=self.address,
                    register_check_code=f"{self.address};{time.time_ns()}",
                ),
            )
            if resp.code == ResponseCode.SUCCESS:
                self.broker_id = want
                break
            assert resp.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID, resp.remark
        resp = await self.ctl.call(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterRequest(**ident, broker_id=self.broker_id, address=self.address),
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        return self.broker_id

    async def elect(self, *, designated: bool = False, broker_id: int | None = None) -> Frame:
        return await self.ctl.call(
            RequestCode.CONTROLLER_ELECT_MASTER,
            ElectMasterRequest(
                cluster=self.cluster,
                broker_name=self.broker_name,
                broker_id=self.broker_id if broker_id is None else broker_id,
                designated=designated,
            ),
        )

    def start_heartbeats(self, interval: float = 0.2) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat(interval))

    async def _beat(self, interval: float) -> None:
        while True:
            if self.beating:
                await asyncio.gather(*(self._one(a) for a in self.ctl.addrs))
            await asyncio.sleep(interval)

    async def _one(self, addr: str) -> None:
        hb = HeartbeatRequest(
            cluster=self.cluster,
            broker_name=self.broker_name,
            broker_id=self.broker_id,
            address=self.address,
            epoch=self.epoch,
            max_offset=self.max_offset,
        )
        try:
            resp = await asyncio.wait_for(self.ctl.once(addr, RequestCode.BROKER_HEARTBEAT, hb), 1)
        except (MQError, OSError, TimeoutError):
            return
        if resp.code == ResponseCode.SUCCESS:
            answer = decode_body(resp.body, HeartbeatResponse)
            self.leader_acks += answer.leader
            self.epoch = max(self.epoch, answer.master_epoch)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.ctl.close()


async def until(cond: Any, timeout: float, step: float = 0.05) -> float:
    """Wait (bounded) until ``await cond()`` is truthy; returns the seconds it took."""
    start = time.monotonic()
    while not await cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(step)
    return time.monotonic() - start
