"""Transactions across real process deaths: a producer killed with transactions undecided (a
new producer process of the group answers the check-backs), and a broker SIGKILLed with half
messages pending (after its restart they are checked back and resolved, none twice).

The broker is ``python -m orbitmq broker`` with short check-back timings in its TOML file. This
module is also the producer program the tests run (``python -m`` it)::

    producer --namesrv ADDR --topic T --ledger FILE --mode send|answer [--count N]

``producer --mode send`` sends ``count`` transactions. Transaction i decides COMMIT (i % 3 == 0),
ROLLBACK (i % 3 == 1) or UNKNOWN (i % 3 == 2); before returning, the local transaction appends
``<msg_id> <outcome> <body>`` to the ledger (the application's durable record: the outcome of an
UNKNOWN one alternates COMMIT/ROLLBACK). Then it sends BATCHES half batches of BATCH_SIZE
messages, undecided, after writing ``<transaction id> <outcome> <body>,<body>,...`` (batch 0
COMMIT, the others ROLLBACK). Check-backs it gets are answered UNKNOWN. It prints
``orbitmq producer ready <client_id>`` when every transaction was sent, then waits to be killed.
``--mode answer`` only answers check-backs, from the ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from orbitmq.client.admin.config import AdminConfig
from orbitmq.client.transaction.types import TransactionConfig
from tests.harness import ProcessCluster, ServerProcess

MODULE = "tests.integration.test_transaction_restart"
TOPIC = "TX_RESTART"
GROUP = "PG_RESTART"
COUNT = 9
BATCHES = 2
BATCH_SIZE = 4


# ----------------------------------------------------------------------------- child programs


def _read_ledger(path: Path) -> dict[str, tuple[str, str]]:
    """msg id -> (outcome, body)."""
    out: dict[str, tuple[str, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out[parts[0]] = (parts[1], parts[2])
    return out


def _producer_main(argv: list[str]) -> None:
    from orbitmq.client import LocalTransactionState, Message, TransactionProducer
    from orbitmq.common.ids import default_generator
    from orbitmq.common.message import PROPERTY_UNIQ_KEY

    p = argparse.ArgumentParser()
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--ledger", required=True, type=Path)
    p.add_argument("--mode", choices=["send", "answer"], required=True)
    p.add_argument("--count", type=int, default=COUNT)
    a = p.parse_args(argv)
    ledger: Path = a.ledger

    def record(line: str) -> None:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{line}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    class Listener:
        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            i = int(arg)
            outcome = "COMMIT" if i % 3 == 0 or (i % 3 == 2 and i % 2 == 0) else "ROLLBACK"
            record(f"{msg.properties[PROPERTY_UNIQ_KEY]} {outcome} {msg.body.decode()}")
            if i % 3 == 2:
                return LocalTransactionState.UNKNOWN  # "crashed" before telling the broker
            return LocalTransactionState(outcome)

        def check_local_transaction(self, msg: Any) -> LocalTransactionState:
            if a.mode == "send":
                return LocalTransactionState.UNKNOWN
            known = _read_ledger(ledger).get(msg.msg_id or "")
            return LocalTransactionState(known[0]) if known else LocalTransactionState.UNKNOWN

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    producer = TransactionProducer(
        [a.namesrv],
        GROUP,
        Listener(),
        TransactionConfig(heartbeat_interval_s=0.3),
        topics=[a.topic],
    )
    try:
        if a.mode == "send":
            for i in range(a.count):
                producer.send_in_transaction(Message(a.topic, f"tx{i}".encode()), arg=i)
            for j in range(BATCHES):
                bodies = [f"b{j}_{k}" for k in range(BATCH_SIZE)]
                tx_id = default_generator.next_id()  # recorded before the send, as an app would
                record(f"{tx_id} {'COMMIT' if j == 0 else 'ROLLBACK'} {','.join(bodies)}")
                msgs = [Message(a.topic, b.encode()) for b in bodies]
                producer.send_half_batch(msgs, transaction_id=tx_id)  # left undecided
        print(f"orbitmq producer ready {producer.client_id}", flush=True)
        stop.wait()
    finally:
        producer.close()


def main(argv: list[str]) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    role, rest = argv[0], argv[1:]
    if role == "producer":
        _producer_main(rest)
    else:
        raise SystemExit(f"unknown role {role!r}")


# ----------------------------------------------------------------------------- the tests


def _start_broker(cluster: ProcessCluster, namesrv: str, store: Path) -> ServerProcess:
    timings = {"transaction_timeout_ms": 400, "transaction_check_interval_ms": 200}
    return cluster.broker("broker-tx", [namesrv], store=store, settings={"broker": timings})


def _producer(cluster: ProcessCluster, namesrv: str, ledger: Path, mode: str) -> ServerProcess:
    args = ["producer", "--namesrv", namesrv, "--topic", TOPIC, "--ledger", str(ledger),
            "--mode", mode]  # fmt: skip
    return cluster.child("producer", MODULE, args, name=f"producer-{mode}")


async def _visible_bodies(namesrv: str, want: int, timeout_s: float = 20.0) -> list[str]:
    """Pull the topic until ``want`` messages came (or the time is up), then once more after a
    pause: every message read, duplicates included."""
    from orbitmq.client import AsyncAdminClient
    from tests.client.test_e2e import read_all

    async with AsyncAdminClient([namesrv], AdminConfig(timeout_s=3.0)) as admin:
        got = await read_all(admin, TOPIC, want, timeout_s)
        await asyncio.sleep(1.0)  # a late duplicate would show now
        got = await read_all(admin, TOPIC, len(got) + 1, 0.5)
    return sorted(m.body.decode() for m in got)


def _expected(ledger: Path) -> list[str]:
    return sorted(
        body
        for outcome, bodies in _read_ledger(ledger).values()
        if outcome == "COMMIT"
        for body in bodies.split(",")
    )


async def test_restarted_producer_answers_check_backs(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    _start_broker(cluster, ns.address, tmp_path / "store")
    ledger = tmp_path / "ledger.txt"
    sender = _producer(cluster, ns.address, ledger, "send")
    sender.kill()  # undecided transactions stay behind
    assert len(_read_ledger(ledger)) == COUNT + BATCHES
    _producer(cluster, ns.address, ledger, "answer")
    expected = _expected(ledger)
    assert expected == ["b0_0", "b0_1", "b0_2", "b0_3", "tx0", "tx2", "tx3", "tx6", "tx8"]
    assert await _visible_bodies(ns.address, len(expected)) == expected


async def test_broker_sigkill_with_pending_half_messages(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    ns = cluster.namesrv()
    broker = _start_broker(cluster, ns.address, tmp_path / "store")
    ledger = tmp_path / "ledger.txt"
    sender = _producer(cluster, ns.address, ledger, "send")  # answers check-backs UNKNOWN
    broker.kill()  # tx2, tx5, tx8 and both batches pending (checked, never decided)
    sender.kill()
    broker.restart()
    _producer(cluster, ns.address, ledger, "answer")
    expected = _expected(ledger)
    assert await _visible_bodies(ns.address, len(expected)) == expected
    log = broker.log()
    assert "transactions: " in log and "half messages" in log


if __name__ == "__main__":
    main(sys.argv[1:])
