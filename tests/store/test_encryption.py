"""Encryption at rest: no plaintext in any store file, reads give the messages back, a flipped
byte is never served, old plaintext segments stay readable, keys rotate, and a store with
encrypted segments refuses to open without its master key."""

from __future__ import annotations

import os
import random
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orbitmq.common.errors import ConfigError, StoreError
from orbitmq.common.message import Message, MessageBatch
from orbitmq.common.record import decode
from orbitmq.store.commit_log import SEAL_OVERHEAD
from orbitmq.store.message_store import MessageStore
from orbitmq.store.sealing import SYSFLAG_SEALED
from tests.store.conftest import small_config

HEX32 = re.compile(rb"(?=([0-9a-f]{32}))")
COUNT = int(os.environ.get("ORBITMQ_ENCRYPTION_MESSAGES", "10000"))


def key_file(folder: Path, name: str = "master.key") -> str:
    path = folder / name
    path.write_bytes(os.urandom(32).hex().encode())
    path.chmod(0o600)
    return str(path)


def open_store(path: Path, **overrides: Any) -> MessageStore:
    store = MessageStore(small_config(path, **overrides))
    store.open()
    return store


def batch(topic: str, qid: int, markers: list[str]) -> MessageBatch:
    return MessageBatch.of(
        topic,
        qid,
        [
            Message(topic, f"body-{m}".encode(), tags=f"tag{i % 3}", keys=[f"key-{m}"],
                    properties={"marker": f"prop-{m}"})
            for i, m in enumerate(markers)
        ],
    )  # fmt: skip


def all_file_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_no_marker_in_any_file_and_everything_reads_back(tmp_path: Path) -> None:
    seed = int(os.environ.get("ORBITMQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "store"
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=key_file(tmp_path))
    markers = [rng.randbytes(16).hex() for _ in range(COUNT)]
    topic = "SecretTopic"
    try:
        for lo in range(0, COUNT, 100):  # batches of 100, and some single sends
            store.put(batch(topic, lo % 4, markers[lo : lo + 100]))
        store.put(batch(topic, 1, ["single"]))
        assert store.wait_for_dispatch()
        got: list[str] = []
        for qid in range(4):
            offset = 0
            while True:
                res = store.get_messages(topic, qid, offset, max_count=500, max_bytes=1 << 22)
                if not res.count:
                    break
                for view in res.messages:
                    msg = decode(view)
                    assert not msg.sys_flag & SYSFLAG_SEALED
                    got.append(msg.properties["marker"].removeprefix("prop-"))
                    assert msg.body == f"body-{got[-1]}".encode()
                offset = res.next_begin_offset
        assert sorted(got) == sorted([*markers, "single"])
        # Tag filters see the plaintext properties; key lookups go through the index.
        res = store.get_messages(topic, 0, 0, max_count=50, tags=["tag1"])
        assert res.count and all(decode(v).tags == "tag1" for v in res.messages)
        found = store.query_by_key(topic, f"key-{markers[7]}")
        assert [m.body for m in found] == [f"body-{markers[7]}".encode()]
    finally:
        store.close()
    data = all_file_bytes(root)
    wanted = {m.encode() for m in markers}
    # Markers are 32 hex digits: every run of 32 in the files, checked against the set.
    leaked = {m for m in HEX32.findall(data) if m in wanted}
    assert leaked == set(), f"{len(leaked)} markers in plaintext"
    assert b"single" not in data and b"SecretTopic" in data  # topics stay visible (documented)


def test_a_flipped_byte_is_an_integrity_error_never_served(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kf = key_file(tmp_path)
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf, check_crc_on_read=False)
    try:
        # Three appends: three sealed groups (one damaged byte fails its whole group).
        results = [store.put(batch("T", 0, [m])) for m in ("a", "b", "c")]
        assert store.wait_for_dispatch()
        victim = results[1].physical_offsets[0]
        seg = store.commit_log.segments.find(victim)
        assert seg is not None
        path = seg.path
    finally:
        store.close()
    with open(path, "r+b") as f:  # a byte inside the ciphertext of the second record
        f.seek(victim - seg.start + 88 + 10)
        b = f.read(1)
        f.seek(victim - seg.start + 88 + 10)
        f.write(bytes([b[0] ^ 0x40]))
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf, check_crc_on_read=False)
    try:
        res = store.get_messages("T", 0, 0)
        assert [decode(v).body for v in res.messages] == [b"body-a", b"body-c"]
        assert res.skipped == [1]
        assert store.get_message(victim) is None
        assert store.sealer is not None and store.sealer.integrity_errors >= 1
    finally:
        store.close()


@pytest.mark.parametrize("where", ["prefix", "ciphertext", "topic", "properties length"])
def test_a_flipped_byte_fails_its_whole_group_only(tmp_path: Path, where: str) -> None:
    root = tmp_path / "store"
    kf = key_file(tmp_path)
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf, check_crc_on_read=False)
    try:
        store.put(batch("T", 0, ["a"]))
        group = store.put(batch("T", 0, ["b1", "b2", "b3"]))
        store.put(batch("T", 0, ["c"]))
        assert store.wait_for_dispatch()
        loc = store.commit_log.view_at(group.physical_offsets[1])
        assert loc is not None
        view, at, _ = loc
        body_len = int.from_bytes(view[at + 84 : at + 88], "big")
        victim = at + {
            "prefix": 88 + 10, "ciphertext": 88 + 40, "topic": 88 + body_len + 2,
            "properties length": 88 + body_len + 4,
        }[where]  # fmt: skip
        seg = store.commit_log.segments.find(group.physical_offsets[1])
        assert seg is not None
    finally:
        store.close()
    with open(seg.path, "r+b") as f:
        f.seek(victim)
        b = f.read(1)
        f.seek(victim)
        f.write(bytes([b[0] ^ 0x01]))
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf, check_crc_on_read=False)
    try:
        res = store.get_messages("T", 0, 0)
        assert [decode(v).body for v in res.messages] == [b"body-a", b"body-c"]
        assert sorted(res.skipped) == [1, 2, 3]
        assert all(store.get_message(p) is None for p in group.physical_offsets)
    finally:
        store.close()


def test_plaintext_segments_stay_readable_and_keys_rotate(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    store.put(batch("T", 0, ["plain"]))
    store.close()
    old_key = key_file(tmp_path, "old.key")
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=old_key)
    store.put(batch("T", 0, ["sealed-old"]))
    store.close()
    new_key = key_file(tmp_path, "new.key")
    with pytest.raises(StoreError, match="no master key"):
        open_store(root, encrypt_at_rest=True, encryption_key_file=new_key)
    store = open_store(
        root,
        encrypt_at_rest=True,
        encryption_key_file=new_key,
        encryption_retired_key_files=(old_key,),
    )
    try:
        assert store.sealer is not None and store.sealer.deks.rewrap_all() == 1
        store.put(batch("T", 0, ["sealed-new"]))
        assert store.wait_for_dispatch()
        bodies = [decode(v).body for v in store.get_messages("T", 0, 0).messages]
        assert bodies == [b"body-plain", b"body-sealed-old", b"body-sealed-new"]
    finally:
        store.close()
    # Rewrapped: the new key alone opens everything now.
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=new_key)
    try:
        assert len(store.get_messages("T", 0, 0).messages) == 3
    finally:
        store.close()
    with pytest.raises(StoreError, match="encrypted segments"):
        open_store(root)


def test_master_key_file_must_be_private(tmp_path: Path) -> None:
    kf = key_file(tmp_path)
    os.chmod(kf, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        open_store(tmp_path / "store", encrypt_at_rest=True, encryption_key_file=kf)


def _epoch_and_sealed(store: MessageStore, phy: int) -> tuple[int, bytes]:
    loc = store.commit_log.view_at(phy)
    assert loc is not None
    view, at, _ = loc
    body_len = int.from_bytes(view[at + 84 : at + 88], "big")
    sealed = bytes(view[at + 88 : at + 88 + body_len])
    return int.from_bytes(sealed[:4], "big"), sealed


def test_a_truncated_tail_rewritten_gets_a_new_nonce(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kf = key_file(tmp_path)
    # No periodic checkpoint during the test: one taken after the puts would mark the torn
    # record as fsynced, and recovery trusts what lies before a checkpoint (it was flaky).
    quiet = {"flush_interval_consume_queue_ms": 600_000}
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf, **quiet)
    store.put(batch("T", 0, ["kept"]))
    torn = store.put(batch("T", 0, ["torn"]))
    phy = torn.physical_offsets[0]
    first_epoch, first_sealed = _epoch_and_sealed(store, phy)
    seg = store.commit_log.segments.find(phy)
    assert seg is not None
    store.crash_for_test()
    with open(seg.path, "r+b") as f:  # tear the last record: recovery cuts it
        f.seek(phy - seg.start + 100)
        f.write(bytes(16))
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf)
    try:
        assert store.commit_log.max_offset == phy  # the torn record is gone
        again = store.put(batch("T", 0, ["torn"]))  # the same bytes at the same offset
        assert again.physical_offsets == [phy]
        epoch, sealed = _epoch_and_sealed(store, phy)
        assert epoch > first_epoch  # nonce = epoch || offset: never reused
        assert sealed[4:] != first_sealed[4:]
        assert store.sealer is not None and epoch == store.sealer.epoch.value
    finally:
        store.close()


def test_format_1_records_stay_readable_beside_format_2(tmp_path: Path) -> None:
    """Stores written before sealed groups (one AEAD per record) read as before, in the same
    reads and dispatch rounds as the groups written after them."""
    root = tmp_path / "store"
    kf = key_file(tmp_path)
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf)
    sealer = store.sealer
    assert sealer is not None
    sealer.seal = sealer.seal_v1  # type: ignore[method-assign]  # write as the old format
    sealer.overhead = lambda topic_len: SEAL_OVERHEAD  # type: ignore[method-assign]
    store.put(batch("T", 0, ["old1", "old2"]))
    store.close()
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf)
    try:
        store.put(batch("T", 0, ["new1", "new2"]))
        assert store.wait_for_dispatch()
        res = store.get_messages("T", 0, 0)
        assert [decode(v).body for v in res.messages] == [
            b"body-old1", b"body-old2", b"body-new1", b"body-new2",
        ]  # fmt: skip
        assert [decode(v).tags for v in store.get_messages("T", 0, 0, tags=["tag1"]).messages] == [
            "tag1", "tag1",
        ]  # fmt: skip
        assert [m.body for m in store.query_by_key("T", "key-old2")] == [b"body-old2"]
    finally:
        store.close()


def test_a_torn_group_is_cut_at_its_first_record(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kf = key_file(tmp_path)
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf)
    store.put(batch("T", 0, ["kept"]))
    torn = store.put(batch("T", 0, ["t1", "t2", "t3"]))
    seg = store.commit_log.segments.find(torn.physical_offsets[0])
    assert seg is not None
    store.crash_for_test()
    with open(seg.path, "r+b") as f:  # the group's last record never reached the disk
        f.seek(torn.physical_offsets[2] - seg.start)
        f.write(bytes(torn.sizes[2]))
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=kf)
    try:
        assert store.commit_log.max_offset == torn.physical_offsets[0]
        assert store.max_offset("T", 0) == 1
        assert store.wait_for_dispatch()
        assert [decode(v).body for v in store.get_messages("T", 0, 0).messages] == [b"body-kept"]
    finally:
        store.close()


def test_a_group_is_served_as_slices_of_its_plaintext(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(root, encrypt_at_rest=True, encryption_key_file=key_file(tmp_path))
    try:
        markers = [f"m{i}" for i in range(9)]
        store.put(batch("T", 0, markers))
        assert store.wait_for_dispatch()
        res = store.get_messages("T", 0, 2, max_count=5)  # the middle of a group
        assert len(res.body_parts) == 1  # back to back in the plaintext: one part
        assert [decode(v).body for v in res.messages] == [
            f"body-m{i}".encode() for i in range(2, 7)
        ]
        assert res.queue_offsets == [2, 3, 4, 5, 6]
        res = store.get_messages("T", 0, 0, tags=["tag1"])  # every third: not back to back
        assert res.queue_offsets == [1, 4, 7] and len(res.body_parts) == 3
        assert [decode(v).properties["marker"] for v in res.messages] == [
            "prop-m1",
            "prop-m4",
            "prop-m7",
        ]
        assert store.sealer is not None and store.sealer.cache.misses == 0  # sealed, then served
    finally:
        store.close()


def test_recovery_group_check_refuses_impossible_spans() -> None:
    """A damaged prefix (span 0, or a span ending on a filler) is a cut, never a loop."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orbitmq.common.record import BatchHeader, RecordError, encode_batch, encode_blank
    from orbitmq.store.seal_group import check_group, seal_group

    head = BatchHeader(b"T", 0, 0, 0, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0)
    bodies, _key, _opened = seal_group(AESGCM(bytes(32)), 1, head, 0, [b"a", b"b"], [b"", b""])
    good = encode_batch(head, bodies, [b"", b""])
    check_group(memoryview(good), 0, len(good))  # complete: passes
    for span in (0, len(good) + 16):
        bad = bytearray(good) + encode_blank(16)
        bad[96:100] = span.to_bytes(4, "big")
        with pytest.raises(RecordError):
            check_group(memoryview(bad), 0, len(bad))


def test_open_group_refuses_a_prefix_that_miscounts() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orbitmq.common.record import BatchHeader, encode_batch
    from orbitmq.store.seal_group import GroupError, open_group, seal_group

    aead = AESGCM(bytes(32))
    head = BatchHeader(b"T", 0, 0, 0, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0)
    bodies, _key, opened = seal_group(aead, 1, head, 0, [b"a", b"bb"], [b"p", b""])
    good = encode_batch(head, bodies, [b"", b""])
    assert open_group(aead, memoryview(good), 0, 0) == opened
    for count in (1, 3, 1 << 31):
        bad = bytearray(good)
        bad[100:104] = count.to_bytes(4, "big")
        with pytest.raises(GroupError):
            open_group(aead, memoryview(bad), 0, 0)


def _verdicts(data: bytes, plain: bytes, sizes: list[int], extra: int, topic: bytes) -> list[bool]:
    """Whether each clear-record check of seal_group accepts the sealed group ``data``."""
    from orbitmq.common.native import NATIVE
    from orbitmq.store import seal_group as sg

    assert NATIVE is not None
    starts = [0]
    for z in sizes[:-1]:
        starts.append(starts[-1] + z + extra)
    ps = [sum(sizes[:k]) for k in range(len(sizes))]
    view = memoryview(data)
    out = [bool(NATIVE.check_group(view, 0, plain, sizes, extra, topic))]
    # open_group's walk reads the sizes from the clear size fields, then checks.
    walked = all(
        int.from_bytes(data[a : a + 4], "big") == z + extra
        for a, z in zip(starts, sizes, strict=True)
    )
    try:
        sg._check_clear(view, plain, 0, starts, ps, sizes, topic)
        out.append(walked)
    except sg.GroupError:
        out.append(False)
    if len(set(sizes)) == 1:
        total = sizes[0] + extra
        rows = np.frombuffer(data, np.uint8).reshape(len(sizes), total)
        out.append(sg._uniform_ok(rows, plain, len(sizes), sizes[0], total, topic))
    return out


def test_the_c_group_check_agrees_with_the_python_one_on_every_changed_byte() -> None:
    """seal_group's clear-record check exists three times (C, numpy for equal sizes, numpy
    gathers otherwise): a sealed group with any one byte outside its ciphertext changed is
    accepted or refused alike by all that apply (and the untouched group by all)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orbitmq.common.native import NATIVE
    from orbitmq.common.record import BatchHeader, encode_batch
    from orbitmq.store import seal_group as sg

    if NATIVE is None or not hasattr(NATIVE, "check_group"):
        pytest.skip("the C extension is not built here")
    aead = AESGCM(bytes(32))
    extra, topic = sg.extra_bytes(5), b"\x00\x05Topic"
    for bodies in ([b"a" * 40] * 3, [b"a", b"bb" * 30, b"c" * 7]):
        head = BatchHeader(b"Topic", 1, 5, 1000, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0)
        sealed, _key, opened = sg.seal_group(aead, 7, head, 0, bodies, [b"p"] * len(bodies))
        good = bytes(encode_batch(head, sealed, [b""] * len(bodies)))
        at, cipher = 0, set()
        for z in opened.sizes:  # the tag covers the ciphertext bytes
            cipher.update(range(at + 120, at + 120 + z))
            at += z + extra
        assert all(_verdicts(good, opened.plain, opened.sizes, extra, topic))
        refused = 0
        for i in set(range(len(good))) - cipher:
            bad = bytearray(good)
            bad[i] ^= 0x41
            got = _verdicts(bytes(bad), opened.plain, opened.sizes, extra, topic)
            assert len(set(got)) == 1, (i, got)
            refused += not got[0]
        assert refused > 100 * len(bodies)  # headers, prefixes and topics are all checked


def test_the_c_sealed_bodies_are_the_python_ones() -> None:
    from orbitmq.common.native import NATIVE
    from orbitmq.store import seal_group as sg

    if NATIVE is None or not hasattr(NATIVE, "seal_bodies"):
        pytest.skip("the C extension is not built here")
    sealed = bytes(range(256)) * 3 + b"T" * 16
    for sizes in ([1], [100, 3, 500], [0, 7], [256] * 3):
        args = (sealed, sizes, 0xFFFFFFF0, 141, bytes(range(24)))
        assert NATIVE.seal_bodies(*args) == sg._seal_bodies(*args)
    with pytest.raises(ValueError):
        NATIVE.seal_bodies(sealed, [len(sealed) + 1], 1, 141, bytes(24))
    with pytest.raises(ValueError):
        NATIVE.seal_bodies(sealed, [1], 1, 141, bytes(23))


def test_the_c_sealed_records_are_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's seal (one C pass from the plaintext records and the ciphertext to the
    final records) writes the bytes of the Python reference (seal_group's bodies encoded with
    the batch's header), which open to the same group; bad input raises, never writes."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orbitmq.common import record as record_codec
    from orbitmq.common.native import NATIVE
    from orbitmq.common.record import BatchHeader, encode_batch
    from orbitmq.store import seal_group as sg

    if NATIVE is None or not hasattr(NATIVE, "seal_records"):
        pytest.skip("the C extension is not built here")
    seed = int(os.environ.get("ORBITMQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    aead = AESGCM(rng.randbytes(32))

    def head(values: tuple[Any, ...]) -> BatchHeader:
        return BatchHeader(*values)

    for _ in range(40):
        topic = rng.choice([b"T", "Tópico".encode(), b"t" * 300])
        n = rng.choice([1, 2, rng.randint(1, 40)])
        bodies = [rng.randbytes(rng.choice([0, 1, rng.randint(0, 3000)])) for _ in range(n)]
        props = [rng.randbytes(rng.choice([0, rng.randint(1, 60)])) for _ in range(n)]
        values = (
            topic, rng.randint(0, 1 << 31), rng.randint(0, 1 << 40), rng.randint(0, 1 << 40),
            rng.randint(0, 1 << 31), rng.getrandbits(32) >> 1, rng.getrandbits(63),
            rng.randbytes(8), rng.getrandbits(63), rng.randbytes(8), rng.randint(0, 16),
            rng.getrandbits(63),
        )  # fmt: skip
        epoch, seg_start = rng.getrandbits(32), max(0, values[3] - rng.randint(0, 4096))
        c_head, py_head, ref_head = head(values), head(values), head(values)
        c_out, c_key, c_opened = sg.seal_records(aead, epoch, c_head, seg_start, bodies, props)
        monkeypatch.setattr(record_codec, "NATIVE", None)
        py_out, py_key, py_opened = sg.seal_records(aead, epoch, py_head, seg_start, bodies, props)
        monkeypatch.setattr(record_codec, "NATIVE", NATIVE)
        ref_bodies, _k, _o = sg.seal_group(aead, epoch, ref_head, seg_start, bodies, props)
        assert c_out == py_out == encode_batch(ref_head, ref_bodies, [b""] * n)
        assert (c_key, c_opened) == (py_key, py_opened)
        assert c_head.sys_flag == py_head.sys_flag == ref_head.sys_flag
        phy, at, extra = values[3], 0, sg.extra_bytes(len(topic))  # where each record is
        for k, z in enumerate(c_opened.sizes):
            assert c_opened.where.get(phy) == c_opened.where[phy] == (at, z, k)
            assert c_opened.where.get(phy + 1) is None
            phy, at = phy + z + extra, at + z
        assert c_opened.where.get(phy) is None and c_opened.where.get(values[3] - 1) is None
        assert at == len(c_opened.plain)
        g_at = values[3] - seg_start  # opens where it would lie in its segment
        view = memoryview(bytes(g_at) + bytes(c_out))
        assert sg.open_group(aead, view, g_at, seg_start) == c_opened
    plain = encode_batch(BatchHeader(b"T", 0, 0, 0, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0),
                         [b"ab", b"c"], [b"", b"p"], phy_stride=sg.extra_bytes(1))  # fmt: skip
    sealed = aead.encrypt(bytes(12), plain, None)
    extra = sg.extra_bytes(1)
    records, sizes = NATIVE.seal_records(plain, sealed, 1, extra)
    assert len(records) == len(plain) + 2 * extra and sizes == [
        93 + 2,
        93 + 1 + 1,
    ]  # 93: header, topic and lengths
    for args in (
        (plain, sealed[:-1], 1, extra),  # no room for the tag
        (plain, sealed, 1, extra + 1),  # extra not the topic's
        (plain[:-1], sealed[:-1], 1, extra),  # the last record cut short
        (bytes(len(plain)), bytes(len(plain) + 16), 1, extra),  # sizes of 0
        (b"", bytes(16), 1, extra),
    ):
        with pytest.raises(ValueError):
            NATIVE.seal_records(*args)


def test_the_c_group_open_is_the_python_one_on_every_changed_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """open_group through the C extension (gather_group, one decrypt, check_group) and
    through Python (the numpy paths for equal sizes and for the walk) give the same opened
    group for an intact group, and both refuse it with any one byte changed anywhere (the
    ciphertext included), or a prefix whose count or span was changed."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from orbitmq.common.native import NATIVE
    from orbitmq.common.record import BatchHeader
    from orbitmq.store import seal_group as sg

    if NATIVE is None or not hasattr(NATIVE, "gather_group"):
        pytest.skip("the C extension is not built here")
    seed = int(os.environ.get("ORBITMQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    aead = AESGCM(rng.randbytes(32))

    def both(data: bytes, g_at: int, seg_start: int) -> list[object]:
        out: list[object] = []
        for gather in (NATIVE.gather_group, None):
            monkeypatch.setattr(sg, "_NATIVE_GATHER", gather)
            try:
                out.append(sg.open_group(aead, memoryview(data), g_at, seg_start))
            except sg.GroupError:
                out.append("refused")
        return out

    for bodies in ([b"a" * 40] * 3, [b"a", b"bb" * 30, b"c" * 7], [b""], [b"x" * 9] * 2):
        g_at = rng.randint(0, 64)
        seg_start = rng.randint(0, 1 << 30)
        head = BatchHeader(b"Topic", 1, 5, seg_start + g_at, 0, 0, 1, bytes(8), 2, bytes(8), 0, 0)
        good, _key, opened = sg.seal_records(aead, 9, head, seg_start, bodies, [b"p"] * len(bodies))
        data = bytes(g_at) + bytes(good) + bytes(rng.randint(0, 40))
        assert both(data, g_at, seg_start) == [opened, opened]
        # Bytes open_group leaves to others: magic, CRC and, but for the first record, the
        # body length (the reader and recovery check them: framing and CRC), and the clear
        # SYS_FLAG (the caller reads the seal bits; the served header is the authenticated one).
        starts = list(accumulate((z + sg.extra_bytes(5) for z in opened.sizes), initial=g_at))
        unchecked = {s + k for s in starts[:-1] for k in (*range(4, 12), *range(36, 40))}
        unchecked |= {s + k for s in starts[1:-1] for k in range(84, 88)}
        for k, (at, z) in enumerate(zip(starts, opened.sizes, strict=False)):  # equal sizes too
            assert opened.where.get(seg_start + at) == (sum(opened.sizes[:k]), z, k)
            assert opened.where.get(seg_start + at + 1) is None
        assert opened.where.get(seg_start + starts[-1]) is None
        for i in range(g_at, g_at + len(good)):
            bad = bytearray(data)
            bad[i] ^= 1 << rng.randrange(8)
            got = both(bytes(bad), g_at, seg_start)
            want = [opened, opened] if i in unchecked else ["refused", "refused"]
            assert got == want, (i, got)
        for at, value in ((100, len(bodies) + 1), (100, 0), (96, len(good) - 1), (96, 1 << 31)):
            bad = bytearray(data)
            bad[g_at + at : g_at + at + 4] = value.to_bytes(4, "big")
            assert both(bytes(bad), g_at, seg_start) == ["refused", "refused"], (at, value)
