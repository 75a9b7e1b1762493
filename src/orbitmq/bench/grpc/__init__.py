"""gRPC proxy benchmark: ``orbitmq bench grpc``. The official Apache RocketMQ 5 Python client
(PyPI ``rocketmq-python-client``, unmodified) against OrbitMQ's gRPC proxy, and the same workload
through the native SDK (Remoting, straight to the broker), side by side in one run.

Workload, per side and run: a new consumer group is primed (one receive fixes where it starts),
then ``--threads`` threads share one producer and each sends its share of ``--count`` messages of
``--size`` bytes with *sync* sends (latency: the round trip of one send); then
``--receive-threads`` threads share one SimpleConsumer and receive batches of up to 32 and ack
each message with a sync ``ack`` until every message sent is back (the official client has no
batch ack and its ``ack_async`` is unusable in 5.1.2, so the native side acks one by one too).
Each side has its own topic (``<topic>Grpc`` / ``<topic>Native``, 8 queues) so a group sees only
its side's messages.

Besides latency and throughput it reports CPU time per message: of each client process over its
send phase, and of the proxy over the official client's whole side when the benchmark started the
proxy. On a shared machine throughput moves with the load; CPU per message says where time goes.

The official client runs in a child process (``python -m orbitmq.bench.grpc --worker``): its
generated protobuf modules cannot share a process with the proxy's, and it configures logging and
writes its log under ``$HOME/logs/rocketmq_python/`` (HOME is pointed at the benchmark's own
folder, kept when something fails, and the error names the log). The native side runs in this
process. Sides run one after the other, never at once.

Without ``--namesrv``/``--proxy`` the benchmark starts a NameServer + Broker (``orbitmq up``) and a
proxy (``python -m orbitmq proxy``) on 127.0.0.1 free ports, data in a temporary folder, and stops
them by pid at the end. Targets (issue #7): the proxy adds < 1 ms to the p50 of a sync send, and
the official client sustains >= 5,000 sync sends/s from 16 threads.

The package: :mod:`.model` (workload, options, results), :mod:`.sides` (the native and the
official side, and the child's entry point, run by ``__main__``) and :mod:`.run` (targets,
driver, report); every public name is re-exported here.
"""

from orbitmq.bench.grpc.model import (
    AWAIT_S,
    DEFAULT_COUNT,
    DEFAULT_RECEIVE_THREADS,
    DEFAULT_RUNS,
    DEFAULT_THREADS,
    DEFAULT_TOPIC,
    INVISIBLE_S,
    PROXY_READY,
    QUEUES,
    RECEIVE_BATCH,
    RECEIVE_TIMEOUT_S,
    ROUTE_WAIT_S,
    TARGET_GRPC_SENDS_PER_S,
    TARGET_P50_OVERHEAD_MS,
    WARMUP_PER_THREAD,
    WORKER_TIMEOUT_S,
    GrpcBenchOptions,
    GrpcBenchResult,
    Say,
    SideResult,
    percentiles,
)
from orbitmq.bench.grpc.run import format_report, run_grpc_bench, target
from orbitmq.bench.grpc.sides import (
    client_version,
    official_worker,
    run_native_side,
    run_official_side,
    worker_main,
)

__all__ = [
    "AWAIT_S",
    "DEFAULT_COUNT",
    "DEFAULT_RECEIVE_THREADS",
    "DEFAULT_RUNS",
    "DEFAULT_THREADS",
    "DEFAULT_TOPIC",
    "INVISIBLE_S",
    "PROXY_READY",
    "QUEUES",
    "RECEIVE_BATCH",
    "RECEIVE_TIMEOUT_S",
    "ROUTE_WAIT_S",
    "TARGET_GRPC_SENDS_PER_S",
    "TARGET_P50_OVERHEAD_MS",
    "WARMUP_PER_THREAD",
    "WORKER_TIMEOUT_S",
    "GrpcBenchOptions",
    "GrpcBenchResult",
    "Say",
    "SideResult",
    "client_version",
    "format_report",
    "official_worker",
    "percentiles",
    "run_grpc_bench",
    "run_native_side",
    "run_official_side",
    "target",
    "worker_main",
]
