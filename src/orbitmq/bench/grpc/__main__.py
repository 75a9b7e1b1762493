"""``python -m orbitmq.bench.grpc --worker``: the official client's side of the benchmark, in a
child process of its own (its generated protobuf modules cannot share a process with the
proxy's). Reads the workload as JSON on stdin, writes the result as JSON on stdout.
"""

from __future__ import annotations

import os
import sys

from orbitmq.bench.grpc.sides import worker_main

if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    code = worker_main()
    sys.stderr.flush()
    os._exit(code)  # the official client may leave non-daemon threads behind
