"""The admin client's plumbing: connections, the route cache, one request to one broker or
to every master, and the decoding helpers every admin operation shares."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any, Self, TypeVar

import msgspec

from orbitmq.client import _codec
from orbitmq.client._settings import resolve_config, signer_of
from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.route import (
    MessageQueue,
    TopicPublishInfo,
    TopicRouteCache,
)
from orbitmq.common.codes import ResponseCode
from orbitmq.common.errors import (
    ClientError,
    MQError,
    ProtocolError,
    SubscriptionGroupNotExistError,
    error_for,
)
from orbitmq.common.record import StoredMessage
from orbitmq.net.client import RemotingClient
from orbitmq.protocol.bodies import (
    ClusterInfo,
    decode_body,
)
from orbitmq.protocol.frame import Buffer, Frame
from orbitmq.protocol.header import Header
from orbitmq.protocol.messages import decode_records

log = logging.getLogger(__name__)

__all__ = ["AdminBase"]

_T = TypeVar("_T")
_END_OF_TIME_MS = (1 << 63) - 1


class AdminBase:
    """Administration over the Remoting protocol. ``async with AsyncAdminClient(addrs) as admin:``."""

    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        config: AdminConfig | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **overrides: Any,
    ) -> None:
        self.config = cfg = resolve_config(AdminConfig, config, overrides, "AdminClient")
        self.timeout_s = cfg.timeout_s
        self.remoting = RemotingClient(
            connect_timeout=cfg.connect_timeout_s,
            ssl_context=ssl_context,
            name="admin",
            signer=signer_of(cfg),
        )
        self.routes = TopicRouteCache(
            namesrv_addrs,
            self.remoting,
            timeout_s=cfg.timeout_s,
            refresh_interval_s=0,  # admin asks afresh where it matters
            auto_create_fallback=False,
        )
        self._closed = False

    async def start(self) -> Self:
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.routes.close()
        await self.remoting.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ plumbing

    async def _call(
        self,
        addr: str,
        header: Header,
        body: Buffer = b"",
        *,
        ok: frozenset[int] = frozenset({ResponseCode.SUCCESS}),
        timeout_s: float | None = None,
    ) -> Frame:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            resp = await self.remoting.invoke(addr, header.frame(body), timeout)
            if resp.code not in ok:
                raise error_for(resp.code, resp.remark)
        except MQError as exc:
            self.routes.master_failed(addr, exc)  # a lost master: re-read its group's routes
            raise
        return resp

    async def _namesrv(self, header: Header) -> Frame:
        resp = await self.routes.request(header)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for(resp.code, resp.remark)
        return resp

    async def _info(self, topic: str, *, fresh: bool = False) -> TopicPublishInfo:
        return await (self.routes.refresh(topic) if fresh else self.routes.get(topic))

    async def _addr_of(self, mq: MessageQueue) -> str:
        info = await self._info(mq.topic)
        # The freshest route naming the group: another topic's re-read may know a new master.
        addr = self.routes.master_addr(mq.broker_name) or info.broker_addrs.get(mq.broker_name)
        if addr is None:
            info = await self._info(mq.topic, fresh=True)
            addr = info.broker_addrs.get(mq.broker_name)
        if addr is None:
            raise ClientError(f"no master of broker {mq.broker_name!r} holds {mq.topic!r}")
        return addr

    async def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: brokers by name and cluster."""
        return await self.routes.cluster_info()

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address, of ``cluster`` (None: the only cluster there is)."""
        info = await self.cluster_info()
        clusters = info.cluster_addr_table
        if cluster is None:
            if not clusters:
                raise ClientError("no broker is registered with the NameServers")
            if len(clusters) > 1:
                raise ClientError(f"several clusters ({', '.join(sorted(clusters))}): name one")
            cluster = next(iter(clusters))
        if cluster not in clusters:
            raise ClientError(f"no cluster {cluster!r} (known: {', '.join(sorted(clusters))})")
        out: dict[str, str] = {}
        for name in clusters[cluster]:
            bd = info.broker_addr_table.get(name)
            master = bd.master_addr() if bd is not None else None
            if master:
                out[name] = master
        return out

    async def _all_masters(self) -> dict[str, str]:
        """broker name -> master address, over every cluster the NameServers know."""
        info = await self.cluster_info()
        out: dict[str, str] = {}
        for name, bd in info.broker_addr_table.items():
            master = bd.master_addr()
            if master:
                out[name] = master
        if not out:
            raise ClientError("no master broker is registered with the NameServers")
        return out

    async def _each_master(
        self, header: Header, *, ok: frozenset[int] = frozenset()
    ) -> dict[str, Frame | MQError]:
        """The same request to every master, concurrently: broker name -> answer or error.

        A non-SUCCESS answer whose code is in ``ok`` comes back as the Frame; other error
        answers as RemoteError (so callers can tell "unknown group" from "unreachable").
        """
        masters = await self._all_masters()
        names = sorted(masters)
        accept = ok | {ResponseCode.SUCCESS}
        results = await asyncio.gather(
            *(self._call(masters[n], header, ok=accept) for n in names),
            return_exceptions=True,
        )
        out: dict[str, Frame | MQError] = {}
        for name, res in zip(names, results, strict=True):
            if isinstance(res, (Frame, MQError)):
                out[name] = res
            else:
                raise res
        return out

    async def _masters_of(self, cluster: str | None) -> dict[str, str]:
        return await (self.masters(cluster) if cluster is not None else self._all_masters())

    async def _each_broker(
        self, info: TopicPublishInfo, header: Header
    ) -> list[list[StoredMessage]]:
        addrs = [info.broker_addrs[n] for n in sorted(info.broker_addrs)]
        ok = frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND})
        results = await asyncio.gather(
            *(self._call(a, header, ok=ok) for a in addrs), return_exceptions=True
        )
        out: list[list[StoredMessage]] = []
        errors: list[str] = []
        for addr, res in zip(addrs, results, strict=True):
            if isinstance(res, MQError):
                errors.append(f"{addr}: {res}")
            elif isinstance(res, BaseException):
                raise res
            else:
                out.append(_records(res))
        if errors and not any(out):
            raise ClientError("no broker answered: " + "; ".join(errors))
        for err in errors:
            log.warning("lookup on broker %s", err)
        return out


def _unknown_group(group: str) -> SubscriptionGroupNotExistError:
    return SubscriptionGroupNotExistError(
        f"consumer group {group!r} is unknown to every broker (no member online, no offsets)"
    )


def _records(resp: Frame) -> list[StoredMessage]:
    if resp.code != ResponseCode.SUCCESS or not resp.body:
        return []
    return [_codec.plain(m) for m in decode_records(memoryview(resp.body))]


def _int_field(resp: Frame, name: str, default: int | None = None) -> int:
    value = resp.fields.get(name, default)
    if value is None:
        raise ProtocolError(f"response lacks field {name!r}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"response field {name!r} is not an integer: {value!r}") from exc


def _decode(body: Buffer, typ: type[_T]) -> _T:
    try:
        return decode_body(bytes(body) if isinstance(body, bytearray) else body, typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {typ.__name__} body: {exc}") from exc


async def _all_or_raise(calls: dict[str, Coroutine[Any, Any, Any]], what: str) -> None:
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    failures = [
        f"{addr}: {res}"
        for addr, res in zip(calls, results, strict=True)
        if isinstance(res, BaseException)
    ]
    if failures:
        raise ClientError(f"{what} failed on " + "; ".join(failures))
