"""``python -m tests.controller.node_main '<ControllerConfig as JSON>'``: one controller node as a
process, for the integration tests (the CLI's ``orbitmq controller`` is wired by the lead)."""

from __future__ import annotations

import json
import logging
import sys

from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.server import run_standalone

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    fields = json.loads(sys.argv[1])
    fields["peers"] = tuple(fields.get("peers", ()))
    sys.exit(run_standalone(ControllerConfig(**fields)))
