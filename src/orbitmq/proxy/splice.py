"""Kernel splicing of two sockets, for the proxy's front port (:class:`orbitmq.proxy.tls.PortMux`).

The front port only decides where a connection goes (its first byte: TLS or plaintext); after
that it carries every byte both ways unchanged. Done with asyncio Protocols, each chunk is
read into a Python ``bytes``, handed to the other transport and copied again into the kernel:
two copies and a few Python objects per chunk, in the one thread that also runs gRPC's
callbacks. Here each direction is ``socket -> pipe -> socket`` with ``os.splice``: the bytes
stay in the kernel (page references move, nothing is copied to user space), and Python only
runs one callback per readiness event, which moves up to a pipe's capacity (1 MiB asked).

Back-pressure: a direction stops reading its source while the pipe cannot be emptied into
its destination (destination full), and resumes when the destination is writable. End of
stream: a source's EOF becomes a ``shutdown(SHUT_WR)`` of the destination once the pipe is
empty; the splice is over when both directions ended, or at once when either fails (reset).

Linux only (``os.splice``); :data:`AVAILABLE` says whether it can be used here. Needs a loop
with ``add_reader``/``add_writer`` (asyncio's selector loops and uvloop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["AVAILABLE", "Splice"]

AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "splice")
"""os.splice exists here (Linux, Python 3.10+)."""
CHUNK = 1 << 20
"""Bytes asked of one splice call (a pipe holds what its size allows, 1 MiB asked)."""
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named in fcntl from Python 3.10 on Linux only)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


class _Pump:
    """One direction: ``src`` -> pipe -> ``dst``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        src: socket.socket,
        dst: socket.socket,
        done: Callable[[_Pump, bool], None],
    ) -> None:
        self.loop, self.src, self.dst, self.done = loop, src, dst, done
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # fewer passes; the default 64 KiB also works
            import fcntl

            fcntl.fcntl(self.w, _F_SETPIPE_SZ, CHUNK)
        self.buffered = 0
        self.eof = False
        self.reading = self.writing = self.over = False
        self.moved = 0

    def start(self) -> None:
        self._read_on()

    def _read_on(self) -> None:
        if not self.reading:
            self.loop.add_reader(self.src.fileno(), self._readable)
            self.reading = True

    def _read_off(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.src.fileno())
            self.reading = False

    def _readable(self) -> None:
        try:
            n = os.splice(self.src.fileno(), self.w, CHUNK, flags=_FLAGS)
        except BlockingIOError:
            return
        except OSError:
            self.stop(failed=True)
            return
        if n == 0:
            self.eof = True
            self._read_off()
        self.buffered += n
        self._flush()

    def _writable(self) -> None:
        self._flush()

    def _flush(self) -> None:
        while self.buffered:
            try:
                n = os.splice(self.r, self.dst.fileno(), self.buffered, flags=_FLAGS)
            except BlockingIOError:  # the destination is full: wait, and read no more
                self._read_off()
                if not self.writing:
                    self.loop.add_writer(self.dst.fileno(), self._writable)
                    self.writing = True
                return
            except OSError:
                self.stop(failed=True)
                return
            self.buffered -= n
            self.moved += n
        if self.writing:
            self.loop.remove_writer(self.dst.fileno())
            self.writing = False
        if self.eof:
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)
            self.stop(failed=False)
        else:
            self._read_on()

    def stop(self, failed: bool) -> None:
        if self.over:
            return
        self.over = True
        self._read_off()
        if self.writing:
            self.loop.remove_writer(self.dst.fileno())
            self.writing = False
        os.close(self.r)
        os.close(self.w)
        self.done(self, failed)


class Splice:
    """Two sockets joined both ways until both ends are done (``on_close`` runs once, then;
    the sockets are closed). The sockets must be non-blocking and owned by the splice."""

    def __init__(
        self,
        a: socket.socket,
        b: socket.socket,
        on_close: Callable[[], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.socks = (a, b)
        self.on_close = on_close
        self.closed = False
        self.pumps = [_Pump(self.loop, a, b, self._ended), _Pump(self.loop, b, a, self._ended)]
        for pump in self.pumps:
            pump.start()

    @property
    def moved(self) -> int:
        """Bytes carried so far, both ways."""
        return sum(p.moved for p in self.pumps)

    def _ended(self, pump: _Pump, failed: bool) -> None:
        if failed or all(p.over for p in self.pumps):
            self.close()

    def close(self) -> None:
        """End both directions now and close both sockets."""
        if self.closed:
            return
        self.closed = True
        for pump in self.pumps:
            pump.stop(failed=False)
        for sock in self.socks:
            sock.close()
        try:
            self.on_close()
        except Exception:  # the caller's bookkeeping must not leave the sockets half-done
            log.exception("proxy: splice close callback failed")
