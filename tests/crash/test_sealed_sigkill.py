"""SIGKILL an appender writing an encrypted store (SYNC_FLUSH) at random moments: every
acknowledged message comes back byte for byte, every sealed record authenticates, and no
(data key, nonce) pair is ever used for two different ciphertexts, across all the runs.

Kills: ORBITMQ_CRASH_ITERATIONS (default 4 here, bounded for `make test`); the seed is printed
and ORBITMQ_SEED replays the kill delays.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbitmq.common.record import BLANK, BLANK_MAGIC, HEADER, HEADER_SIZE, decode
from orbitmq.store.message_store import MessageStore
from orbitmq.store.sealing import SYSFLAG_SEALED
from tests.crash.sealed_appender import QUEUES, TOPIC, body, config

pytestmark = pytest.mark.crash

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("ORBITMQ_CRASH_ITERATIONS", "4"))


def _sealed_records(store: MessageStore) -> dict[tuple[int, int, int], str]:
    """(segment, epoch, physical offset) -> SHA-256 of the stored ciphertext, for every
    sealed record in the CommitLog; each must also open."""
    cl, sealer = store.commit_log, store.sealer
    assert sealer is not None
    out: dict[tuple[int, int, int], str] = {}
    pos = cl.min_offset
    while pos < cl.max_offset:
        loc = cl.view_at(pos)
        assert loc is not None
        view, at, size = loc
        total, magic = BLANK.unpack_from(view, at)
        if magic == BLANK_MAGIC:  # end-of-segment filler (as short as 8 bytes)
            pos += size - at
            continue
        fields = HEADER.unpack_from(view, at)
        assert fields[7] & SYSFLAG_SEALED
        seg = pos - at
        sealed = bytes(view[at + HEADER_SIZE : at + HEADER_SIZE + fields[14]])
        epoch = int.from_bytes(sealed[:4], "big")
        out[(seg, epoch, pos)] = hashlib.sha256(sealed).hexdigest()
        sealer.open_record(view, at)  # raises if it does not authenticate
        pos += total
    return out


def test_sigkill_encrypted_appends(tmp_path: Path) -> None:
    seed = int(os.environ.get("ORBITMQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    key = tmp_path / "master.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    store_path = tmp_path / "store"
    acked: dict[tuple[int, int], bytes] = {}  # (queue, queue offset) -> body
    nonces: dict[tuple[int, int, int], str] = {}
    epochs: set[int] = set()
    for run in range(KILLS):
        err = tmp_path / f"child-{run}.err"
        with err.open("wb") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.crash.sealed_appender", str(store_path), str(key),
                 str(run)],
                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=err_file,
            )  # fmt: skip
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline().split()
            assert ready and ready[0] == b"READY", err.read_text()
            epoch = int(ready[1])
            assert epoch not in epochs
            epochs.add(epoch)
            time.sleep(rng.uniform(0.05, 0.6))
            proc.kill()
            proc.wait(10)
            out = proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        for line in out.decode().splitlines():
            if not line.startswith("ACK ") or not line.endswith(tuple("0123456789")):
                continue
            _, seq, qid, first, count = line.split()
            for i in range(int(count)):
                acked[(int(qid), int(first) + i)] = body(run, int(seq), i)
        store = MessageStore(config(store_path, str(key)))  # type: ignore[arg-type]
        store.open()
        try:
            for where, digest in _sealed_records(store).items():
                assert nonces.setdefault(where, digest) == digest, f"nonce reused at {where}"
            assert store.wait_for_dispatch()
            for (qid, offset), want in acked.items():
                res = store.get_messages(TOPIC, qid, offset, max_count=1)
                assert res.count == 1 and not res.skipped, (qid, offset)
                assert decode(res.messages[0]).body == want
        finally:
            store.close()
    assert len(acked) > 0
    assert {q for q, _ in acked} <= set(range(QUEUES))
