"""The child program of the truncation crash test: open a store, cut it, SIGKILL itself.

Run as ``python -m tests.crash.truncator --store DIR --cut OFFSET --at STEP [--appends N]``
with the repository root as the working directory. ``STEP`` is one of
:data:`orbitmq.store.truncate.STEPS` (the process kills itself there, inside ``truncate_to``)
or ``after``: the truncation completes, ``N`` batches are appended, each reported on stdout as
``ACK <json>`` once ``put`` returned, and then the process kills itself. Kill by signal, with no
cleanup of any kind: what the store leaves is what a crash leaves.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
from pathlib import Path

from orbitmq.store.message_store import MessageStore
from tests.store.hastore import Writer, ha_config


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--cut", type=int, required=True)
    parser.add_argument("--at", required=True)
    parser.add_argument("--appends", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    store = MessageStore(ha_config(args.store))
    store.open()
    store.truncate_to(args.cut, step=lambda name: _die() if name == args.at else None)
    w = Writer(random.Random(args.seed), n=10**6)  # bodies distinct from the parent's
    for _ in range(args.appends):
        for s in w.append(store):
            line = json.dumps([s.topic, s.qid, s.qoff, s.phy, s.end, s.body.decode(), s.key])
            os.write(1, f"ACK {line}\n".encode())
    _die()


if __name__ == "__main__":
    main()
    sys.exit(1)  # not reached
