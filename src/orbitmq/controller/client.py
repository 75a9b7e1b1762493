"""ControllerClient: talk to a controller group without knowing which node leads (for admin
tools: ``orbitmq broker elect``, ``orbitmq cluster describe``).

It asks the node it last found leading, then the others in order; a ``CONTROLLER_NOT_LEADER``
answer's ``leader_addr`` is tried next. Unreachable nodes and ``SYSTEM_BUSY`` (a commit that did
not come in time, or a node still starting) move on to the next node, with a short pause after a
full round, until ``timeout``. Any other answer is returned (or raised as its error class).

It depends on net and protocol only. Brokers sit in a sibling layer and cannot import it; the
broker side of HA will carry its own copy of this loop (or this module moves down a layer).
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import MQError, RequestTimeoutError, error_for
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import decode_body, encode_body
from orbitmq.protocol.codes import RequestCode
from orbitmq.protocol.controller import (
    ControllerMetadata,
    ElectMasterRequest,
    GetReplicaInfoRequest,
    ReplicaInfo,
)
from orbitmq.protocol.frame import Frame
from orbitmq.protocol.signature import Signer

_NEXT_NODE = frozenset({ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.SYSTEM_BUSY})


class ControllerClient:
    def __init__(
        self,
        addrs: list[str],
        *,
        timeout: float = 10.0,
        request_timeout: float = 3.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        """``access_key``/``secret_key``: the user every request is signed as (a controller
        with auth on refuses unsigned requests)."""
        if not addrs:
            raise ValueError("at least one controller address is needed")
        self.addrs = list(addrs)
        self.timeout = timeout
        self.request_timeout = request_timeout
        self.leader: str | None = None
        """The node that answered last (the leader, as far as this client knows)."""
        self.remoting = RemotingClient(
            name="controller-client",
            signer=None if access_key is None else Signer(access_key, secret_key or ""),
        )

    async def once(self, addr: str, code: int, body: msgspec.Struct | None = None) -> Frame:
        """One request to one node, whatever its answer."""
        frame = Frame(code, body=b"" if body is None else encode_body(body))
        return await self.remoting.invoke(addr, frame, timeout=self.request_timeout)

    async def call(self, code: int, body: msgspec.Struct | None = None) -> Frame:
        """The leader's answer (any code but NOT_LEADER and SYSTEM_BUSY). RequestTimeoutError
        when no node gives one within ``timeout``."""
        deadline = time.monotonic() + self.timeout
        last = "no controller answered"
        while True:
            order = [self.leader, *self.addrs] if self.leader else list(self.addrs)
            tried: set[str] = set()
            while order:
                addr = order.pop(0)
                if addr is None or addr in tried:
                    continue
                tried.add(addr)
                try:
                    resp = await self.once(addr, code, body)
                except (MQError, OSError) as exc:
                    last = f"{addr}: {exc}"
                    continue
                if resp.code not in _NEXT_NODE:
                    self.leader = addr
                    return resp
                last = f"{addr}: {resp.remark}"
                hint = resp.fields.get("leader_addr")
                if isinstance(hint, str) and hint not in tried:
                    order.insert(0, hint)
            self.leader = None
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(f"no controller leader answered code {code}: {last}")
            await asyncio.sleep(0.2)

    async def ok(self, code: int, body: msgspec.Struct | None = None) -> Frame:
        """``call``, raising the answer's error class unless it is SUCCESS."""
        resp = await self.call(code, body)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return resp

    async def replica_info(self, broker_name: str) -> ReplicaInfo:
        resp = await self.ok(
            RequestCode.CONTROLLER_GET_REPLICA_INFO, GetReplicaInfoRequest(broker_name=broker_name)
        )
        return decode_body(memoryview(resp.body), ReplicaInfo)

    async def elect(
        self, cluster: str, broker_name: str, designated: int | None = None
    ) -> ReplicaInfo:
        """Manual failover: elect ``designated`` (or let the policy choose when None)."""
        request = ElectMasterRequest(
            cluster=cluster,
            broker_name=broker_name,
            broker_id=-1 if designated is None else designated,
            designated=designated is not None,
        )
        resp = await self.ok(RequestCode.CONTROLLER_ELECT_MASTER, request)
        return decode_body(memoryview(resp.body), ReplicaInfo)

    async def metadata(self, addr: str) -> ControllerMetadata:
        """One node's view of the group (answered by followers too)."""
        resp = await self.once(addr, RequestCode.CONTROLLER_GET_METADATA_INFO)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return decode_body(memoryview(resp.body), ControllerMetadata)

    async def close(self) -> None:
        await self.remoting.close(1.0)
