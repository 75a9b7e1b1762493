"""Streaming: archive a topic into Parquet files partitioned by date.

What it shows
    A topic read with ``spark.readStream.format("orbitmq")`` and written by Spark's file sink
    as Parquet, one ``date=YYYY-MM-DD`` folder per UTC day the broker stored the messages,
    every source column kept (key, value, tags, properties, timestamps, msg_id, ...). With
    ``trigger(availableNow=True)`` it is a cron-friendly job: each run archives what arrived
    since the last one, and the checkpoint makes sure no message is archived twice or
    skipped. The job is ``orbitmq.spark.pipelines.archive``, the same code as
    ``orbitmq pipeline archive``.

How to run
    pip install 'orbitmq[spark]'      # Spark needs Java 17+
    make up                           # in another terminal: an OrbitMQ on 127.0.0.1:9876
    python examples/archive_parquet.py --namesrv 127.0.0.1:9876

    It sends sample messages to ``clicks`` (``--no-sample``: only archive what is there),
    archives the topic to ``./orbitmq-archive/clicks`` (checkpoint in its ``_checkpoint``
    folder) and prints the rows per date folder. Run it again: only the new messages are
    added. ``--continuous`` keeps archiving until Ctrl-C.

The same job from the shell:
    orbitmq pipeline archive --topic clicks --to ./orbitmq-archive/clicks
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from orbitmq.client import Message, Producer
from orbitmq.spark import pipelines
from orbitmq.spark.session import SessionOptions, build_session


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", default="127.0.0.1:9876", help="NameServer host:port")
    p.add_argument("--topic", default="clicks", help="topic to archive")
    p.add_argument("--to", default=None, help="archive folder (default ./orbitmq-archive/TOPIC)")
    p.add_argument("--messages", type=int, default=100, help="sample messages to send first")
    p.add_argument("--no-sample", action="store_true", help="send no sample messages")
    p.add_argument("--continuous", action="store_true", help="run until Ctrl-C")
    p.add_argument("--master", default="local[*]", help="Spark master")
    return p.parse_args(argv)


def send_sample(namesrv: str, topic: str, n: int) -> list[str]:
    """``n`` click events; their message ids."""
    rnd = random.Random()
    pages = ["/", "/pricing", "/docs", "/blog"]
    ids = []
    with Producer(namesrv) as producer:
        for i in range(n):
            body = json.dumps({"page": rnd.choice(pages), "n": i}).encode()
            ids.append(producer.send(Message(topic, body, tags="click")).msg_id)
    return ids


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Send the sample, archive, summarise the archive. Returns what a test checks."""
    path = args.to or str(Path("orbitmq-archive") / args.topic)
    sent: list[str] = []
    if not args.no_sample:
        sent = send_sample(args.namesrv, args.topic, args.messages)
        print(f"sent {len(sent)} messages to {args.topic}")
    query = pipelines.archive(
        spark,
        namesrv=args.namesrv,
        topic=args.topic,
        path=path,
        mode=pipelines.continuous() if args.continuous else pipelines.AVAILABLE_NOW,
    )
    pipelines.run_query(query)
    archived = spark.read.parquet(path)
    per_date = {str(r["date"]): int(r["count"]) for r in archived.groupBy("date").count().collect()}
    for date, count in sorted(per_date.items()):
        print(f"{path}/date={date}: {count} messages")
    return {"path": path, "sent": sent, "per_date": per_date}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = build_session(SessionOptions(master=args.master, app_name="orbitmq-example-archive"))
    try:
        run(spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
