"""RaftNode: the pysyncobj object that carries the controller's state, with asyncio glue.

pysyncobj runs its own tick thread (every 50 ms): it sends and receives Raft messages, applies
committed commands to `ControllerState` and calls command callbacks, all on that thread. The
asyncio side never blocks on it: `submit` appends a command and returns a future that the
callback completes through ``loop.call_soon_threadsafe`` (pysyncobj's ``sync=True`` would block
the event loop for a whole commit).

The settings are the brief's (section 3), each overriding a pysyncobj default that is wrong here:

- ``leaderFallbackTimeout`` ~1.5 s instead of 30 s: a leader cut off from the majority stops
  acting as leader quickly (and the election delay adds this time, see `election`);
- ``commandsWaitLeader=False``: with no leader a command fails at once (MISSING_LEADER) instead
  of queueing silently;
- ``useFork=False``: the dump is written in the tick thread, not by fork() of a threaded
  process;
- ``journalFile`` and ``fullDumpFile`` in the data dir: a killed node restarts with its log and
  its persisted term and vote (0.3.17), so it never votes twice in a term;
- static membership (``dynamicMembershipChange`` stays off).

Durability gap (pysyncobj #84): the journal is an mmap that is never msync'd and the meta file
is not fsynced. A process crash loses nothing (the page cache survives); a power cut of a
majority can lose committed entries. The epoch floor (`election.next_epoch`) bounds the damage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf

from orbitmq.common.clock import SYSTEM_CLOCK, Clock
from orbitmq.controller.state import ControllerState, Outcome

log = logging.getLogger(__name__)

_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER

FAIL_NAMES = {
    FAIL_REASON.QUEUE_FULL: "QUEUE_FULL",
    FAIL_REASON.MISSING_LEADER: "MISSING_LEADER",
    FAIL_REASON.DISCARDED: "DISCARDED",
    FAIL_REASON.NOT_LEADER: "NOT_LEADER",
    FAIL_REASON.LEADER_CHANGED: "LEADER_CHANGED",
    FAIL_REASON.REQUEST_DENIED: "REQUEST_DENIED",
    FAIL_REASON.UNKNOWN_OUTCOME: "UNKNOWN_OUTCOME",
}
LEADERSHIP_LOST = frozenset(
    {
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
    }
)
"""Failures that mean "not applied, and this node is not (or no longer) the leader"."""


class CommandFailed(Exception):
    """A command did not commit: ``reason`` is pysyncobj's FAIL_REASON."""

    def __init__(self, reason: int) -> None:
        super().__init__(FAIL_NAMES.get(reason, str(reason)))
        self.reason = reason

    @property
    def leadership_lost(self) -> bool:
        return self.reason in LEADERSHIP_LOST


class RaftNode:
    def __init__(
        self,
        raft_address: str,
        other_raft_addresses: list[str],
        data_dir: str,
        *,
        leader_fallback_s: float = 1.5,
        secret: str | None = None,
        auto_tick: bool = True,
        state: ControllerState | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.state = state if state is not None else ControllerState()
        self.clock = clock
        self.leader_since: float | None = None
        """Monotonic time this node last became leader (None: not leader)."""
        self.conf = SyncObjConf(
            autoTick=auto_tick,
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.dump"),
            leaderFallbackTimeout=leader_fallback_s,
            commandsWaitLeader=False,
            useFork=False,
            dynamicMembershipChange=False,
            password=secret,
            onStateChanged=self._state_changed,
        )
        self.raft_address = raft_address
        self.sync = SyncObj(raft_address, other_raft_addresses, self.conf, consumers=[self.state])

    def _state_changed(self, old: int, new: int) -> None:
        # Tick thread. A float assignment is atomic; the loop only reads it.
        self.leader_since = self.clock.monotonic() if new == _LEADER else None
        log.info("controller Raft %s: %s", self.raft_address, "leader" if new == _LEADER else new)

    # ------------------------------------------------------------------ status (any thread)

    def is_leader(self) -> bool:
        """Whether this node believes it leads. For routing requests only: a deposed leader
        believes it for up to leaderFallbackTimeout, so no decision rests on this alone."""
        return bool(self.sync._isLeader())

    def leader(self) -> str | None:
        """The Raft address of the last known leader."""
        node = self.sync._getLeader()
        return None if node is None else str(node.id)

    @property
    def term(self) -> int:
        return int(self.sync.raftCurrentTerm)

    def tick(self, timeout: float = 0.0) -> None:
        """One manual tick (tests built with ``auto_tick=False``)."""
        self.sync.doTick(timeout)

    # ------------------------------------------------------------------ commands

    def submit_callback(
        self, name: str, args: tuple[Any, ...], callback: Callable[[Any, int], None]
    ) -> None:
        """Append command ``name`` to the log; ``callback(result, fail_reason)`` runs on the tick
        thread once it is applied here (or fails)."""
        getattr(self.state, name)(*args, callback=callback)

    def submit(self, name: str, *args: Any) -> asyncio.Future[Outcome]:
        """Append a command; the future ends with its Outcome, or CommandFailed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()

        def settle(result: Any, err: int) -> None:
            if fut.done():  # timed out and cancelled by the caller
                return
            if err == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            else:
                fut.set_exception(CommandFailed(err))

        def on_done(result: Any, err: int) -> None:
            # RuntimeError: the loop closed while the command was in flight.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, result, err)

        self.submit_callback(name, args, on_done)
        return fut

    def destroy(self) -> None:
        """Stop the tick thread and close the Raft connections (blocks until it has stopped
        when auto-ticking: call from a worker thread)."""
        if self.conf.autoTick:
            self.sync.destroy_synchronous()
        else:
            self.sync.destroy()
