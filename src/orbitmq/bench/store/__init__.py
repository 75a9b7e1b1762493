"""Storage-engine benchmark: `python -m orbitmq.bench store` (later `orbitmq bench store`).

Cases (``--only`` takes names or group prefixes, e.g. ``--only append,read-hot``):

    append-b1 / append-b32 / append-b256   one thread, ASYNC_FLUSH, 1 KiB bodies, batch 1/32/256
    sync-t1 / sync-t64                      SYNC_FLUSH, 1 or 64 threads, each put one message
                                            and waits for its fsync (group commit)
    read-hot-m32 / read-hot-m256            sequential read by queue offset right after
                                            appending (records are trusted: no CRC check)
    read-reopen-m32 / read-reopen-m256      the same after close and reopen (CRC verified)
    recovery                                a child fills the CommitLog with ASYNC_FLUSH, keeps
                                            appending and is SIGKILLed; time MessageStore.open()

Every case runs ``runs`` times; the report gives the median with min and max. Timings are wall
clock (``time.perf_counter``) around the measured calls only: building batches, opening and
closing stores and dispatch catch-up are outside the timed window (catch-up is reported).

A CLI calls :func:`run_store_bench` with :class:`StoreBenchOptions` and prints
:func:`format_report`; :func:`add_arguments` and :func:`options_from_args` give it the same
flags as ``python -m orbitmq.bench store``.

The package: :mod:`.model` (cases, options, results), :mod:`.cases` (the measured cases),
:mod:`.recovery` (the SIGKILL child and the timed reopen), :mod:`.report` (text and Markdown)
and :mod:`.run` (the driver and the command line); every public name is re-exported here.
"""

from orbitmq.bench.store.model import (
    ALL_CASES,
    APPEND_CASES,
    ASYNC_SYNC_CASES,
    BODY_SIZE,
    DEFAULT_COUNTS,
    DESCRIPTIONS,
    READ_CASES,
    SYNC_CASES,
    TARGETS,
    TOPIC,
    CaseResult,
    Progress,
    RunSample,
    StoreBenchOptions,
    StoreBenchResults,
)
from orbitmq.bench.store.report import TABLE_HEADER, format_markdown, format_report, table_rows
from orbitmq.bench.store.run import add_arguments, main, options_from_args, run_store_bench

__all__ = [
    "ALL_CASES",
    "APPEND_CASES",
    "ASYNC_SYNC_CASES",
    "BODY_SIZE",
    "DEFAULT_COUNTS",
    "DESCRIPTIONS",
    "READ_CASES",
    "SYNC_CASES",
    "TABLE_HEADER",
    "TARGETS",
    "TOPIC",
    "CaseResult",
    "Progress",
    "RunSample",
    "StoreBenchOptions",
    "StoreBenchResults",
    "add_arguments",
    "format_markdown",
    "format_report",
    "main",
    "options_from_args",
    "run_store_bench",
    "table_rows",
]
