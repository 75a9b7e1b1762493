"""Ready-made Spark jobs on the ``orbitmq`` format: what ``orbitmq pipeline`` runs and what the
scripts in ``examples/`` call, so the two never drift apart (docs/spark.md, "Pipelines").

- :func:`aggregate`: JSON events from a topic, counted (and summed) per event-time window with a
  watermark, results as JSON messages to another topic.
- :func:`archive`: a topic into Parquet files partitioned by ``date=YYYY-MM-DD``.
- :func:`dlq_reprocess`: a consumer group's dead-letter queue read in batch, the bodies fixed by
  a Spark expression, each message sent back to the topic it was first sent to.

The streaming jobs run either until the data present at start is processed
(:data:`AVAILABLE_NOW`: a cron job or a backfill) or for ever (:func:`continuous`). Either way
the checkpoint folder is the job's memory: rerun the same command and it continues where it
stopped, with no message read twice (the source is exactly-once) and, for the topic sink, no
message written twice per micro-batch.

Every function takes the SparkSession from its caller (see :mod:`orbitmq.spark.session`) and
imports pyspark lazily, so the CLI can import this package to show its help without Spark.
One module per job (:mod:`.aggregation`, :mod:`.archiving`, :mod:`.dlq`) on the shared run
modes and readers of :mod:`.running`; every public name is re-exported here.
"""

from orbitmq.spark.pipelines.aggregation import (
    WindowSpec,
    aggregate,
    aggregate_frame,
    parse_json,
    to_messages,
    windowed_aggregation,
)
from orbitmq.spark.pipelines.archiving import archive, archive_frame
from orbitmq.spark.pipelines.dlq import (
    PROPERTY_REPROCESSED_FROM,
    DlqResult,
    dlq_frame,
    dlq_reprocess,
    dlq_topic,
    ensure_dlq_readable,
)
from orbitmq.spark.pipelines.running import (
    AVAILABLE_NOW,
    FORMAT,
    RunMode,
    continuous,
    read_batch,
    read_stream,
    run_query,
)

__all__ = [
    "AVAILABLE_NOW",
    "FORMAT",
    "PROPERTY_REPROCESSED_FROM",
    "DlqResult",
    "RunMode",
    "WindowSpec",
    "aggregate",
    "aggregate_frame",
    "archive",
    "archive_frame",
    "continuous",
    "dlq_frame",
    "dlq_reprocess",
    "dlq_topic",
    "ensure_dlq_readable",
    "parse_json",
    "read_batch",
    "read_stream",
    "run_query",
    "to_messages",
    "windowed_aggregation",
]
