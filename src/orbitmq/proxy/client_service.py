"""Heartbeat, Telemetry and NotifyClientTermination: the client's session with the proxy.

Telemetry is a bidirectional stream each client keeps open per endpoint for as long as it runs
(its deadline is a year). The client writes its settings on it (at start, then every 5 min); the
proxy answers each with the settings the client must apply (the server's half of the handshake:
body size limit, retry policy, long polling, FIFO) and keeps the stream open, because the stream
is also how the proxy reaches the client later: transaction check-backs are written to it. If
the proxy ended the stream, the client's reader would die on EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from google.protobuf import duration_pb2

from orbitmq.common.errors import MQError
from orbitmq.protocol.group_config import DEFAULT_RETRY_DELAYS_MS, DEFAULT_RETRY_MAX_TIMES
from orbitmq.proxy import status
from orbitmq.proxy.context import ProxyContext
from orbitmq.proxy.convert import resource_name
from orbitmq.proxy.grpc_v2 import definition_pb2 as pb
from orbitmq.proxy.grpc_v2 import service_pb2 as svc
from orbitmq.proxy.transactions import TransactionRelay

log = logging.getLogger(__name__)

Code = pb.Code
SettingsHook = Callable[[str, pb.Settings], Awaitable[None]]
GoneHook = Callable[[str, "str | None"], Awaitable[None]]
GROUP_CONFIG_TIMEOUT_S = 2.0


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class ClientRpcs:
    def __init__(
        self,
        ctx: ProxyContext,
        relay: TransactionRelay,
        on_settings: SettingsHook | None = None,
        on_gone: GoneHook | None = None,
    ) -> None:
        self.ctx = ctx
        self.relay = relay
        self.on_settings = on_settings
        self.on_gone = on_gone

    # ------------------------------------------------------------------ Heartbeat

    async def heartbeat(
        self, request: svc.HeartbeatRequest, client_id: str
    ) -> svc.HeartbeatResponse:
        if client_id:
            self.ctx.sessions.touch(client_id)
        return svc.HeartbeatResponse(status=status.ok())

    # ------------------------------------------------------------------ NotifyClientTermination

    async def notify_client_termination(
        self, request: svc.NotifyClientTerminationRequest, client_id: str
    ) -> svc.NotifyClientTerminationResponse:
        group = resource_name(request.group) if request.HasField("group") else None
        session = self.ctx.sessions.remove(client_id) if client_id else None
        if group is None and session is not None:
            group = session.group
        await self._gone(client_id, group)
        if session is not None and session.publishing_topics:
            self.relay.after_sessions_changed()
        return svc.NotifyClientTerminationResponse(status=status.ok())

    async def _gone(self, client_id: str, group: str | None) -> None:
        if self.on_gone is None or not client_id:
            return
        try:
            await self.on_gone(client_id, group)
        except Exception:  # one client's cleanup must not fail the call
            log.exception("cleanup after client %s failed", client_id)

    # ------------------------------------------------------------------ Telemetry

    async def telemetry(
        self, requests: AsyncIterator[svc.TelemetryCommand], client_id: str
    ) -> AsyncIterator[svc.TelemetryCommand]:
        """Serve one Telemetry stream: answers settings, relays server commands."""
        if not client_id:
            yield svc.TelemetryCommand(
                status=status.make(Code.CLIENT_ID_REQUIRED, "x-mq-client-id header is missing")
            )
            return
        stream = self.ctx.sessions.open_stream(client_id)
        reader = asyncio.get_running_loop().create_task(
            self._read(requests, stream.outbox, client_id)
        )
        try:
            while True:
                cmd = await stream.outbox.get()
                if cmd is None:
                    break
                yield cmd
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.ctx.sessions.close_stream(stream)
            session = self.ctx.sessions.get(client_id)
            if session is not None and not session.streams:
                await self._gone(client_id, session.group)
                if session.publishing_topics:
                    self.relay.after_sessions_changed()

    async def _read(
        self,
        requests: AsyncIterator[svc.TelemetryCommand],
        outbox: asyncio.Queue[svc.TelemetryCommand | None],
        client_id: str,
    ) -> None:
        try:
            async for cmd in requests:
                reply = await self._handle(cmd, client_id)
                if reply is not None:
                    await outbox.put(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken client stream ends only this stream
            log.info("telemetry stream of %s ended: %s", client_id, exc)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(None)

    async def _handle(
        self, cmd: svc.TelemetryCommand, client_id: str
    ) -> svc.TelemetryCommand | None:
        which = cmd.WhichOneof("command")
        if which == "settings":
            session = self.ctx.sessions.touch(client_id)
            before = session.publishing_topics
            session.settings = cmd.settings
            reply = await self.server_settings(cmd.settings)
            if session.publishing_topics - before:
                self.relay.after_sessions_changed()
            if self.on_settings is not None and cmd.settings.HasField("subscription"):
                try:
                    await self.on_settings(client_id, reply)
                except Exception:
                    log.exception("consumer settings hook failed for %s", client_id)
            # The reply is the client's settings completed by the server's: what it applies.
            session.settings = reply
            return svc.TelemetryCommand(status=status.ok(), settings=reply)
        # Answers to commands the proxy never sends (thread stack traces, verify results): ignored.
        self.ctx.sessions.touch(client_id)
        return None

    async def server_settings(self, client: pb.Settings) -> pb.Settings:
        """The settings the client must apply: its own, completed with the server's policy."""
        cfg = self.ctx.config
        out = pb.Settings()
        out.CopyFrom(client)
        out.metric.CopyFrom(pb.Metric(on=False))
        if client.HasField("subscription"):
            await self._consumer_settings(out)
        else:
            out.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=cfg.send_max_attempts,
                    exponential_backoff=pb.ExponentialBackoff(
                        initial=_duration(0.01), max=_duration(1.0), multiplier=2.0
                    ),
                )
            )
            out.publishing.max_body_size = cfg.max_message_size
            out.publishing.validate_message_type = True
        return out

    async def _consumer_settings(self, out: pb.Settings) -> None:
        cfg = self.ctx.config
        sub = out.subscription
        retry_max, delays_ms, fifo = DEFAULT_RETRY_MAX_TIMES, list(DEFAULT_RETRY_DELAYS_MS), False
        if sub.HasField("group") and sub.group.name:
            group = resource_name(sub.group)
            try:
                async with asyncio.timeout(GROUP_CONFIG_TIMEOUT_S):
                    gc = await self.ctx.admin.get_group_config(group)
                retry_max, fifo = gc.retry_max_times, gc.fifo
                # Pop consumers back off by the group's Pop delays when it has its own.
                delays_ms = list(gc.pop_retry_delays_ms or gc.retry_delays_ms)
            except (MQError, TimeoutError) as exc:
                log.debug("group config of %s unavailable, defaults apply: %s", group, exc)
        if not fifo:
            for entry in sub.subscriptions:
                kind = self.ctx.topic_types.cached(resource_name(entry.topic))
                if kind is None:
                    try:
                        kind = await self.ctx.topic_types.get(resource_name(entry.topic))
                    except MQError:
                        continue
                if kind == "FIFO":
                    fifo = True
                    break
        sub.fifo = fifo
        if not sub.HasField("long_polling_timeout") or sub.long_polling_timeout.seconds <= 0:
            sub.long_polling_timeout.CopyFrom(_duration(cfg.long_polling_default_s))
        sub.receive_batch_size = cfg.receive_batch_max
        out.backoff_policy.CopyFrom(
            pb.RetryPolicy(
                max_attempts=retry_max + 1,
                customized_backoff=pb.CustomizedBackoff(
                    next=[_duration(ms / 1000) for ms in delays_ms or [1000]]
                ),
            )
        )
