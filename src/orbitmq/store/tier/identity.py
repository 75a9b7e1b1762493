"""The tier's identity: a store never mistakes an unreachable tier for an empty one.

A directory tier whose disk is not mounted shows an empty folder, and a wrong bucket or prefix
an empty listing: both look like a tier that holds nothing. Loading such a catalog would be
unsafe: queues would restart at their local minimum (consumers below it moved past data the
real tier holds), and the next upload would overwrite the real manifests with ones that no
longer name the cold chunks (which orphan removal then deletes). So the tier carries a marker
object, ``orbitmq-tier.json`` (a random id), and the store keeps the id it has written to in
``<store_path>/tier.id``:

- neither exists: a new tier; the marker is written, then the local id.
- the marker exists, the local id does not (a new or wiped store, ``--tier-restore``, or a
  store from before markers): the store adopts the marker's id.
- both exist and agree: the tier is the one this store wrote to.
- the local id exists and the marker does not, or they differ: the tier is not the one this
  store wrote to (not mounted, wrong bucket or prefix). :class:`TierUnavailableError`: the
  tier thread retries, cold reads are retryable errors and retention deletes nothing. To start
  over on an empty tier on purpose, delete ``tier.id``.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from orbitmq.common.errors import TierUnavailableError
from orbitmq.store.tier.backend import TierBackend

MARKER = "orbitmq-tier.json"
LOCAL_FILE = "tier.id"


def _marker_id(backend: TierBackend) -> str | None:
    if MARKER not in backend.list(MARKER):
        return None
    return str(json.loads(backend.get(MARKER))["id"])


def _write_local(path: Path, tier_id: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(tier_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_identity(backend: TierBackend, store_path: Path) -> str:
    """The tier's id once it is known to be this store's tier (module docstring), else
    :class:`TierUnavailableError`. Blocking: called by the tier thread before a catalog load."""
    local_path = store_path / LOCAL_FILE
    local = local_path.read_text(encoding="utf-8").strip() if local_path.exists() else None
    marker = _marker_id(backend)
    where = backend.describe()
    if marker is None and local is not None:
        raise TierUnavailableError(
            f"the tier at {where} has no {MARKER} although this store has written to it "
            f"(id {local} in {local_path}): not mounted, or the wrong bucket or prefix? "
            f"Retrying. To start an empty tier on purpose, delete {local_path}"
        )
    if marker is not None and local is not None and marker != local:
        raise TierUnavailableError(
            f"the tier at {where} is {marker}, not {local} which this store wrote to "
            f"({local_path}): the wrong bucket, prefix or folder? Retrying"
        )
    if marker is None:
        marker = secrets.token_hex(16)
        backend.put(MARKER, json.dumps({"id": marker}).encode())
    if local is None:
        store_path.mkdir(parents=True, exist_ok=True)
        _write_local(local_path, marker)
    return marker
