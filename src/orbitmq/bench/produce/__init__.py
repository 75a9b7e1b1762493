"""Producer benchmark against a running cluster: ``orbitmq bench produce`` or
``python -m orbitmq.bench produce`` (in the spirit of kafka-producer-perf-test and nats bench).

``--producers N`` starts N producer processes (multiprocessing, spawn) so several cores can
send; with 1 the producer runs in this process. Each producer warms up (route, one message to
every broker of the topic, not counted), waits for a common start signal, then sends its share
of ``--count`` messages (or sends for ``--duration`` seconds) with ``--size``-byte bodies:

    async   ``send_async``: the producer batches automatically (``--batch 0``) and at most
            ``--window`` messages per producer are unanswered; with ``--batch B`` explicit
            ``send_batch`` calls of B messages, up to window/B in flight.
            Latency: from handing a message over to its result (enqueue to result).
    sync    one ``send`` (or ``send_batch`` of B) at a time. Latency: the round trip.
    oneway  one ``send_oneway`` at a time, no answer. Latency: the call (a socket write).

``--api blocking`` sends through the blocking ``Producer`` from a plain thread instead of
``AsyncProducer`` on an event loop (:mod:`.blocking`); the report's client CPU per message
(the producer process's CPU time over the messages answered) compares the two.

Throughput is messages answered (sent, for oneway) over the longest producer's time from the
start signal to its last answer. Latencies go to an HdrHistogram per producer (microseconds,
3 significant digits), merged for the report. The broker side is reported too: each broker's
flush mode (GET_BROKER_RUNTIME_INFO ``flush_disk_type``) and how many messages the topic's
queues grew by (``stored``: for oneway, shows what arrived).

``--queues N`` creates the topic (or resets its queue count) with N queues per broker; without
it an existing topic is used as it is and a missing one is created with 8.

A CLI calls :func:`run_produce_bench` with :class:`ProduceBenchOptions` and prints
:func:`format_report`.

The package: :mod:`.model` (defaults, options, results), :mod:`.worker` (one producer and the
producer processes), :mod:`.blocking` (one producer through the blocking API) and :mod:`.run`
(broker side, driver, report, command line); every public name is re-exported here.
"""

from orbitmq.bench.produce.model import (
    APIS,
    DEFAULT_COUNT,
    DEFAULT_QUEUES,
    DEFAULT_TOPIC,
    HIST_MAX_US,
    MAX_ERRORS,
    MODES,
    PERCENTILES,
    STARTUP_TIMEOUT_S,
    STORED_WAIT_S,
    ProduceBenchOptions,
    ProduceBenchResult,
    Progress,
    WorkerResult,
    new_histogram,
)
from orbitmq.bench.produce.run import (
    add_arguments,
    format_report,
    main,
    options_from_args,
    run_produce_bench,
)
from orbitmq.bench.produce.worker import produce

__all__ = [
    "APIS",
    "DEFAULT_COUNT",
    "DEFAULT_QUEUES",
    "DEFAULT_TOPIC",
    "HIST_MAX_US",
    "MAX_ERRORS",
    "MODES",
    "PERCENTILES",
    "STARTUP_TIMEOUT_S",
    "STORED_WAIT_S",
    "ProduceBenchOptions",
    "ProduceBenchResult",
    "Progress",
    "WorkerResult",
    "add_arguments",
    "format_report",
    "main",
    "new_histogram",
    "options_from_args",
    "produce",
    "run_produce_bench",
]
