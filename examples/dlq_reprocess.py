"""Batch: fix a consumer group's dead letters and send them back to their topic.

What it shows
    A batch read of a dead-letter queue (``%DLQ%<group>``) with ``spark.read.format("orbitmq")``,
    the original topic taken from each dead letter's ``DLQ_ORIGIN_TOPIC`` property, the bodies
    repaired with a Spark expression, and a batch write (``df.write.format("orbitmq")``) of the
    fixed messages to their original topics, with their tags, keys and user properties. The
    job is ``orbitmq.spark.pipelines.dlq_reprocess``, the same code as
    ``orbitmq pipeline dlq-reprocess``.

    The story: a producer misspelt a field ("amout"), the ``billing`` consumers rejected those
    messages, and after their retries (none here: the consumer's limit is 0) the broker moved
    them to ``%DLQ%billing``. Spark fixes the field name and resends them; the consumers can
    now process them.

How to run
    pip install 'orbitmq[spark]'      # Spark needs Java 17+
    make up                           # in another terminal: an OrbitMQ on 127.0.0.1:9876
    python examples/dlq_reprocess.py --namesrv 127.0.0.1:9876

    It sends sample invoices to ``invoices`` (some misspelt), runs a ``billing`` consumer that
    rejects the misspelt ones until they are dead-lettered, then reprocesses the DLQ and shows
    the fixed messages back in ``invoices``. ``--no-sample`` skips the first two steps and
    reprocesses whatever the group's DLQ holds.

The same job from the shell:
    orbitmq pipeline dlq-reprocess --group billing --fix "replace(body, '\\"amout\\"', '\\"amount\\"')"
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from orbitmq.client import (
    BlockingAdminClient,
    ConsumedMessage,
    ConsumeFromWhere,
    ConsumeResult,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)
from orbitmq.client.consumer.config import PushConfig
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.spark import pipelines
from orbitmq.spark.session import SessionOptions, build_session

FIX = """replace(body, '"amout"', '"amount"')"""
"""The repair, a Spark SQL expression over the body text (a Python function of the ``body``
Column works too, e.g. ``lambda body: F.regexp_replace(body, '"amout"', '"amount"')``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", default="127.0.0.1:9876", help="NameServer host:port")
    p.add_argument("--topic", default="invoices", help="the topic the consumers read")
    p.add_argument("--group", default="billing", help="the consumer group")
    p.add_argument("--invoices", type=int, default=20, help="sample invoices (1 in 4 misspelt)")
    p.add_argument("--no-sample", action="store_true", help="only reprocess the DLQ")
    p.add_argument("--master", default="local[*]", help="Spark master")
    return p.parse_args(argv)


def dlq_end(namesrv: str, group: str) -> str:
    """Where the group's DLQ ends now, as ``startingOffsets`` JSON ("earliest" if it has none
    yet): reprocessing then takes only the dead letters this run makes."""
    topic = pipelines.dlq_topic(group)
    with BlockingAdminClient(namesrv) as admin:
        try:
            route = admin.topic_route(topic)
        except TopicRouteNotFoundError:
            return "earliest"
        ends = {}
        for qd in route.queue_datas:  # a DLQ is write-only: its write queues are its queues
            for qid in range(qd.write_queue_nums):
                mq = MessageQueue(topic, qd.broker_name, qid)
                ends[f"{qd.broker_name}/{qid}"] = admin.max_offset(mq)
    return json.dumps({topic: ends}) if ends else "earliest"


def send_invoices(namesrv: str, topic: str, n: int) -> list[dict[str, Any]]:
    """``n`` invoices; every fourth spells ``amount`` as ``amout``."""
    invoices = []
    with Producer(namesrv) as producer:
        for i in range(n):
            field = "amout" if i % 4 == 0 else "amount"
            invoice = {"invoice": f"INV-{i:04d}", field: 10 * i + 5}
            producer.send(
                Message(topic, json.dumps(invoice).encode(), tags="invoice", keys=[f"INV-{i:04d}"])
            )
            invoices.append(invoice)
    return invoices


def reject_misspelt(namesrv: str, topic: str, group: str, expect: int, timeout_s: float) -> int:
    """Run the group's consumer until it has rejected ``expect`` misspelt invoices. With
    ``max_reconsume_times=0`` a rejected message goes straight to ``%DLQ%<group>``."""
    rejected: set[str] = set()

    def listener(msgs: list[ConsumedMessage]) -> ConsumeResult:
        for m in msgs:
            if "amount" not in json.loads(m.body):
                rejected.add(m.message.msg_id or "")
                return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        namesrv,
        group,
        PushConfig(
            max_reconsume_times=0,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            rebalance_interval_s=1.0,
        ),
    )
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while len(rejected) < expect and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        consumer.shutdown()
    return len(rejected)


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Make dead letters (unless --no-sample), reprocess them, show them back in the topic."""
    since = "earliest"
    invoices: list[dict[str, Any]] = []
    if not args.no_sample:
        since = dlq_end(args.namesrv, args.group)
        invoices = send_invoices(args.namesrv, args.topic, args.invoices)
        bad = sum("amout" in i for i in invoices)
        n = reject_misspelt(args.namesrv, args.topic, args.group, bad, timeout_s=60)
        print(f"sent {len(invoices)} invoices; the {args.group} consumers dead-lettered {n}")
    result = pipelines.dlq_reprocess(
        spark, namesrv=args.namesrv, group=args.group, fix=FIX, starting_offsets=since
    )
    for topic, count in result.resent.items():
        print(f"resent {count} fixed messages to {topic}")
    print(f"next time, to skip these: starting_offsets={result.next_offsets}")
    return {"invoices": invoices, "result": result}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = build_session(SessionOptions(master=args.master, app_name="orbitmq-example-dlq"))
    try:
        run(spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
