"""Screenshots of every console page for docs/console.md, at 1280x800.

Starts ``orbitmq up`` (trace on, proxy and Kafka off) in a temporary folder, gives it some
data (an ``orders`` topic, a ``billing`` group part way through it, a ``shipping`` group whose
messages went to its DLQ, a traced message), then drives a headless Chromium through every
page with Playwright and writes ``docs/console/<page>.png``.

    python examples/console_screenshots.py [--out docs/console] [--chromium /usr/bin/chromium]

Needs the console extra and Playwright (``pip install -e '.[console,dev]'``) and Debian's
``chromium`` (``make browser``). The server is stopped by its PID however the script ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orbitmq.client import BlockingAdminClient, LocalTransactionState, Message, Producer
from orbitmq.client.consumer.config import SimpleConfig
from orbitmq.client.consumer.simple import SimpleConsumer
from orbitmq.client.consumer_types import ConsumeFromWhere
from orbitmq.client.transaction.blocking import TransactionProducer
from orbitmq.protocol.group_config import SubscriptionGroupConfig

SIZE = {"width": 1280, "height": 800}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_up(data: Path, console_port: int) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``orbitmq up`` with tracing on; its endpoints from the ready line."""
    env = {**os.environ, "ORBITMQ_BROKER_TRACE_ENABLE": "true",
           "ORBITMQ_CONSOLE_AUDIT_LOG": str(data.parent / "console-audit.jsonl")}  # fmt: skip
    argv = [sys.executable, "-m", "orbitmq", "up", "--data-dir", str(data),
            "--namesrv-port", "0", "--broker-port", "0", "--proxy-port", "-1",
            "--kafka-port", "-1", "--console-port", str(console_port), "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " ready " not in line:
        proc.kill()
        raise SystemExit(f"orbitmq up did not start: {line!r}")
    return proc, dict(w.split("=", 1) for w in line.split()[3:] if "=" in w)


def receive(consumer: SimpleConsumer, want: int, invisible_s: float = 15.0) -> list[object]:
    got: list[object] = []
    deadline = time.monotonic() + 20
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(min(16, want - len(got)), invisible_s)
    return got


def populate(namesrv: str) -> str:
    """Some data for every page; the id of a traced, consumed message."""
    with BlockingAdminClient([namesrv]) as admin:
        admin.create_topic("orders", read_queue_nums=4, write_queue_nums=4)
        admin.create_topic("payments", read_queue_nums=2, write_queue_nums=2)
        admin.update_group_config(SubscriptionGroupConfig(group_name="shipping", retry_max_times=0))
        for topic in ("orders", "payments"):  # until the NameServer routes them (bounded)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if admin.queues(topic):
                        break
                except Exception:  # noqa: BLE001 - not routed yet
                    pass
                time.sleep(0.2)
        traced = ""
        with Producer([namesrv]) as producer:
            for i in range(400):
                body = f'{{"order": {i}, "amount": {i * 7 % 500}.00, "currency": "EUR"}}'
                r = producer.send(Message("orders", body.encode(), tags="created",
                                          keys=[f"order-{i}"]))  # fmt: skip
                traced = traced or r.msg_id
            for i in range(60):
                producer.send(Message("payments", f"payment {i}".encode(), keys=[f"pay-{i}"]))
        cfg = SimpleConfig(await_duration_s=0.5, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
        with SimpleConsumer([namesrv], "billing", cfg, subscriptions={"orders": "*"}) as billing:
            billing.start()
            for m in receive(billing, 150):
                billing.ack(m)  # type: ignore[arg-type]  # ReceivedMessage
        with SimpleConsumer([namesrv], "shipping", cfg, subscriptions={"payments": "*"}) as ship:
            ship.start()
            receive(ship, 3, invisible_s=1.0)  # never acked: dead-lettered at once (0 retries)
        deadline = time.monotonic() + 20
        while not admin.dlq_messages("shipping") and time.monotonic() < deadline:
            time.sleep(0.3)
        with Producer([namesrv]) as producer:  # the timers page: delayed messages waiting
            for i in range(25):
                producer.send(Message("orders", b"reminder", keys=[f"remind-{i}"])
                              .set_delay_ms(3_600_000 + i * 60_000))  # fmt: skip
        with TransactionProducer([namesrv], "checkout", Undecided()) as tx:  # half messages
            for i in range(3):
                tx.send_in_transaction(Message("payments", f"hold {i}".encode()))
    return traced


class Undecided:
    """A transaction listener that leaves its half messages undecided (the timers page)."""

    def execute_local_transaction(self, _msg: Message, _arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, _msg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def shoot(console: str, msg_id: str, out: Path, chromium: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    pages = [
        ("overview", "/"),
        ("topics", "/topics"),
        ("topic", "/topics/orders"),
        ("groups", "/groups"),
        ("group", "/groups/billing"),
        ("messages", "/messages?topic=payments&since=3600"),
        ("trace", f"/trace?msg_id={msg_id}&topic=orders"),
        ("dlq", "/dlq?group=shipping"),
        ("clients", "/clients"),
        ("timers", "/timers"),
        ("audit", "/audit"),
    ]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--disable-gpu"])
        page = browser.new_page(viewport=SIZE)
        page.goto(console + "/topics/orders")  # one write, so the audit page has an entry
        page.fill("input[name=body]", '{"order": "test"}')
        page.fill("input[name=keys]", "order-test")
        page.click("form[action='/topics/orders/send'] button")
        page.wait_for_load_state()
        for name, path in pages:
            page.goto(console + path)
            page.wait_for_timeout(2500 if name in ("overview", "group", "groups") else 500)
            target = out / f"{name}.png"
            page.screenshot(path=str(target))
            written.append(target)
        browser.close()
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/console"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="orbitmq-shots-") as tmp:
        proc, endpoints = start_up(Path(tmp) / "data", free_port())
        try:
            msg_id = populate(endpoints["namesrv"])
            cfg = SimpleConfig(await_duration_s=0.5)
            # online members for the clients page, while the pages are shot
            with SimpleConsumer([endpoints["namesrv"]], "billing", cfg,
                                subscriptions={"orders": "*"}) as online,  \
                 SimpleConsumer([endpoints["namesrv"]], "shipping", cfg,
                                subscriptions={"payments": "*"}) as other:  # fmt: skip
                online.start()
                other.start()
                for path in shoot(endpoints["console"], msg_id, args.out, args.chromium):
                    print(f"{path} {path.stat().st_size // 1024} KiB")
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
