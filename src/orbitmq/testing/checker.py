"""An OpenChaos-style history checker: what a fault test sent, what the queues hold afterwards,
and what went wrong between the two.

A fault test (a broker SIGKILL, a partition, a power cut) records every send in a
:class:`History` while the faults happen: who sent it (``client``), its sequence number
(``seq``, unique per client), its topic, an optional order ``key`` (set for queue-selector or
FIFO sends, whose order is promised), the outcome and, for an acknowledged send, where the broker
put it (broker name, queue id, queue offset, message id) and when. :meth:`History.fault` marks
the moment each fault was injected. Afterwards :func:`read_back` drains every queue of the
topics from its first offset through the NameServers' routes (the real admin client, so the
route the test reads is the one clients would use), and :func:`check` compares the two.
A NameServer learns a new master only at that master's next registration, so right after a
failover one may still route a group with no master: the read-back re-reads the route (for a
bounded time) until every group holding the topic has one, and a group that never gets one is a
*gap* in the report, never an empty read that looks like "nothing was stored".

- **lost**: acknowledged ``SEND_OK`` and not found anywhere (must be 0 in ``sync`` mode);
- **misplaced**: found, but not at the queue and offset its acknowledgement named (an offset
  reused after a failover: RocketMQ #7689);
- **duplicates**: one (client, seq) found more than once (a retry after an unknown outcome, or
  a redelivery); counted, each with where the copies are;
- **order violations**: for sends with a ``key``, the acknowledged ones of one (client, key), in
  ``seq`` order, must sit on one queue at increasing offsets (OpenChaos' "acknowledged sends
  are a subsequence of the dequeues");
- **phantoms**: messages carrying a checker identity that no recorded send has (corruption, or
  a history that missed a send);
- **recovery time** per fault: from the fault to the first acknowledgement of a send *issued*
  at or after it (so an ack a partitioned old master gives to a send already on the wire does
  not count as recovery), None when no such send was acknowledged.

The identity travels in two message properties (:data:`CLIENT_PROPERTY`, :data:`SEQ_PROPERTY`,
set by :func:`stamp`); a body starting ``<client>:<seq>:`` is understood too, for tests that
write raw frames. Outcomes other than ``SEND_OK`` (an exception, or a "stored less safely" status
such as FLUSH_SLAVE_TIMEOUT) are *unknown*: the message may or may not be there, and either is
correct. Histories can be written and read as JSON lines (OpenChaos writes TSV with the same
fields) so a producer in another process, or another network namespace, can keep its own.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orbitmq.client.producer.types import SendResult, SendStatus
from orbitmq.client.route import MessageQueue, TopicPublishInfo
from orbitmq.common.message import Message
from orbitmq.common.record import StoredMessage
from orbitmq.protocol.bodies import PERM_READ, TopicRouteData

__all__ = [
    "CLIENT_PROPERTY",
    "SEQ_PROPERTY",
    "Delivered",
    "Fault",
    "History",
    "Outcome",
    "Report",
    "SendRecord",
    "check",
    "identify",
    "percentile",
    "read_back",
    "readable_queues",
    "stamp",
]

CLIENT_PROPERTY = "CHECKER_CLIENT"
SEQ_PROPERTY = "CHECKER_SEQ"


class Outcome(enum.StrEnum):
    OK = "ok"
    """Answered SEND_OK: the message must be found, where the answer said."""
    UNKNOWN = "unknown"
    """An exception (timeout, connection lost, refusal after earlier tries) or a status that
    says "stored, less safely than asked": it may or may not be there."""


def now_ms() -> float:
    """Wall-clock milliseconds (comparable across processes of one machine)."""
    return time.time() * 1000.0


@dataclass(frozen=True, slots=True)
class SendRecord:
    client: str
    seq: int
    topic: str
    outcome: Outcome
    sent_ms: float
    done_ms: float
    key: str | None = None
    broker_name: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    msg_id: str = ""
    error: str = ""

    @property
    def identity(self) -> tuple[str, int]:
        return (self.client, self.seq)

    @property
    def position(self) -> tuple[str, str, int, int]:
        return (self.topic, self.broker_name, self.queue_id, self.queue_offset)


@dataclass(slots=True)
class Fault:
    name: str
    at_ms: float
    healed_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    """One message found by the read-back, with the identity the checker gave it."""

    client: str
    seq: int
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    msg_id: str = ""

    @property
    def identity(self) -> tuple[str, int]:
        return (self.client, self.seq)

    @property
    def position(self) -> tuple[str, str, int, int]:
        return (self.topic, self.broker_name, self.queue_id, self.queue_offset)


def stamp(msg: Message, client: str, seq: int) -> Message:
    """Give ``msg`` the checker's identity (two user properties); returns ``msg``."""
    msg.properties[CLIENT_PROPERTY] = client
    msg.properties[SEQ_PROPERTY] = str(seq)
    return msg


def identify(msg: StoredMessage) -> tuple[str, int] | None:
    """The (client, seq) of a stored message: its properties, else a ``client:seq:`` body
    prefix; None for a message without one."""
    props = msg.properties
    client = props.get(CLIENT_PROPERTY)
    seq = props.get(SEQ_PROPERTY)
    if client is not None and seq is not None and seq.isdigit():
        return client, int(seq)
    head = msg.body[:64].split(b":", 2)
    if len(head) == 3 and head[1].isdigit() and head[0]:
        try:
            return head[0].decode(), int(head[1])
        except UnicodeDecodeError:
            return None
    return None


class History:
    """Every send of a test and every fault, in the order they were recorded. Thread-safe:
    producers on several threads (or the blocking facade's callbacks) may record at once."""

    def __init__(self) -> None:
        self.records: list[SendRecord] = []
        self.faults: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, record: SendRecord) -> SendRecord:
        with self._lock:
            self.records.append(record)
        return record

    def result(
        self,
        client: str,
        seq: int,
        result: SendResult,
        sent_ms: float,
        *,
        key: str | None = None,
        done_ms: float | None = None,
        index: int = 0,
    ) -> SendRecord:
        """Record a SendResult (``index``: the message's place in a batch send)."""
        mq = result.message_queue
        ids = result.msg_ids or (result.msg_id,)
        ok = result.status is SendStatus.SEND_OK
        return self.add(
            SendRecord(
                client, seq, mq.topic, Outcome.OK if ok else Outcome.UNKNOWN, sent_ms,
                now_ms() if done_ms is None else done_ms, key, mq.broker_name, mq.queue_id,
                result.queue_offset + index, ids[index] if index < len(ids) else "",
                "" if ok else result.status.value,
            )
        )  # fmt: skip

    def acked(
        self,
        client: str,
        seq: int,
        topic: str,
        broker_name: str,
        queue_id: int,
        queue_offset: int,
        sent_ms: float,
        *,
        key: str | None = None,
        msg_id: str = "",
        done_ms: float | None = None,
    ) -> SendRecord:
        """Record a SEND_OK known by its fields (a test sending raw frames)."""
        done = now_ms() if done_ms is None else done_ms
        return self.add(
            SendRecord(client, seq, topic, Outcome.OK, sent_ms, done, key, broker_name,
                       queue_id, queue_offset, msg_id)
        )  # fmt: skip

    def unknown(
        self,
        client: str,
        seq: int,
        topic: str,
        sent_ms: float,
        error: BaseException | str,
        *,
        key: str | None = None,
    ) -> SendRecord:
        """Record a send whose outcome is unknown (it raised, or was answered not-OK)."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return self.add(
            SendRecord(client, seq, topic, Outcome.UNKNOWN, sent_ms, now_ms(), key, error=text)
        )

    def fault(self, name: str, at_ms: float | None = None) -> Fault:
        """Mark a fault injected now (call it just before the kill, pause or cut)."""
        mark = Fault(name, now_ms() if at_ms is None else at_ms)
        with self._lock:
            self.faults.append(mark)
        return mark

    def snapshot(self) -> list[SendRecord]:
        with self._lock:
            return list(self.records)

    def ok(self) -> list[SendRecord]:
        return [r for r in self.snapshot() if r.outcome is Outcome.OK]

    def acks_after(self, at_ms: float, *, client: str | None = None) -> list[SendRecord]:
        """Acknowledged sends answered after ``at_ms`` (of one client, if given)."""
        return [
            r for r in self.ok() if r.done_ms > at_ms and (client is None or r.client == client)
        ]

    # ------------------------------------------------------------------ JSON lines

    def dump(self, path: Path) -> None:
        """Write the history as JSON lines: one ``{"send": ...}`` or ``{"fault": ...}`` each."""
        with self._lock, path.open("w") as f:
            for r in self.records:
                f.write(json.dumps({"send": asdict(r)}) + "\n")
            for fl in self.faults:
                f.write(json.dumps({"fault": asdict(fl)}) + "\n")

    def merge(self, other: History) -> History:
        """Add another history's records and faults (another process's, loaded) to this one."""
        with self._lock:
            self.records.extend(other.snapshot())
            self.faults.extend(other.faults)
        return self

    @classmethod
    def load(cls, path: Path) -> History:
        history = cls()
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            item: dict[str, Any] = json.loads(line)
            if "send" in item:
                values = dict(item["send"])
                values["outcome"] = Outcome(values["outcome"])
                history.records.append(SendRecord(**values))
            elif "fault" in item:
                history.faults.append(Fault(**item["fault"]))
        return history


# ---------------------------------------------------------------------- reading back


class Puller(Protocol):
    """What :func:`read_back` needs of :class:`orbitmq.client.AsyncAdminClient`."""

    async def topic_route(self, topic: str) -> TopicRouteData: ...
    async def min_offset(self, mq: MessageQueue) -> int: ...
    async def max_offset(self, mq: MessageQueue) -> int: ...
    async def pull(self, mq: MessageQueue, offset: int, *, max_nums: int = ...,
                   max_bytes: int = ...) -> Any: ...  # fmt: skip


@dataclass(slots=True)
class ReadBack:
    """What :func:`read_back` found: identified messages, and how many were not ours."""

    delivered: list[Delivered] = field(default_factory=list)
    foreign: int = 0
    gaps: list[str] = field(default_factory=list)
    """Queues whose offsets between min and max were not all readable, and groups whose queues
    could not be read at all (no master in the route)."""


async def readable_queues(
    admin: Puller, topic: str, wait_s: float
) -> tuple[list[MessageQueue], list[str]]:
    """The topic's readable queues (the rule clients use: groups with a master) and the groups
    holding readable queues that the route names no master for. Re-reads the route every 0.2 s,
    at most ``wait_s``, until there is none of the latter."""
    deadline = time.monotonic() + wait_s
    while True:
        route = await admin.topic_route(topic)
        info = TopicPublishInfo.from_route(topic, route, time.monotonic())
        held = {
            q.broker_name for q in route.queue_datas if q.perm & PERM_READ and q.read_queue_nums
        }
        masterless = sorted(held - set(info.broker_addrs))
        if not masterless or time.monotonic() >= deadline:
            return list(info.read_queues), masterless
        await asyncio.sleep(0.2)


async def read_back(
    admin: Puller,
    topics: Iterable[str],
    *,
    who: Callable[[StoredMessage], tuple[str, int] | None] = identify,
    batch: int = 512,
    route_wait_s: float = 30.0,
) -> ReadBack:
    """Drain every readable queue of ``topics`` from its min to its max offset through the
    NameServers' routes (each queue's current master). A group the route names no master for is
    waited for (:func:`readable_queues`, ``route_wait_s``), then reported in ``gaps``."""
    out = ReadBack()
    for topic in topics:
        queues, masterless = await readable_queues(admin, topic, route_wait_s)
        out.gaps += (
            f"{topic}@{name}: no master in the route after {route_wait_s:g} s, not read"
            for name in masterless
        )
        for mq in queues:
            lo, hi = await admin.min_offset(mq), await admin.max_offset(mq)
            offset = lo
            while offset < hi:
                res = await admin.pull(mq, offset, max_nums=batch, max_bytes=16 * 1024 * 1024)
                messages: Sequence[StoredMessage] = res.messages
                if not messages:
                    out.gaps.append(f"{mq}: nothing readable at {offset} below max {hi}")
                    break
                for m in messages:
                    ident = who(m)
                    if ident is None:
                        out.foreign += 1
                        continue
                    out.delivered.append(
                        Delivered(ident[0], ident[1], m.topic, mq.broker_name, m.queue_id,
                                  m.queue_offset, m.msg_id or "")
                    )  # fmt: skip
                offset = max(res.next_begin_offset, messages[-1].queue_offset + 1)
    return out


# ---------------------------------------------------------------------- checking


@dataclass(slots=True)
class Recovery:
    fault: Fault
    recovered_ms: float | None
    """From the fault to the first acknowledgement of a send issued at or after it."""


@dataclass(slots=True)
class Report:
    sends: int = 0
    acked: int = 0
    unknown: int = 0
    unknown_found: int = 0
    """Sends of unknown outcome whose message is there (stored after all)."""
    delivered: int = 0
    lost: list[SendRecord] = field(default_factory=list)
    misplaced: list[tuple[SendRecord, Delivered]] = field(default_factory=list)
    duplicates: dict[tuple[str, int], list[Delivered]] = field(default_factory=dict)
    order_violations: list[str] = field(default_factory=list)
    phantoms: list[Delivered] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)

    @property
    def duplicate_count(self) -> int:
        """Copies beyond the first."""
        return sum(len(v) - 1 for v in self.duplicates.values())

    def recovery_ms(self) -> list[float]:
        return [r.recovered_ms for r in self.recoveries if r.recovered_ms is not None]

    @property
    def unrecovered(self) -> list[Fault]:
        return [r.fault for r in self.recoveries if r.recovered_ms is None]

    def problems(self, *, max_duplicates: int = 0, check_order: bool = True) -> list[str]:
        """What breaks the promise: lost, misplaced, phantoms, gaps, too many duplicates, order."""
        out: list[str] = []
        if self.lost:
            out.append(f"{len(self.lost)} acknowledged lost, e.g. {self.lost[:5]}")
        if self.misplaced:
            out.append(f"{len(self.misplaced)} misplaced, e.g. {self.misplaced[:3]}")
        if self.phantoms:
            out.append(f"{len(self.phantoms)} never sent, e.g. {self.phantoms[:3]}")
        if self.gaps:
            out.append(f"unreadable ranges: {self.gaps[:5]}")
        if self.duplicate_count > max_duplicates:
            some = list(self.duplicates.items())[:3]
            out.append(f"{self.duplicate_count} duplicates (> {max_duplicates}), e.g. {some}")
        if check_order and self.order_violations:
            out.append(
                f"{len(self.order_violations)} order violations: {self.order_violations[:5]}"
            )
        return out

    def assert_ok(self, *, max_duplicates: int = 0, check_order: bool = True) -> None:
        problems = self.problems(max_duplicates=max_duplicates, check_order=check_order)
        if problems:
            raise AssertionError(self.summary() + "\n" + "\n".join(problems))

    def summary(self) -> str:
        rec = self.recovery_ms()
        text = (
            f"sends {self.sends}: acked {self.acked}, unknown {self.unknown} "
            f"({self.unknown_found} stored); read back {self.delivered}; lost {len(self.lost)}, "
            f"misplaced {len(self.misplaced)}, duplicates {self.duplicate_count}, "
            f"order violations {len(self.order_violations)}, phantoms {len(self.phantoms)}"
        )
        if self.recoveries:
            text += (
                f"; faults {len(self.recoveries)}, recovered {len(rec)}, recovery ms p50 "
                f"{percentile(rec, 50):.0f} p99 {percentile(rec, 99):.0f} max "
                f"{max(rec, default=math.nan):.0f}"
            )
        return text


def check(
    records: Sequence[SendRecord] | History,
    found: ReadBack | Sequence[Delivered],
    faults: Sequence[Fault] = (),
) -> Report:
    """Compare a history with what the read-back found (see the module docstring)."""
    if isinstance(records, History):
        faults = [*faults, *records.faults]
        records = records.snapshot()
    if isinstance(found, ReadBack):
        gaps, delivered = list(found.gaps), found.delivered
    else:
        gaps, delivered = [], list(found)
    report = Report(sends=len(records), delivered=len(delivered), gaps=gaps)
    where: dict[tuple[str, int], list[Delivered]] = {}
    for d in delivered:
        where.setdefault(d.identity, []).append(d)
    sent: dict[tuple[str, int], SendRecord] = {}
    for r in records:
        prior = sent.get(r.identity)
        if prior is None or r.outcome is Outcome.OK:
            sent[r.identity] = r  # a resend of one seq: the acknowledged record speaks
    for r in sent.values():
        copies = where.get(r.identity, [])
        if r.outcome is Outcome.OK:
            report.acked += 1
            if not copies:
                report.lost.append(r)
            elif r.queue_offset >= 0 and all(d.position != r.position for d in copies):
                report.misplaced.append((r, copies[0]))
        else:
            report.unknown += 1
            report.unknown_found += bool(copies)
    report.duplicates = {k: v for k, v in where.items() if len(v) > 1}
    report.phantoms = [d for d in delivered if d.identity not in sent]
    report.order_violations = _order_violations(sent.values(), where)
    report.recoveries = _recoveries(records, faults)
    return report


def _order_violations(
    sent: Iterable[SendRecord], where: dict[tuple[str, int], list[Delivered]]
) -> list[str]:
    groups: dict[tuple[str, str, str], list[SendRecord]] = {}
    for r in sent:
        if r.key is not None and r.outcome is Outcome.OK:
            groups.setdefault((r.client, r.topic, r.key), []).append(r)
    out: list[str] = []
    for (client, _topic, key), group in sorted(groups.items()):
        prev: Delivered | None = None
        for r in sorted(group, key=lambda r: r.seq):
            copies = where.get(r.identity)
            if not copies:
                continue  # lost: reported as lost
            here = min(copies, key=lambda d: d.queue_offset)
            if prev is not None:
                if (here.broker_name, here.queue_id) != (prev.broker_name, prev.queue_id):
                    out.append(
                        f"{client}/{key}: seq {prev.seq} on {prev.broker_name}/{prev.queue_id}, "
                        f"seq {here.seq} on {here.broker_name}/{here.queue_id}"
                    )
                elif here.queue_offset <= prev.queue_offset:
                    out.append(
                        f"{client}/{key}: seq {here.seq} at offset {here.queue_offset}, not "
                        f"after seq {prev.seq} at {prev.queue_offset}"
                    )
            prev = here
    return out


def _recoveries(records: Sequence[SendRecord], faults: Sequence[Fault]) -> list[Recovery]:
    acks = sorted(
        (r.done_ms, r.sent_ms) for r in records if r.outcome is Outcome.OK
    )  # answered order
    out: list[Recovery] = []
    for f in sorted(faults, key=lambda f: f.at_ms):
        first = next((done for done, sent in acks if sent >= f.at_ms), None)
        out.append(Recovery(f, None if first is None else first - f.at_ms))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
