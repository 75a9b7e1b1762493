"""``python -m tests.compat.broker_main <broker options> --tx-timeout-ms N --tx-check-interval-ms N``:
the broker the compat tests run, with short transaction check-back timings (the check-back test
would otherwise wait 6 s plus up to 30 s) and topic message types enforced."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from orbitmq.broker.__main__ import parse, serve
from orbitmq.net.loop import run


def main(argv: list[str]) -> None:
    extra = argparse.ArgumentParser()
    extra.add_argument("--tx-timeout-ms", type=int, required=True)
    extra.add_argument("--tx-check-interval-ms", type=int, required=True)
    ours, rest = extra.parse_known_args(argv)
    config = dataclasses.replace(
        parse(rest),
        transaction_timeout_ms=ours.tx_timeout_ms,
        transaction_check_interval_ms=ours.tx_check_interval_ms,
        enforce_topic_message_type=True,
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
