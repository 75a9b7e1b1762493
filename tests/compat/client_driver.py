"""Runs one scenario with the official Apache RocketMQ 5 Python client (``rocketmq``, PyPI
``rocketmq-python-client``), unmodified: JSON scenario on stdin, JSON results on stdout.

Why a separate process: the client's generated protobuf modules register the
``apache.rocketmq.v2`` symbols under other file names than OrbitMQ's, which one descriptor pool
refuses; and importing the client configures logging and writes its log under ``$HOME`` (the
tests point HOME at their temporary folder). This file imports nothing from OrbitMQ.

A scenario is ``{"endpoint": "127.0.0.1:port", "ak": "", "sk": "", "steps": [...]}``. Steps run
in order and may name clients that later steps use; every client is shut down at the end. Each
step gives one result; a step that raises ends the run with ``{"failed": index, "error": ...}``
unless it says ``"expect_error": true`` (then the error is its result and the run goes on).

Steps (``op``):
- ``producer``: ``name``, ``topics``, optional ``checker`` (``COMMIT``/``ROLLBACK``/``UNKNOWN``:
  what the transaction checker answers; the checks it gets are recorded).
- ``send``: ``producer``, ``messages`` (message specs), optional ``transaction``
  (``commit``/``rollback``/``open``: one transaction for all of them), ``async`` (send_async).
- ``simple_consumer``: ``name``, ``group``, ``topics`` {topic: tag expression}, ``await_s``.
- ``receive``: ``consumer``, ``expect`` (messages wanted), ``timeout_s``, ``max``,
  ``invisible_s``, ``ack`` (true), ``change_invisible_s`` (change before acking), ``idle_s``
  (after ``expect`` came, keep receiving this long to see nothing more arrives).
- ``push_consumer``: ``name``, ``group``, ``topics``, ``fail`` (how many deliveries of each
  message fail before one succeeds; -1 = always fail; a message's ``fail_times`` property
  overrides it).
- ``wait_push``: ``consumer``, ``expect`` (deliveries), ``timeout_s``: returns the deliveries.
- ``wait_checks``: ``producer``, ``expect``, ``timeout_s``: the checker's calls.
- ``sleep``: ``s``. ``shutdown``: ``name``.
- ``send_each``: ``producer``, ``topic``, ``count``, ``prefix``, ``interval_s``: sync sends one
  by one that go on after failures; returns the acknowledged and the failed ones. Optional
  ``checker`` (bodies ``<prefix>:<i>:``, receipts' queue and offset kept), ``progress`` (a JSON
  lines file, one line per send as it ends) and ``stop_file`` (stop once it exists).
- ``receive`` also takes ``stop_file`` (receive until it exists; a failed receive or ack is
  counted and retried, not fatal) and ``progress``.
- ``bench_send``: ``producer``, ``topic``, ``threads``, ``count``, ``size``: sync sends from
  threads sharing one producer, latencies in ms.

A message spec: ``topic``, ``body`` (text) or ``size`` (bytes of filler), ``tag``, ``keys``,
``properties``, ``group`` (FIFO message group), ``delay_s`` (delivery time = now + delay_s,
epoch seconds as the client expects).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import traceback
from typing import Any


def _body(spec: dict[str, Any]) -> bytes:
    if "size" in spec:
        seed = spec.get("body", "x").encode()
        return (seed * (spec["size"] // max(len(seed), 1) + 1))[: spec["size"]]
    return str(spec.get("body", "body")).encode()


def _describe(msg: Any) -> dict[str, Any]:
    body = bytes(msg.body or b"")
    text: str | None
    try:
        text = body.decode() if len(body) <= 4096 else None
    except UnicodeDecodeError:
        text = None
    return {
        "topic": msg.topic,
        "message_id": msg.message_id,
        "body": text,
        "body_len": len(body),
        "body_md5": hashlib.md5(body).hexdigest(),
        "tag": msg.tag,
        "keys": sorted(msg.keys or ()),
        "properties": dict(msg.properties or {}),
        "message_group": msg.message_group,
        "delivery_attempt": msg.delivery_attempt,
        "delivery_timestamp": msg.delivery_timestamp,
        "born_timestamp": msg.born_timestamp,
        "message_type": msg.message_type,
        "corrupted": bool(msg.corrupted),
        "received_at": time.time(),
    }


def _receipt_queue(receipt: Any) -> dict[str, Any]:
    """Where a SendReceipt says the message is. The client's MessageQueue keeps broker name
    and queue id private (no property), hence the mangled names; -1 when they are absent."""
    mq = receipt.message_queue
    return {
        "broker_name": getattr(mq, "_MessageQueue__broker_name", ""),
        "queue_id": getattr(mq, "_MessageQueue__queue_id", -1),
        "offset": receipt.offset if receipt.offset is not None else -1,
    }


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__}


class Runner:
    def __init__(self, scenario: dict[str, Any]) -> None:
        import rocketmq

        self.mq = rocketmq
        self.config = rocketmq.ClientConfiguration(
            scenario["endpoint"],
            rocketmq.Credentials(scenario.get("ak", ""), scenario.get("sk", "")),
            request_timeout=scenario.get("request_timeout", 3),
        )
        self.clients: dict[str, Any] = {}
        self.checks: dict[str, list[dict[str, Any]]] = {}
        self.deliveries: dict[str, list[dict[str, Any]]] = {}

    def message(self, spec: dict[str, Any]) -> Any:
        m = self.mq.Message()
        m.topic = spec["topic"]
        m.body = _body(spec)
        if spec.get("tag"):
            m.tag = spec["tag"]
        for key in spec.get("keys", ()):
            m.keys = key  # the setter adds one key per assignment
        for k, v in spec.get("properties", {}).items():
            m.add_property(k, v)
        if spec.get("group"):
            m.message_group = spec["group"]
        if spec.get("delay_s") is not None:
            m.delivery_timestamp = int(time.time() + spec["delay_s"])
        return m

    # ------------------------------------------------------------------ steps

    def op_producer(self, step: dict[str, Any]) -> dict[str, Any]:
        checker = None
        if step.get("checker"):
            calls = self.checks.setdefault(step["name"], [])
            name = step["checker"]
            if name == "UNKNOWN":
                name = "TRANSACTION_RESOLUTION_UNSPECIFIED"
            answer = getattr(self.mq.TransactionResolution, name)

            class Checker(self.mq.TransactionChecker):  # type: ignore[name-defined,misc]
                def check(self, message: Any) -> Any:
                    calls.append(_describe(message))
                    return answer

            checker = Checker()
        producer = self.mq.Producer(self.config, tuple(step["topics"]), checker)
        producer.startup()
        self.clients[step["name"]] = producer
        return {"started": step["name"]}

    def op_send(self, step: dict[str, Any]) -> dict[str, Any]:
        producer = self.clients[step["producer"]]
        tx_mode = step.get("transaction")
        tx = producer.begin_transaction() if tx_mode else None
        receipts = []
        for spec in step["messages"]:
            msg = self.message(spec)
            if tx is not None:
                r = producer.send(msg, tx)
            elif step.get("async"):
                r = producer.send_async(msg).result(timeout=10)
            else:
                r = producer.send(msg)
            receipts.append(
                {
                    "message_id": r.message_id,
                    "offset": r.offset,
                    "transaction_id": r.transaction_id,
                    "recall_handle": r.recall_handle,
                }
            )
        if tx_mode == "commit":
            tx.commit()
        elif tx_mode == "rollback":
            tx.rollback()
        return {"receipts": receipts, "sent_at": time.time()}

    def op_simple_consumer(self, step: dict[str, Any]) -> dict[str, Any]:
        subs = {t: self.mq.FilterExpression(e) for t, e in step["topics"].items()}
        consumer = self.mq.SimpleConsumer(
            self.config, step["group"], subs, await_duration=step.get("await_s", 2)
        )
        consumer.startup()
        self.clients[step["name"]] = consumer
        return {"started": step["name"]}

    def op_receive(self, step: dict[str, Any]) -> dict[str, Any]:
        """Receive (and ack) until ``expect`` came or ``timeout_s``. With ``stop_file`` the
        loop runs until that file exists instead (``timeout_s`` stays the bound), a failed
        receive or ack is counted and retried rather than ending the run (servers are
        crashing meanwhile), and ``progress`` (a path) gets one JSON line per message."""
        consumer = self.clients[step["consumer"]]
        expect = step.get("expect", 1)
        deadline = time.monotonic() + step.get("timeout_s", 20)
        idle_s = step.get("idle_s", 0)
        stop_file = step.get("stop_file")
        got: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        calls = 0
        progress = open(step["progress"], "a") if step.get("progress") else None  # noqa: SIM115
        try:
            while True:  # at least one receive: a first one fixes a new group's start offsets
                calls += 1
                try:
                    batch = consumer.receive(step.get("max", 16), step.get("invisible_s", 15))
                except Exception as exc:
                    if not stop_file:
                        raise
                    errors.append({"at": time.time(), **_error(exc)})
                    batch = []
                    time.sleep(0.2)
                for msg in batch or []:
                    item = _describe(msg)
                    if step.get("change_invisible_s"):
                        consumer.change_invisible_duration(msg, step["change_invisible_s"])
                        item["changed"] = True
                    if step.get("ack", True):
                        try:
                            consumer.ack(msg)
                            item["acked"] = True
                        except Exception as exc:
                            if not stop_file:
                                raise
                            item["acked"] = False
                            errors.append({"at": time.time(), **_error(exc)})
                    got.append(item)
                    if progress is not None:
                        progress.write(json.dumps({"body": item["body"], "at": item["received_at"],
                                                   "acked": item.get("acked")}) + "\n")  # fmt: skip
                        progress.flush()
                if time.monotonic() >= deadline:
                    break
                if stop_file:
                    if os.path.exists(stop_file):
                        break
                    continue
                if len(got) >= expect and idle_s > 0:
                    deadline = min(deadline, time.monotonic() + idle_s)
                    idle_s = 0
                elif len(got) >= expect and idle_s <= 0:
                    break
        finally:
            if progress is not None:
                progress.close()
        return {"messages": got, "receive_calls": calls, "errors": errors}

    def op_push_consumer(self, step: dict[str, Any]) -> dict[str, Any]:
        log = self.deliveries.setdefault(step["name"], [])
        fail = step.get("fail", 0)
        ok, failure = self.mq.ConsumeResult.SUCCESS, self.mq.ConsumeResult.FAILURE
        lock = threading.Lock()

        class Listener(self.mq.MessageListener):  # type: ignore[name-defined,misc]
            def consume(self, message: Any) -> Any:
                item = _describe(message)
                times = int(item["properties"].get("fail_times", fail))
                with lock:
                    seen = sum(d["message_id"] == item["message_id"] for d in log)
                    result = failure if times < 0 or seen < times else ok
                    item["result"] = result.name
                    log.append(item)
                return result

        subs = {t: self.mq.FilterExpression(e) for t, e in step["topics"].items()}
        consumer = self.mq.PushConsumer(self.config, step["group"], Listener(), subs)
        consumer.startup()
        self.clients[step["name"]] = consumer
        return {"started": step["name"]}

    def op_wait_push(self, step: dict[str, Any]) -> dict[str, Any]:
        log = self.deliveries[step["consumer"]]
        deadline = time.monotonic() + step.get("timeout_s", 20)
        while len(log) < step["expect"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(step.get("idle_s", 0))
        return {"deliveries": list(log)}

    def op_wait_checks(self, step: dict[str, Any]) -> dict[str, Any]:
        calls = self.checks[step["producer"]]
        deadline = time.monotonic() + step.get("timeout_s", 30)
        while len(calls) < step["expect"] and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"checks": list(calls)}

    def op_sleep(self, step: dict[str, Any]) -> dict[str, Any]:
        time.sleep(step["s"])
        return {}

    def op_shutdown(self, step: dict[str, Any]) -> dict[str, Any]:
        self.clients.pop(step["name"]).shutdown()
        return {}

    def op_send_each(self, step: dict[str, Any]) -> dict[str, Any]:
        """Sync sends one by one (bodies ``<prefix>-<i>``), ``interval_s`` apart, going on
        after a failed send: which were acknowledged, which failed, while servers come and go.

        With ``checker``, bodies are ``<prefix>:<i>:`` (the identity orbitmq.testing.checker
        reads) and each result carries ``sent`` (when the send began) and where the receipt
        says the message is. ``progress`` (a path) gets one JSON line per send as it ends, so
        a test can watch; ``stop_file`` ends the loop once that file exists (``count`` stays
        the bound)."""
        producer = self.clients[step["producer"]]
        acked: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        progress = open(step["progress"], "a") if step.get("progress") else None  # noqa: SIM115
        try:
            for i in range(step["count"]):
                if step.get("stop_file") and os.path.exists(step["stop_file"]):
                    break
                body = f"{step['prefix']}:{i}:" if step.get("checker") else f"{step['prefix']}-{i}"
                sent = time.time()
                item: dict[str, Any]
                try:
                    r = producer.send(self.message({"topic": step["topic"], "body": body}))
                except Exception as exc:  # noqa: BLE001 - the point: record and go on
                    item = {"body": body, "sent": sent, "at": time.time(), **_error(exc)}
                    failed.append(item)
                else:
                    item = {"body": body, "message_id": r.message_id, "sent": sent,
                            "at": time.time(), **_receipt_queue(r)}  # fmt: skip
                    acked.append(item)
                if progress is not None:
                    progress.write(json.dumps({"ok": "error" not in item, **item}) + "\n")
                    progress.flush()
                time.sleep(step.get("interval_s", 0.0))
        finally:
            if progress is not None:
                progress.close()
        return {"acked": acked, "failed": failed}

    def op_bench_send(self, step: dict[str, Any]) -> dict[str, Any]:
        producer = self.clients[step["producer"]]
        threads, count = step.get("threads", 16), step["count"]
        spec = {"topic": step["topic"], "size": step.get("size", 1024)}
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def worker(n: int) -> None:
            mine: list[float] = []
            for _ in range(n):
                msg = self.message(spec)
                t0 = time.perf_counter()
                try:
                    producer.send(msg)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                mine.append((time.perf_counter() - t0) * 1000)
            with lock:
                latencies.extend(mine)

        shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
        pool = [threading.Thread(target=worker, args=(n,)) for n in shares]
        started = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - started
        latencies.sort()

        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))]

        return {
            "sent": len(latencies),
            "errors": len(errors),
            "first_error": errors[0] if errors else None,
            "seconds": seconds,
            "p50_ms": pct(50) if latencies else None,
            "p99_ms": pct(99) if latencies else None,
        }

    # ------------------------------------------------------------------ driver

    def run(self, step: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, f"op_{step['op']}")
        try:
            result = handler(step)
        except Exception as exc:
            if not step.get("expect_error"):
                raise
            return _error(exc)
        if step.get("expect_error"):
            return {"error": None, **result}
        return result

    def close(self) -> None:
        """Shut every client down, each with a time limit: a push consumer's shutdown can hang
        (a known client bug when a nack fails), and the results matter more."""
        for name, client in reversed(list(self.clients.items())):
            t = threading.Thread(target=_shutdown, args=(name, client), daemon=True)
            t.start()
            t.join(SHUTDOWN_TIMEOUT_S)
            if t.is_alive():
                print(f"shutdown of {name} did not end in {SHUTDOWN_TIMEOUT_S} s", file=sys.stderr)


SHUTDOWN_TIMEOUT_S = 10.0


def _shutdown(name: str, client: Any) -> None:
    try:
        client.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        print(f"shutdown of {name} failed: {exc}", file=sys.stderr)


def main() -> int:
    scenario = json.load(sys.stdin)
    results: list[dict[str, Any]] = []
    out: dict[str, Any] = {"results": results}
    runner = None
    try:
        runner = Runner(scenario)
        for step in scenario["steps"]:
            started = time.monotonic()
            result = runner.run(step)
            result["op"] = step["op"]
            result["seconds"] = round(time.monotonic() - started, 3)
            results.append(result)
    except Exception as exc:  # noqa: BLE001 - reported to the test as data
        out.update(failed=len(results), traceback=traceback.format_exc(), **_error(exc))
    finally:
        if runner is not None:
            runner.close()
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the client may leave non-daemon threads behind; the results are out
