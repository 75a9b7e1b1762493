"""Users and ACLs as replicated Raft state (``[controller] auth_store = "raft"``; docs/security.md,
"Users and ACLs in the controller quorum").

- :func:`raft_auth_store`: the node's :class:`~orbitmq.auth.document.DocumentAuthStore` over
  ``ControllerState.auth``. A change (an admin code 3001-3010 answered by this node, or the
  Super-user bootstrap) is the compare-and-set command ``set_auth_data``; pysyncobj forwards a
  follower's command to the leader, so any node takes changes. It blocks until the command is
  applied here: call it from a worker thread, never on the event loop.
- :func:`auth_data_answer`: CONTROLLER_GET_AUTH_DATA, answered by any node from its applied
  state (a follower is behind the leader by one Raft round trip, milliseconds).
- :func:`bootstrap`: once a leader exists, make sure a Super user exists (ORBITMQ_AUTH_ADMIN_SECRET
  or a generated secret printed once by the node whose command created it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON

from orbitmq.auth.document import Conflict, DocumentAuthStore
from orbitmq.auth.model import ConfigurationError
from orbitmq.auth.server import bootstrap_admin
from orbitmq.auth.store import load_key
from orbitmq.common.codes import ResponseCode
from orbitmq.controller.config import ControllerConfig
from orbitmq.controller.raft import RaftNode
from orbitmq.controller.state import Outcome
from orbitmq.protocol.frame import Frame

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 5.0


def key_path(config: ControllerConfig) -> Path:
    """Where the sealing key is looked for when ORBITMQ_AUTH_KEY is not set."""
    return Path(config.auth_file) if config.auth_file else Path(config.data_dir) / "auth.json"


def raft_auth_store(config: ControllerConfig, raft: RaftNode) -> DocumentAuthStore:
    key = load_key(key_path(config))

    def commit(expected: int, document: dict[str, Any]) -> None:
        done = threading.Event()
        result: list[Any] = []

        def callback(outcome: Any, err: int) -> None:
            result.append((outcome, err))
            done.set()

        raft.submit_callback("set_auth_data", (expected, document), callback)
        if not done.wait(COMMIT_TIMEOUT_S):
            raise ConfigurationError("the change did not commit in time: its outcome is unknown")
        outcome, err = result[0]
        if err != FAIL_REASON.SUCCESS:
            raise ConfigurationError(f"the change did not commit (Raft: {err}): retry")
        assert isinstance(outcome, Outcome)
        if outcome.code == ResponseCode.SYSTEM_BUSY:
            raise Conflict(outcome.remark)
        if not outcome.ok:
            raise ConfigurationError(outcome.remark)

    return DocumentAuthStore(f"raft:{config.raft_address}", key, raft.state.auth_data, commit)


def auth_data_answer(request: Frame, raft: RaftNode) -> Frame:
    version, document = raft.state.auth_data()
    try:
        known = int(request.fields.get("version", -1))
    except (TypeError, ValueError):
        known = -1
    if known == version:
        return request.reply(ResponseCode.SUCCESS, fields={"version": version})
    body = json.dumps(document, sort_keys=True).encode("utf-8")
    return request.reply(ResponseCode.SUCCESS, fields={"version": version}, body=body)


async def bootstrap(store: DocumentAuthStore, raft: RaftNode, attempts: int = 60) -> None:
    """Give the replicated store its first Super user once Raft has a leader (bounded: about a
    minute of retries, logged when it gives up)."""
    for _ in range(attempts):
        if raft.leader() is not None:
            try:
                await asyncio.to_thread(bootstrap_admin, store)
                return
            except ConfigurationError as exc:
                log.info("controller: auth bootstrap not yet: %s", exc)
        await asyncio.sleep(1.0)
    log.error("controller: no Super user could be created in the replicated auth store")
