"""Tiered storage under one store: upload, read-through, outages, restart, retention gate."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from orbitmq.broker.service_metrics import ServiceGaugeCollector, store_backlogs
from orbitmq.common.errors import TierUnavailableError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import decode
from orbitmq.store.message_store import GetStatus, MessageStore
from orbitmq.store.tier.backend import DirectoryBackend, TierBackend
from orbitmq.store.tier.factory import make_backend, with_broker_prefix
from orbitmq.store.tier.layout import QueueManifest, data_key, manifest_key
from tests.store.conftest import small_config

SEG = 64 * 1024 + 8 * 1024
QUEUES = 4
EVERY_HOUR = ";".join(str(h) for h in range(24))


class Flaky(TierBackend):
    """A backend that fails every call while ``down`` (an object-store outage)."""

    name = "flaky"

    def __init__(self, inner: TierBackend) -> None:
        self.inner = inner
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError("object store unreachable")

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._check()
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self._check()
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._check()
        return self.inner.get_range(key, start, length)

    def list(self, prefix: str) -> list[str]:
        self._check()
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._check()
        self.inner.delete(key)


def open_store(root: Path, flaky: bool = False, **over: Any) -> tuple[MessageStore, Flaky | None]:
    options: dict[str, Any] = {
        "mapped_file_size_commit_log": SEG,
        "max_message_size": 4096,
        "tier_backend": "directory",
        "tier_path": str(root / "tier"),
        "tier_upload_interval_ms": 3_600_000,  # the test drives the turns
        "tier_chunk_max_messages": 100,
        "tier_local_retention_ms": 0,
        "delete_when": EVERY_HOUR,
        "delete_commit_log_files_max_per_run": 1000,
    }
    options.update(over)
    store = MessageStore(small_config(root / "store", **options))
    wrapper = None
    if flaky:
        assert store.tier is not None
        wrapper = Flaky(store.tier.backend)
        store.tier.backend = store.tier.cache.backend = wrapper
    store.open()
    assert store.tier is not None
    deadline = time.monotonic() + 10
    while store.tier.turns < 1 and time.monotonic() < deadline:  # the thread's first turn
        time.sleep(0.005)
    assert store.tier.turns >= 1
    return store, wrapper


def produce(store: MessageStore, rounds: int, start: int = 0) -> dict[tuple[int, int], bytes]:
    """``rounds`` batches of 8 on every queue; returns (queue, offset) -> body."""
    sent: dict[tuple[int, int], bytes] = {}
    for r in range(start, start + rounds):
        for q in range(QUEUES):
            bodies = [f"q{q}-r{r}-m{j}-".encode() * 12 for j in range(8)]
            res = store.put(MessageBatch.of("T", q, bodies))
            for j, body in enumerate(bodies):
                sent[(q, res.first_queue_offset + j)] = body
    assert store.wait_for_dispatch()
    store.commit_log.flush()
    return sent


def read_all(store: MessageStore, batch: int = 37) -> dict[tuple[int, int], bytes]:
    got: dict[tuple[int, int], bytes] = {}
    for q in range(QUEUES):
        offset = store.min_offset("T", q)
        hi = store.max_offset("T", q)
        for _ in range(10_000):
            if offset >= hi:
                break
            res = store.get_messages("T", q, offset, max_count=batch)
            assert res.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), res.status
            assert not res.skipped
            for off, raw in zip(res.queue_offsets, res.messages, strict=True):
                msg = decode(raw)
                assert (msg.queue_id, msg.queue_offset) == (q, off)
                assert (q, off) not in got, "duplicate"
                got[(q, off)] = msg.body
            assert res.next_begin_offset > offset
            offset = res.next_begin_offset
    return got


def segments(store: MessageStore) -> int:
    return len(store.commit_log.segments.segments)


def test_uploaded_segments_go_and_everything_reads_back(tmp_path: Path) -> None:
    # ORBITMQ_TIER_ROUNDS scales it (x 32 messages); the normal suite runs 60 rounds.
    rounds = int(os.environ.get("ORBITMQ_TIER_ROUNDS", "60"))
    store, _ = open_store(tmp_path)
    try:
        sent = produce(store, rounds)
        before = segments(store)
        assert before >= 3
        store.retention.run()  # nothing uploaded yet: nothing may go
        assert segments(store) == before
        assert store.tier is not None
        store.tier.run_once()
        store.retention.run()
        assert segments(store) == 1  # only the active segment is local
        local_min = store.queues.get("T", 0).min_offset  # type: ignore[union-attr]
        assert local_min > 0 and store.min_offset("T", 0) == 0
        assert read_all(store) == sent
        assert read_all(store, batch=1000) == sent
        # A read across the tier/disk boundary: the tier's chunk serves past it, unchanged.
        res = store.get_messages("T", 0, local_min - 1, max_count=5)
        assert res.queue_offsets == list(range(local_min - 1, local_min + 4))
        status = store.tier.status()
        assert status["available"] is True
        lags = {q["queue_id"]: q["lag_messages"] for q in status["queues"]}  # type: ignore[attr-defined]
        assert lags == dict.fromkeys(range(QUEUES), 0)
    finally:
        store.close()


def test_outage_keeps_writes_and_hot_reads_and_fails_cold_reads_retryably(tmp_path: Path) -> None:
    store, flaky = open_store(tmp_path, flaky=True)
    assert flaky is not None and store.tier is not None
    try:
        sent = produce(store, 40)
        store.tier.run_once()
        store.retention.run()
        assert segments(store) == 1
        flaky.down = True
        store.tier.cache.max_bytes = 0  # nothing cached: a cold read needs the store
        sent |= produce(store, 40, start=40)  # writes go on
        n = segments(store)
        with pytest.raises(ConnectionError):
            store.tier.run_once()
        store.retention.run()
        assert segments(store) == n  # nothing un-uploaded deleted
        hot = store.queues.get("T", 1).min_offset  # type: ignore[union-attr]
        res = store.get_messages("T", 1, hot, max_count=8)
        assert res.status is GetStatus.FOUND and res.queue_offsets[0] == hot
        with pytest.raises(TierUnavailableError) as err:
            store.get_messages("T", 1, 0, max_count=8)
        assert err.value.retriable
        assert store.tier.stats()["tier_upload_lag_messages"] > 0
        assert store.tier.stats()["tier_upload_lag_ms"] >= 0
        flaky.down = False
        store.tier.run_once()  # catch up
        store.retention.run()
        assert segments(store) == 1
        assert read_all(store) == sent
    finally:
        store.close()


def test_the_thread_backs_off_and_catches_up(tmp_path: Path) -> None:
    store, flaky = open_store(tmp_path, flaky=True, tier_upload_interval_ms=20)
    assert flaky is not None and store.tier is not None
    try:
        flaky.down = True
        produce(store, 5)
        deadline = time.monotonic() + 5
        while store.tier.health.degraded is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.tier.health.degraded is not None
        assert "tier" in store.health()
        assert store.stats()["tier_available"] == 0
        flaky.down = False
        assert store.tier.wait_uploaded(timeout=10)
        assert store.tier.health.degraded is None
    finally:
        store.close()


def test_restart_resumes_at_the_watermark_and_removes_orphans(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    sent = produce(store, 20)
    store.tier.run_once()
    wm = store.tier.manifests[("T", 2)].watermark
    store.close()
    # An upload interrupted after its data object was put: an orphan the manifest never named.
    backend = DirectoryBackend(tmp_path / "tier")
    orphan = data_key("T", 2, wm, wm + 3)
    backend.put(orphan, b"half an upload")
    # Puts the killed process had started: temporary files no listing shows.
    partial = [tmp_path / "tier" / "T" / "2" / "data" / f".{wm:020d}-{wm + 3:020d}.dead-0001.tmp",
               tmp_path / "tier" / "T" / "2" / ".manifest.json.dead-0002.tmp"]  # fmt: skip
    for path in partial:
        path.write_bytes(b"half a put")
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        sent |= produce(store, 20, start=20)
        store.tier.run_once()
        assert not os.path.exists(tmp_path / "tier" / orphan)
        assert not any(path.exists() for path in partial)
        m = QueueManifest.decode(backend.get(manifest_key("T", 2)))
        spans = [(c.base, c.end) for c in m.chunks]
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        assert any(base == wm for base, _ in spans)  # resumed exactly there
        keys = backend.list("T/2/data/")
        assert len(keys) == len(spans)  # no duplicate, no overlap
        store.retention.run()
        assert read_all(store) == sent
    finally:
        store.close()


def test_partial_puts_of_this_process_are_left_alone(tmp_path: Path) -> None:
    """Only a dead writer's temporary files go: one this backend is writing stays."""
    backend = DirectoryBackend(tmp_path)
    backend.put("T/0/data/x", b"whole")
    folder = tmp_path / "T" / "0" / "data"
    ours = folder / f".y.{backend._token}-0001.tmp"
    theirs = folder / ".y.other-0001.tmp"
    for path in (ours, theirs):
        path.write_bytes(b"half")
    assert backend.remove_partial("T/0/data/") == 1
    assert ours.exists() and not theirs.exists() and backend.list("T/0/") == ["T/0/data/x"]
    assert backend.remove_partial("absent/") == 0


def test_startup_does_not_wait_for_the_tier(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    produce(store, 30)
    store.tier.run_once()
    store.retention.run()
    store.close()
    store = MessageStore(small_config(tmp_path / "store", mapped_file_size_commit_log=SEG,
                                      max_message_size=4096, tier_backend="directory",
                                      tier_path=str(tmp_path / "tier"),
                                      tier_upload_interval_ms=3_600_000))  # fmt: skip
    assert store.tier is not None
    flaky = Flaky(store.tier.backend)
    flaky.down = True
    store.tier.backend = store.tier.cache.backend = flaky
    t0 = time.monotonic()
    store.open()
    try:
        assert time.monotonic() - t0 < 5
        hot = store.queues.get("T", 0).min_offset  # type: ignore[union-attr]
        assert store.get_messages("T", 0, hot).status is GetStatus.FOUND  # hot reads at once
        with pytest.raises(TierUnavailableError):
            store.get_messages("T", 0, 0)
        flaky.down = False
        store.tier.run_once()
        assert store.get_messages("T", 0, 0).status is GetStatus.FOUND
    finally:
        store.close()


def test_counted_gaps_when_the_operator_allows_unuploaded_deletes(tmp_path: Path) -> None:
    store, flaky = open_store(tmp_path, flaky=True, tier_allow_unuploaded_delete=True)
    assert flaky is not None and store.tier is not None
    try:
        sent = produce(store, 10)
        store.tier.run_once()
        flaky.down = True
        sent |= produce(store, 40, start=10)
        store.retention.run()  # allowed: deleted although not uploaded
        assert segments(store) == 1
        lost = sum(store.queues.get("T", q).min_offset for q in range(QUEUES)) - sum(  # type: ignore[union-attr]
            store.tier.manifests[("T", q)].watermark for q in range(QUEUES)
        )
        assert lost > 0
        flaky.down = False
        store.tier.run_once()
        assert store.tier.gap_messages == lost
        got = read_all(store)
        assert len(sent) - len(got) == lost
        assert all(sent[k] == v for k, v in got.items())
    finally:
        store.close()


def test_tier_ttl_drops_old_chunks(tmp_path: Path) -> None:
    now = [int(time.time() * 1000)]
    store = MessageStore(
        small_config(tmp_path / "store", mapped_file_size_commit_log=SEG, max_message_size=4096,
                     tier_backend="directory", tier_path=str(tmp_path / "tier"),
                     tier_upload_interval_ms=3_600_000, tier_chunk_max_messages=100,
                     tier_local_retention_ms=0, delete_when=EVERY_HOUR),
        clock=lambda: now[0],
    )  # fmt: skip
    store.open()
    assert store.tier is not None
    try:
        produce(store, 40)  # old: stored at now
        now[0] += 2 * 3_600_000  # the next ones are stored two hours later...
        newer = produce(store, 20, start=40)
        now[0] += 5_000  # the upload lag is the oldest waiting record's age
        assert store.tier.stats()["tier_upload_lag_ms"] >= 2 * 3_600_000 + 5_000
        store.tier.run_once()
        assert store.tier.stats()["tier_upload_lag_ms"] == 0
        store.retention.run()
        assert segments(store) == 1
        # Time to offset reaches below the local data into the tier.
        assert store.queues.get("T", 0).min_offset > 0  # type: ignore[union-attr]
        assert store.offset_for_timestamp("T", 0, 0) == 0
        assert store.offset_for_timestamp("T", 0, now[0] - 5_000) == 40 * 8  # the first newer
        store.tier.set_topic_ttl("T", 3_600_000)  # ...so only the old chunks are past 1 h
        store.tier.run_once()
        m = store.tier.manifests[("T", 0)]
        assert store.tier.expired_chunks > 0 and m.chunks and m.min_offset > 0
        res = store.get_messages("T", 0, 0)
        assert res.status is GetStatus.OFFSET_TOO_SMALL
        assert res.next_begin_offset == m.min_offset == store.min_offset("T", 0)
        backend = DirectoryBackend(tmp_path / "tier")
        assert len(backend.list("T/0/data/")) == len(m.chunks)
        assert len(backend.list("T/0/index/")) == len(m.chunks)
        got = read_all(store)
        assert all(got[k] == v for k, v in newer.items())
        assert min(off for q, off in got if q == 0) == m.min_offset
    finally:
        store.close()


def test_gaps_are_counted_for_a_queue_never_uploaded(tmp_path: Path) -> None:
    store, flaky = open_store(tmp_path, flaky=True, tier_allow_unuploaded_delete=True)
    assert flaky is not None and store.tier is not None
    try:
        flaky.down = True  # nothing ever uploaded, not even a manifest
        sent = produce(store, 40)
        store.retention.run()
        assert segments(store) == 1
        lost = sum(store.queues.get("T", q).min_offset for q in range(QUEUES))  # type: ignore[union-attr]
        assert lost > 0
        flaky.down = False
        store.tier.run_once()
        assert store.tier.gap_messages == lost
        assert len(read_all(store)) == len(sent) - lost
    finally:
        store.close()


def test_disaster_recovery_from_the_manifests(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    sent = produce(store, 30)
    store.tier.run_once()
    marks = {q: store.max_offset("T", q) for q in range(QUEUES)}
    store.close()
    shutil.rmtree(tmp_path / "store")  # the local disk is lost
    store, _ = open_store(tmp_path, tier_restore=True)
    try:
        assert {q: store.max_offset("T", q) for q in range(QUEUES)} == marks
        assert store.min_offset("T", 0) == 0
        assert read_all(store) == sent
        sent |= produce(store, 2, start=30)  # new sends continue after the tier's offsets
        assert store.max_offset("T", 0) == marks[0] + 16
        assert read_all(store) == sent
        phy = decode(store.get_messages("T", 3, 0).messages[0]).physical_offset
        msg = store.get_message(phy)  # an old message id still resolves
        assert msg is not None and msg.body == sent[(3, 0)]
        assert store.commit_log.min_offset > phy  # the new log starts past the tier's
        store.commit_log.flush()
        store.tier.run_once()
    finally:
        store.close()
    store, _ = open_store(tmp_path)  # a plain restart afterwards: nothing to restore
    try:
        assert store.tier is not None and store.tier.wait_uploaded(10)  # catalog loaded
        assert read_all(store) == sent
    finally:
        store.close()


def test_cold_reads_filter_by_tag_as_local_reads_do(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        for r in range(60):
            msgs = [Message("G", f"g{r}-{j}".encode() * 30, tags="a" if j % 3 == 0 else "b")
                    for j in range(6)]  # fmt: skip
            store.put(MessageBatch.of("G", 0, msgs))
        assert store.wait_for_dispatch()
        store.commit_log.flush()
        hot = store.get_messages("G", 0, 0, max_count=1000, tags=["a"])
        want = [(o, bytes(m)) for o, m in zip(hot.queue_offsets, hot.messages, strict=True)]
        store.tier.run_once()
        store.retention.run()
        assert store.queues.get("G", 0).min_offset > 0  # type: ignore[union-attr]
        got: list[tuple[int, bytes]] = []
        offset = 0
        for _ in range(1000):
            if offset >= store.max_offset("G", 0):
                break
            res = store.get_messages("G", 0, offset, max_count=7, tags=["a"])
            got += [(o, bytes(m)) for o, m in zip(res.queue_offsets, res.messages, strict=True)]
            offset = res.next_begin_offset
        assert got == want and len(got) == 120
    finally:
        store.close()


def test_brokers_share_a_tier_directory_under_their_own_prefixes(tmp_path: Path) -> None:
    base = small_config(tmp_path / "a", tier_backend="directory", tier_path=str(tmp_path / "tier"))
    a = with_broker_prefix(base, "C", "broker-a", 0)
    b = with_broker_prefix(base, "C", "broker-b", 0)
    slave = with_broker_prefix(base, "C", "broker-a", 1)
    assert (a.tier_prefix, b.tier_prefix, slave.tier_prefix) == (
        "C/broker-a", "C/broker-b", "C/broker-a-1"
    )  # fmt: skip
    assert with_broker_prefix(small_config(tmp_path), "C", "x", 0).tier_prefix == ""  # tier off
    ba, bb = make_backend(a), make_backend(b)
    assert ba is not None and bb is not None
    ba.put("T/0/manifest.json", b"a")
    bb.put("T/0/manifest.json", b"b")
    assert ba.get("T/0/manifest.json") == b"a" and bb.list("") == ["T/0/manifest.json"]
    assert (tmp_path / "tier" / "C" / "broker-b" / "T" / "0" / "manifest.json").read_bytes() == b"b"


def test_records_can_be_transformed_before_upload(tmp_path: Path) -> None:
    """The hook encryption at rest uses (the tier gets the plaintext record): whatever ``plain``
    returns is what cold reads serve, sizes included."""
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    seen: list[int] = []

    def plain(record: memoryview) -> bytes:
        msg = decode(record)
        seen.append(msg.queue_offset)
        return bytes(record)

    store.tier.plain = plain
    try:
        sent = produce(store, 40)
        store.tier.run_once()
        store.retention.run()
        assert len(seen) == len(sent)
        assert read_all(store) == sent
    finally:
        store.close()


class DiesAtManifest(Flaky):
    """An upload killed between its chunk objects and its manifest (as a SIGKILL would)."""

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        if key.endswith("manifest.json") and self.down:
            raise ConnectionError("killed before the manifest")
        self.inner.put(key, data)


def test_killed_mid_upload_leaves_no_overlapping_chunks(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    sent = produce(store, 20)
    store.tier.run_once()
    dying = DiesAtManifest(store.tier.backend)
    store.tier.backend = store.tier.cache.backend = dying
    sent |= produce(store, 20, start=20)
    dying.down = True
    with pytest.raises(ConnectionError):
        store.tier.run_once()  # data and index of the next chunk are in, its manifest is not
    store.crash_for_test()
    backend = DirectoryBackend(tmp_path / "tier")
    named = QueueManifest.decode(backend.get(manifest_key("T", 0)))
    assert len(backend.list("T/0/data/")) == len(named.chunks) + 1  # one orphan
    store, _ = open_store(tmp_path)
    assert store.tier is not None
    try:
        sent |= produce(store, 10, start=40)
        store.tier.run_once()
        for q in range(QUEUES):
            m = QueueManifest.decode(backend.get(manifest_key("T", q)))
            spans = [(c.base, c.end) for c in m.chunks]
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
            assert len(backend.list(f"T/{q}/data/")) == len(spans)
            assert len(backend.list(f"T/{q}/index/")) == len(spans)
            assert m.watermark == store.max_offset("T", q)
        store.retention.run()
        assert read_all(store) == sent
    finally:
        store.close()


def test_reserve_time_series_of_the_tier(tmp_path: Path) -> None:
    """rocketmq_storage_message_reserve_time_milliseconds: once the local copies are gone the
    local series follows the store's oldest record, and each tiered queue has its own series
    with the age of the oldest record the tier holds (older than the local one)."""
    store, _ = open_store(tmp_path)
    try:
        produce(store, 60)
        assert store.tier is not None
        store.tier.run_once()
        store.retention.run()  # uploaded: the old local segments go
        oldest = store.tier.oldest_kept()
        assert set(oldest) == {("T", q) for q in range(QUEUES)}
        now = int(time.time() * 1000) + 1000
        values = store_backlogs(store, now)
        local = values["reserve_time_ms"]
        for (topic, q), ts in oldest.items():
            assert values["tier_reserve_ms"][(topic, q)] == now - ts >= local
        first = store.get_messages("T", 0, store.min_offset("T", 0), max_count=1)
        assert first.status is GetStatus.FOUND
        assert (
            now - decode(first.messages[0]).store_timestamp_ms
            == values["tier_reserve_ms"][("T", 0)]
        )  # the tier's oldest record of queue 0 is where queue 0 now starts
        collector = ServiceGaugeCollector(
            ("C", "broker", "b"), half_messages=dict, timer=dict, pop=dict,
            store=lambda: store_backlogs(store, now),
        )  # fmt: skip
        fam = next(
            f for f in collector.collect()
            if f.name == "rocketmq_storage_message_reserve_time_milliseconds"
        )  # fmt: skip
        by_type = {(s.labels["storage_type"], s.labels.get("queue_id")): s.value
                   for s in fam.samples}  # fmt: skip
        assert by_type[("local", None)] == local
        assert by_type[("tiered", "0")] == values["tier_reserve_ms"][("T", 0)]
        assert len(by_type) == 1 + QUEUES
    finally:
        store.close()
