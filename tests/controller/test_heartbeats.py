"""In-memory broker liveness."""

from __future__ import annotations

from orbitmq.common.clock import ManualClock
from orbitmq.controller.heartbeats import Heartbeats


def test_liveness_expires_and_comes_back() -> None:
    clock = ManualClock()
    hb = Heartbeats(2.5, clock=clock)
    hb.beat("g", 1, "h:1", epoch=3, max_offset=10, priority=4)
    hb.beat("g", 2, "h:2", epoch=2)
    assert hb.alive_ids("g") == [1, 2]
    assert hb.candidates("g") == {1: (3, 10, 4), 2: (2, 0, 2**31 - 1)}
    clock.advance(2000)
    hb.beat("g", 2, "h:2", epoch=2)
    clock.advance(600)
    assert hb.alive_ids("g") == [2]
    assert hb.expire() == [("g", 1)]
    assert hb.expire() == []  # reported once
    assert hb.last_seen("g", 1) == 0.0 and hb.last_seen("g", 2) == 2.0
    hb.beat("g", 1, "h:1", epoch=1)
    assert hb.alive("g", 1)


def test_a_closed_channel_kills_at_once_but_keeps_the_last_heartbeat_time() -> None:
    clock = ManualClock()
    hb = Heartbeats(2.5, clock=clock)
    chan = object()
    hb.beat("g", 1, "h:1", channel=chan)
    clock.advance(100)
    assert hb.channel_closed(chan) == [("g", 1)]
    assert not hb.alive("g", 1)
    assert hb.last_seen("g", 1) == 0.0
    assert hb.channels("g") == []


def test_the_epoch_floor_never_goes_down() -> None:
    hb = Heartbeats(1.0, clock=ManualClock())
    hb.beat("g", 1, "h:1", epoch=5)
    hb.beat("g", 2, "h:2", epoch=3)
    hb.beat("g", 1, "h:1", epoch=0)  # a broker that lost its epoch file
    assert hb.epoch_floor("g") == 5
    assert hb.epoch_floor("other") == 0


def test_a_broker_never_heard_of_was_last_seen_when_the_node_started() -> None:
    clock = ManualClock()
    clock.advance(5000)
    hb = Heartbeats(1.0, clock=clock)
    assert hb.last_seen("g", 1) == 5.0
    assert not hb.alive("g", 1)
