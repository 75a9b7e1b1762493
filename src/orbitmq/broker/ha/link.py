"""One end of an HA link: the sans-IO codec of :mod:`orbitmq.protocol.ha` over asyncio streams.

Why a small class of its own: both ends read frames with the same dead-link timeout and write
them the same way (TRANSFER payloads handed to the transport without a copy, then drained so a
slow slave pushes back on its master's sender instead of growing its buffer).
"""

from __future__ import annotations

import asyncio
from collections import deque

from orbitmq.common.errors import ProtocolError
from orbitmq.protocol.ha import HaDecoder, HaFrame, encode_parts


class LinkClosedError(Exception):
    """The peer closed the link, or sent nothing for the link timeout."""


class Link:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout_s = timeout_s
        self._decoder = HaDecoder()
        self._frames: deque[HaFrame] = deque()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def recv(self) -> HaFrame:
        """The next frame; LinkClosedError on EOF or after ``timeout_s`` of silence,
        ProtocolError on bad bytes (the caller closes the link)."""
        while not self._frames:
            try:
                async with asyncio.timeout(self.timeout_s):
                    data = await self.reader.read(256 * 1024)
            except TimeoutError:
                raise LinkClosedError(
                    f"no frame from {self.peer} for {self.timeout_s:.0f}s"
                ) from None
            except OSError as exc:
                raise LinkClosedError(f"{self.peer}: {exc}") from None
            if not data:
                raise LinkClosedError(f"{self.peer} closed the link")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.popleft()

    async def send(self, frame: HaFrame) -> None:
        if self.writer.is_closing():
            raise LinkClosedError(f"link to {self.peer} is closed")
        try:
            self.writer.writelines(encode_parts(frame))
            await self.writer.drain()
        except (OSError, RuntimeError) as exc:
            raise LinkClosedError(f"{self.peer}: {exc}") from None

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
        except asyncio.CancelledError:
            # A TLS close waits a round trip (close_notify): a stop that cancels this task
            # lands here and must not be swallowed, or the task outlives its stop.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise


__all__ = ["Link", "LinkClosedError", "ProtocolError"]
