"""Streaming: JSON events from a topic -> per-minute totals per user (watermark) -> a topic.

What it shows
    Reading a topic with Spark Structured Streaming (``format("orbitmq")``), parsing the
    bodies with ``from_json``, a tumbling event-time window with a watermark, and writing one
    JSON result per closed window to another topic with the exactly-once streaming sink.
    The job itself is ``orbitmq.spark.pipelines.aggregate``, the same code as
    ``orbitmq pipeline aggregate``.

How to run
    pip install 'orbitmq[spark]'      # Spark needs Java 17+
    make up                           # in another terminal: an OrbitMQ on 127.0.0.1:9876
    python examples/windowed_aggregation.py --namesrv 127.0.0.1:9876

    It sends a few sample order events to ``orders`` (``--no-sample``: use what is there),
    processes everything that arrived since it started (``trigger(availableNow=True)``), and
    prints the results it wrote to ``orders-per-minute``. ``--continuous`` keeps it running
    (Ctrl-C stops it); ``--checkpoint DIR`` makes a job you can stop and resume.

The same job from the shell:
    orbitmq pipeline aggregate --topic orders --to orders-per-minute \\
        --schema 'user STRING, amount DOUBLE, ts TIMESTAMP' --time-field ts \\
        --group-by user --sum amount --window '1 minute' --watermark '1 minute'
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import tempfile
from typing import Any

from orbitmq.client import BlockingAdminClient, Message, Producer
from orbitmq.client.route import TopicRouteNotFoundError
from orbitmq.spark import pipelines
from orbitmq.spark.session import SessionOptions, build_session

SCHEMA = "user STRING, amount DOUBLE, ts TIMESTAMP"
SPEC = pipelines.WindowSpec(
    schema=SCHEMA,
    time_field="ts",
    window="1 minute",
    watermark="1 minute",
    group_by=("user",),
    sums=("amount",),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", default="127.0.0.1:9876", help="NameServer host:port")
    p.add_argument("--topic", default="orders", help="topic of JSON order events")
    p.add_argument("--to", default="orders-per-minute", help="topic for the results")
    p.add_argument("--events", type=int, default=40, help="sample events to send first")
    p.add_argument("--no-sample", action="store_true", help="send no sample events")
    p.add_argument("--seed", type=int, default=None, help="seed of the sample events")
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: a temp one)")
    p.add_argument("--continuous", action="store_true", help="run until Ctrl-C")
    p.add_argument("--master", default="local[*]", help="Spark master")
    return p.parse_args(argv)


def end_offsets(namesrv: str, topic: str) -> str:
    """The topic's current end, as ``startingOffsets`` JSON ("earliest" if it has no queue
    yet): the job then reads only what is sent after this moment."""
    with BlockingAdminClient(namesrv) as admin:
        try:
            queues = admin.queues(topic)
        except TopicRouteNotFoundError:
            return "earliest"
        ends = {f"{q.broker_name}/{q.queue_id}": admin.max_offset(q) for q in queues}
    return json.dumps({topic: ends}) if ends else "earliest"


def sample_events(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` orders spread over the 2 minutes that ended a minute ago, then one order "now":
    its time moves the watermark past both minutes, so their results are final."""
    rnd = random.Random(seed)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    start = now.replace(second=0) - dt.timedelta(minutes=3)
    events = [
        {
            "user": rnd.choice(["ann", "bob", "cho"]),
            "amount": round(rnd.uniform(1, 100), 2),
            "ts": (start + dt.timedelta(seconds=rnd.randrange(120))).isoformat(),
        }
        for _ in range(n)
    ]
    events.append({"user": "ann", "amount": 1.0, "ts": now.isoformat()})
    return events


def expected_results(events: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, float]]:
    """What the job must write, computed in plain Python: (window start, user) -> (count, sum)
    for every minute the watermark closed (all but the newest event's)."""
    newest = max(dt.datetime.fromisoformat(e["ts"]) for e in events)
    watermark = newest - dt.timedelta(minutes=1)
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for e in events:
        ts = dt.datetime.fromisoformat(e["ts"])
        window = ts.replace(second=0)
        if window + dt.timedelta(minutes=1) > watermark:
            continue  # still open
        key = (window.strftime("%Y-%m-%dT%H:%M:%S.000Z"), e["user"])  # as to_json writes it
        count, total = out.get(key, (0, 0.0))
        out[key] = (count + 1, total + e["amount"])
    return out


def send(namesrv: str, topic: str, events: list[dict[str, Any]]) -> None:
    with Producer(namesrv) as producer:
        for e in events:
            producer.send(Message(topic, json.dumps(e).encode(), keys=[e["user"]]))


def results(spark: Any, namesrv: str, topic: str, since: str) -> list[dict[str, Any]]:
    """The result messages written since ``since`` (a batch read), oldest window first."""
    frame = pipelines.read_batch(spark, namesrv, topic, starting_offsets=since)
    rows = [
        json.loads(r["value"]) for r in frame.selectExpr("cast(value as string) value").collect()
    ]
    return sorted(rows, key=lambda r: (r["window_start"], r["user"]))


def run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Send the sample, run the job, read the results back. Returns what a test checks."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    events: list[dict[str, Any]] = []
    since = "earliest"
    if not args.no_sample:
        since = end_offsets(args.namesrv, args.topic)
        events = sample_events(args.events, seed)
        send(args.namesrv, args.topic, events)
        print(f"sent {len(events)} events to {args.topic} (seed {seed})")
    results_since = end_offsets(args.namesrv, args.to)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="orbitmq-aggregation-")
    try:
        query = pipelines.aggregate(
            spark,
            namesrv=args.namesrv,
            topic=args.topic,
            to_topic=args.to,
            spec=SPEC,
            checkpoint=checkpoint,
            mode=pipelines.continuous() if args.continuous else pipelines.AVAILABLE_NOW,
            starting_offsets=since,
        )
        pipelines.run_query(query)
    finally:
        if args.checkpoint is None:
            shutil.rmtree(checkpoint, ignore_errors=True)
    written = results(spark, args.namesrv, args.to, results_since)
    for r in written:
        print(
            f"{r['window_start']}  {r['user']:<4} {r['count']:>3} orders  {r['sum_amount']:>9.2f}"
        )
    print(f"{len(written)} results in {args.to}")
    return {"events": events, "results": written, "seed": seed}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = build_session(
        SessionOptions(master=args.master, app_name="orbitmq-example-aggregation")
    )
    try:
        run(spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
