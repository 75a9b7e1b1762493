"""A consumer in its own process, for the integration and crash tests of consumers.

Run as (repository root as the working directory)::

    python -m tests.integration.consumer_child --namesrv ADDR --group G --topic T \
        --mode push|orderly|broadcast|pop|lite-pull --out FILE [options]

It consumes until SIGTERM (a clean shutdown: offsets committed, client unregistered) or SIGKILL
(a crash, sent by the test). It prints ``orbitmq consumer ready <client_id>`` on stdout once
started, and nothing on stdout afterwards (nobody reads the pipe any more). Everything it sees
goes to FILE, appended with one ``os.write`` per batch, *before* the listener returns SUCCESS
(push, orderly, broadcast), before the positions are committed (lite-pull) or before the ack
(pop): a message consumed and then lost to a crash is on file, so the tests can tell duplicates
from losses. Lines, fields separated by single spaces::

    M <time_ns> <body> <topic> <read_topic> <broker> <queue_id> <queue_offset> <reconsume_times> <msg_id> [<invisible_until_ms>]
    A <time_ns> <body> <outcome>            pop: ack result: "ok", "skip" (not acked on
                                            purpose), "NotSent" (no connection), or the
                                            error's class name
    Q <time_ns> <queue>,<queue>,...         the assignment, written whenever it changes
    X <time_ns> closed                      after a clean shutdown

``<topic>`` is the topic the message was sent to, ``<read_topic>`` the one it was read from (a
retry topic for a redelivered copy); ``<invisible_until_ms>`` only for pop (the broker's deadline
for the ack); queues are ``topic@broker@queue_id``. Bodies are expected
to be short ASCII tokens without spaces (the tests' keys).

The parsing helpers :func:`read_lines` and :class:`Consumed` are imported by the tests; the
consumer classes are imported only when the program runs, so importing this module is cheap.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("push", "orderly", "broadcast", "pop", "lite-pull")
MODULE = "tests.integration.consumer_child"
"""What the tests run as ``python -m``."""


# ----------------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class Consumed:
    """One ``M`` line: a message handed to the application."""

    consumer: str
    """Which file it came from (the test names files after consumers)."""
    time_ns: int
    body: str
    topic: str
    read_topic: str
    broker: str
    queue_id: int
    queue_offset: int
    reconsume_times: int
    msg_id: str
    invisible_until_ms: int | None = None
    """Pop: when the message becomes visible again unless acked."""

    @property
    def queue(self) -> tuple[str, str, int]:
        return (self.read_topic, self.broker, self.queue_id)

    @property
    def delivery_attempt(self) -> int:
        return self.reconsume_times + 1


@dataclass(slots=True)
class ChildLog:
    """Everything one consumer wrote."""

    consumed: list[Consumed]
    acks: list[tuple[int, str, str]]
    """(time_ns, body, outcome) per pop ack."""
    assignments: list[tuple[int, frozenset[str]]]
    closed: bool


def read_lines(path: Path, consumer: str | None = None) -> ChildLog:
    """Parse a consumer's file. A torn last line (a kill mid-write: writes are single
    ``os.write`` calls, so never in practice) is ignored."""
    name = consumer if consumer is not None else path.stem
    log = ChildLog([], [], [], False)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return log
    for raw in data.split(b"\n"):
        if not raw:
            continue
        parts = raw.decode(errors="replace").split(" ")
        kind = parts[0]
        if kind == "M" and len(parts) in (10, 11):
            log.consumed.append(
                Consumed(
                    name,
                    int(parts[1]),
                    parts[2],
                    parts[3],
                    parts[4],
                    parts[5],
                    int(parts[6]),
                    int(parts[7]),
                    int(parts[8]),
                    parts[9],
                    int(parts[10]) if len(parts) == 11 else None,
                )
            )
        elif kind == "A" and len(parts) == 4:
            log.acks.append((int(parts[1]), parts[2], parts[3]))
        elif kind == "Q" and len(parts) == 3:
            queues = frozenset(q for q in parts[2].split(",") if q and q != "-")
            log.assignments.append((int(parts[1]), queues))
        elif kind == "X":
            log.closed = True
    return log


def child_args(
    namesrv: str, group: str, topic: str, mode: str, out: Path, **options: object
) -> list[str]:
    """The command-line arguments of one consumer; ``options`` are the optional flags by
    their Python names (``ack_delay_ms=5`` -> ``--ack-delay-ms 5``)."""
    assert mode in MODES, mode
    args = ["--namesrv", namesrv, "--group", group, "--topic", topic, "--mode", mode]
    args += ["--out", str(out)]
    for name, value in options.items():
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def read_all(paths: dict[str, Path]) -> dict[str, ChildLog]:
    """Every consumer's file, by consumer name."""
    return {name: read_lines(path, name) for name, path in paths.items()}


def latest_assignment(log: ChildLog, topic: str) -> frozenset[str] | None:
    """The consumer's last reported queues of ``topic`` (its retry topic left out)."""
    if not log.assignments:
        return None
    return frozenset(q for q in log.assignments[-1][1] if q.split("@", 1)[0] == topic)


# ----------------------------------------------------------------------------- the program


class Output:
    """The append-only result file: one ``os.write`` per batch of lines."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()

    def write(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode()
        with self.lock:
            view = memoryview(data)
            while view:
                n = os.write(self.fd, view)
                view = view[n:]

    def close(self) -> None:
        os.close(self.fd)


def message_line(m: Any) -> str:
    """The ``M`` line of a ConsumedMessage / ReceivedMessage."""
    body = bytes(m.body).decode(errors="replace").replace(" ", "_").replace("\n", "_") or "-"
    line = (
        f"M {time.time_ns()} {body} {m.topic} {m.queue.topic} {m.queue.broker_name} "
        f"{m.queue.queue_id} {m.queue_offset} {m.reconsume_times} {m.msg_id or '-'}"
    )
    until = getattr(m, "invisible_until_ms", None)
    return line if until is None else f"{line} {until}"


def queue_name(mq: Any) -> str:
    return f"{mq.topic}@{mq.broker_name}@{mq.queue_id}"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.integration.consumer_child")
    p.add_argument("--namesrv", required=True, help="';'-separated host:port list")
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--expression", default="*", help="tag expression")
    p.add_argument("--from", dest="from_where", choices=["first", "last"], default="first")
    p.add_argument("--ack-delay-ms", type=float, default=0.0, help="pause before SUCCESS/ack")
    p.add_argument("--threads", type=int, default=4, help="push: consume threads")
    p.add_argument("--pull-batch", type=int, default=32)
    p.add_argument("--commit-interval-s", type=float, default=0.2)
    p.add_argument("--rebalance-interval-s", type=float, default=1.0)
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--offset-dir", type=Path, default=None, help="broadcast: local offsets")
    p.add_argument("--client-id", default=None)
    # pop
    p.add_argument("--max-messages", type=int, default=8)
    p.add_argument("--invisible-s", type=float, default=5.0)
    p.add_argument("--await-s", type=float, default=1.0)
    p.add_argument(
        "--no-ack-prefix",
        default=None,
        help="pop: bodies starting with this are not acked on their first delivery",
    )
    return p.parse_args(argv)


class Child:
    """One consumer of the given mode, writing to ``--out`` until SIGTERM."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Output(args.out)
        self.stop = threading.Event()
        self.delay_s = args.ack_delay_ms / 1000.0
        self.parent = os.getppid()
        self.success: Any = None  # ConsumeResult.SUCCESS, once the client is imported

    # -- listeners (push, orderly, broadcast) ---------------------------------------------

    def on_messages(self, msgs: list[Any]) -> Any:
        """The listener (runs on the consumer's threads): on file first, then SUCCESS."""
        self.out.write([message_line(m) for m in msgs])
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.success

    # -- the loop -------------------------------------------------------------------------

    def orphaned(self) -> bool:
        """The test process is gone (it would have killed us): do not linger."""
        return os.getppid() != self.parent

    def ready(self, client_id: str) -> None:
        print(f"orbitmq consumer ready {client_id}", flush=True)

    def watch_assignment(self, assignment: Any) -> None:
        """Until SIGTERM: write the assignment whenever it changes."""
        last: frozenset[str] | None = None
        while not self.stop.wait(0.05):
            if self.orphaned():
                os._exit(3)
            now = frozenset(queue_name(mq) for mq in assignment())
            if now != last:
                self.out.write([f"Q {time.time_ns()} {','.join(sorted(now)) or '-'}"])
                last = now

    def run_push(self) -> None:
        from orbitmq.client.consumer.config import PushConfig
        from orbitmq.client.consumer.push import PushConsumer
        from orbitmq.client.consumer_types import ConsumeFromWhere, ConsumeResult, MessageModel

        self.success = ConsumeResult.SUCCESS
        a = self.args
        model = MessageModel.BROADCASTING if a.mode == "broadcast" else MessageModel.CLUSTERING
        options: dict[str, Any] = {}
        if a.offset_dir is not None:
            options["offset_store_dir"] = str(a.offset_dir)
        consumer = PushConsumer(
            a.namesrv.split(";"),
            a.group,
            PushConfig(
                message_model=model,
                consume_from_where=from_where(a.from_where, ConsumeFromWhere),
                consume_threads=a.threads,
                pull_batch_size=a.pull_batch,
                client_id=a.client_id,
                heartbeat_interval_s=a.heartbeat_interval_s,
                rebalance_interval_s=a.rebalance_interval_s,
                auto_commit_interval_s=a.commit_interval_s,
                **options,
            ),
        )
        consumer.subscribe(a.topic, a.expression)
        if a.mode == "orderly":
            consumer.register_orderly_listener(self.on_messages)
        else:
            consumer.register_listener(self.on_messages)
        consumer.start()
        try:
            self.ready(consumer.client_id)
            self.watch_assignment(consumer.assignment)
        finally:
            consumer.shutdown()

    def run_lite_pull(self) -> None:
        from orbitmq.client.consumer.config import LitePullConfig
        from orbitmq.client.consumer.lite_pull import LitePullConsumer
        from orbitmq.client.consumer_types import ConsumeFromWhere

        a = self.args
        consumer = LitePullConsumer(
            a.namesrv.split(";"),
            a.group,
            LitePullConfig(
                auto_commit=False,  # commit only what is on file: at-least-once across a kill
                pull_batch_size=a.pull_batch,
                poll_max=a.pull_batch,
                consume_from_where=from_where(a.from_where, ConsumeFromWhere),
                client_id=a.client_id,
            ),
        )
        consumer.subscribe(a.topic, a.expression)
        consumer.start()
        try:
            self.ready(consumer.client_id)
            last: frozenset[str] | None = None
            while not self.stop.is_set():
                if self.orphaned():
                    os._exit(3)
                msgs = consumer.poll(timeout_s=0.2)
                now = frozenset(queue_name(mq) for mq in consumer.assignment())
                if now != last:
                    self.out.write([f"Q {time.time_ns()} {','.join(sorted(now)) or '-'}"])
                    last = now
                if msgs:
                    self.out.write([message_line(m) for m in msgs])
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    consumer.commit()
        finally:
            consumer.close()

    def run_pop(self) -> None:
        from orbitmq.client.consumer.config import SimpleConfig
        from orbitmq.client.consumer.simple import SimpleConsumer
        from orbitmq.client.consumer_types import ConsumeFromWhere

        a = self.args
        consumer = SimpleConsumer(
            a.namesrv.split(";"),
            a.group,
            SimpleConfig(
                await_duration_s=a.await_s,
                client_id=a.client_id,
                consume_from_where=from_where(a.from_where, ConsumeFromWhere),
                heartbeat_interval_s=a.heartbeat_interval_s,
            ),
            subscriptions={a.topic: a.expression},
        )
        consumer.start()
        seen_errors: set[type[BaseException]] = set()
        try:
            self.ready(consumer.client_id)
            while not self.stop.is_set():
                if self.orphaned():
                    os._exit(3)
                try:
                    msgs = consumer.receive(
                        max_messages=a.max_messages, invisible_duration_s=a.invisible_s
                    )
                except Exception as exc:  # a broker restart: try again
                    self.out.write([f"E {time.time_ns()} receive {type(exc).__name__}"])
                    if type(exc) not in seen_errors:  # the first of each kind, in full
                        seen_errors.add(type(exc))
                        logging.getLogger("consumer_child").exception("receive failed")
                    self.stop.wait(0.1)
                    continue
                if not msgs:
                    continue
                self.out.write([message_line(m) for m in msgs])
                if self.delay_s:
                    time.sleep(self.delay_s)
                acks: list[str] = []
                for m in msgs:
                    body = bytes(m.body).decode(errors="replace")
                    if (
                        a.no_ack_prefix
                        and body.startswith(a.no_ack_prefix)
                        and m.delivery_attempt == 1
                    ):
                        acks.append(f"A {time.time_ns()} {body} skip")
                        continue
                    try:
                        consumer.ack(m)
                        outcome = "ok"
                    except Exception as exc:  # noqa: BLE001 - recorded; the test judges
                        outcome = type(exc).__name__
                        if "cannot connect" in str(exc):  # never reached the broker
                            outcome = "NotSent"
                        logging.getLogger("consumer_child").warning("ack %s: %r", body, exc)
                    acks.append(f"A {time.time_ns()} {body} {outcome}")
                self.out.write(acks)
        finally:
            consumer.close()

    def main(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        try:
            if self.args.mode == "pop":
                self.run_pop()
            elif self.args.mode == "lite-pull":
                self.run_lite_pull()
            else:
                self.run_push()
            self.out.write([f"X {time.time_ns()} closed"])  # only after a clean shutdown
        finally:
            self.out.close()
        return 0


def from_where(name: str, enum_type: Any) -> Any:
    return enum_type.FIRST_OFFSET if name == "first" else enum_type.LAST_OFFSET


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return Child(parse(sys.argv[1:] if argv is None else argv)).main()


if __name__ == "__main__":
    sys.exit(main())
