"""The `KvBackend` contract, run unchanged on real etcd, PostgreSQL and SQLite."""

from __future__ import annotations

import inspect
import json
import threading

import pytest

from metasrv.errors import InvalidArgument, KvUnavailable, TxnTooLarge
from metasrv.kv import Compare, Delete, KvBackend, Put
from tests.metasrv.kv.conftest import KvFactory


def test_every_protocol_method_has_the_protocols_parameters(kv: KvBackend) -> None:
    # mypy checks the types; this checks what it does not: names, kinds and defaults match,
    # and a backend's extra parameters are optional.
    methods = [n for n, v in vars(KvBackend).items() if callable(v) and not n.startswith("_")]
    assert "txn" in methods and "watch" in methods
    for name in methods:
        wanted = inspect.signature(getattr(KvBackend, name)).parameters
        actual = inspect.signature(getattr(type(kv), name)).parameters
        for param in wanted.values():
            got = actual.get(param.name)
            assert got is not None, f"{type(kv).__name__}.{name} lacks {param.name}"
            assert (got.kind, got.default) == (param.kind, param.default), (name, got, param)
        extra = [p for p in actual.values() if p.name not in wanted]
        assert all(p.default is not inspect.Parameter.empty for p in extra), (name, extra)


def test_get_put_delete(kv: KvBackend) -> None:
    assert kv.get("a") is None

    rev1 = kv.put("a", b"one")
    got = kv.get("a")
    assert got is not None
    assert (got.key, got.value, got.mod_revision) == ("a", b"one", rev1)
    assert rev1 > 0

    rev2 = kv.put("a", b"two")
    assert rev2 > rev1
    assert kv.get("a") == type(got)("a", b"two", rev2)

    assert kv.delete("a") is True
    assert kv.get("a") is None
    assert kv.delete("a") is False


def test_revisions_grow_across_keys(kv: KvBackend) -> None:
    ra = kv.put("x/a", b"1")
    rb = kv.put("x/b", b"1")
    rc = kv.put("x/a", b"2")
    assert ra < rb < rc


def test_range_is_prefix_bounded_and_key_ordered(kv: KvBackend) -> None:
    for key in ["k/b", "k/a", "k", "k0", "j/z", "k/c/d", "l"]:
        kv.put(key, key.encode())

    keys = [item.key for item in kv.range("k/")]
    assert keys == ["k/a", "k/b", "k/c/d"]
    assert [item.value for item in kv.range("k/")] == [b"k/a", b"k/b", b"k/c/d"]
    assert [item.key for item in kv.range("k")] == ["k", "k/a", "k/b", "k/c/d", "k0"]
    assert [item.key for item in kv.range("")] == [
        "j/z", "k", "k/a", "k/b", "k/c/d", "k0", "l",
    ]  # fmt: skip
    assert kv.range("nothing/") == []


def test_range_orders_keys_bytewise(kv: KvBackend) -> None:
    # UTF-8 byte order: "B" (0x42) < "a" (0x61) < "z" (0x7a) < "é" (0xc3 0xa9).
    for key in ["u/é", "u/z", "u/a", "u/B"]:
        kv.put(key, b"")
    assert [item.key for item in kv.range("u/")] == ["u/B", "u/a", "u/z", "u/é"]
    assert [item.key for item in kv.range("u/é")] == ["u/é"]


def test_range_pagination_and_scan(kv: KvBackend) -> None:
    keys = [f"p/{i:03d}" for i in range(25)]
    for key in reversed(keys):
        kv.put(key, b"v")
    kv.put("p0", b"outside")

    first = kv.range("p/", limit=10)
    assert [item.key for item in first] == keys[:10]
    second = kv.range("p/", start_after=first[-1].key, limit=10)
    assert [item.key for item in second] == keys[10:20]
    third = kv.range("p/", start_after=second[-1].key, limit=10)
    assert [item.key for item in third] == keys[20:]
    assert kv.range("p/", start_after=keys[-1]) == []
    # start_after need not be a stored key
    assert [item.key for item in kv.range("p/", start_after="p/0105", limit=3)] == keys[11:14]

    for page_size in (1, 7, 25, 1000):
        assert [item.key for item in kv.scan("p/", page_size=page_size)] == keys


def test_delete_prefix(kv: KvBackend) -> None:
    for key in ["d/1", "d/2", "d/3/x", "d0", "e"]:
        kv.put(key, b"v")
    assert kv.delete_prefix("d/") == 3
    assert [item.key for item in kv.range("")] == ["d0", "e"]
    assert kv.delete_prefix("d/") == 0


def test_key_prefix_isolation(kv_store: KvFactory) -> None:
    one = kv_store("cluster-one/")
    two = kv_store("cluster-two/")
    one.put("shared", b"1")
    two.put("shared", b"2")
    one.put("only-one", b"1")

    assert one.get("shared") is not None
    assert one.get("shared").value == b"1"  # type: ignore[union-attr]
    assert two.get("shared").value == b"2"  # type: ignore[union-attr]
    assert two.get("only-one") is None
    assert [item.key for item in one.range("")] == ["only-one", "shared"]
    assert [item.key for item in two.range("")] == ["shared"]

    assert one.delete_prefix("") == 2
    assert two.get("shared") is not None
    assert [item.key for item in two.scan("")] == ["shared"]


def test_txn_cas_success(kv: KvBackend) -> None:
    rev = kv.put("cas", b"0")
    result = kv.txn([Compare("cas", revision=rev)], [Put("cas", b"1"), Put("other", b"x")])
    assert result.succeeded
    assert result.revision > rev
    got = kv.get("cas")
    assert got is not None
    assert (got.value, got.mod_revision) == (b"1", result.revision)
    assert kv.get("other") is not None


def test_txn_cas_fails_on_stale_revision(kv: KvBackend) -> None:
    stale = kv.put("cas", b"0")
    fresh = kv.put("cas", b"concurrent writer")
    result = kv.txn(
        [Compare("cas", revision=stale)],
        [Put("cas", b"lost update")],
        [Put("cas-failed", b"yes"), Delete("cas")],
    )
    assert not result.succeeded
    assert result.revision > fresh  # the failure branch wrote
    assert kv.get("cas") is None
    assert kv.get("cas-failed") is not None


def test_txn_failure_without_ops_changes_nothing(kv: KvBackend) -> None:
    rev = kv.put("cas", b"0")
    result = kv.txn([Compare("cas", revision=rev + 1000)], [Put("cas", b"1")])
    assert not result.succeeded
    assert result.revision == rev
    got = kv.get("cas")
    assert got is not None
    assert (got.value, got.mod_revision) == (b"0", rev)


def test_txn_compare_absent(kv: KvBackend) -> None:
    created = kv.txn([Compare("new", revision=0)], [Put("new", b"first")])
    assert created.succeeded
    again = kv.txn([Compare("new", revision=0)], [Put("new", b"second")])
    assert not again.succeeded
    assert kv.get("new").value == b"first"  # type: ignore[union-attr]
    # an existing key never has revision 0, an absent one never has a positive revision
    assert not kv.txn([Compare("missing", revision=created.revision)], [Put("x", b"")]).succeeded


def test_txn_compare_value(kv: KvBackend) -> None:
    kv.put("v", b"mine")
    assert kv.txn([Compare("v", value=b"mine")], [Put("v", b"next")]).succeeded
    assert not kv.txn([Compare("v", value=b"mine")], [Put("v", b"again")]).succeeded
    assert kv.get("v").value == b"next"  # type: ignore[union-attr]
    # a value compare on an absent key fails, even against empty bytes
    assert not kv.txn([Compare("absent", value=b"")], [Put("absent", b"x")]).succeeded
    assert kv.get("absent") is None


def test_txn_needs_every_compare(kv: KvBackend) -> None:
    ra = kv.put("a", b"1")
    kv.put("b", b"1")
    result = kv.txn(
        [Compare("a", revision=ra), Compare("b", value=b"wrong")],
        [Put("a", b"2")],
        [Put("failed", b"1")],
    )
    assert not result.succeeded
    assert kv.get("a").value == b"1"  # type: ignore[union-attr]
    assert kv.get("failed") is not None


def test_txn_last_op_on_a_key_wins(kv: KvBackend) -> None:
    result = kv.txn([], [Put("k", b"1"), Put("k", b"2"), Put("j", b"x"), Delete("j")])
    assert result.succeeded
    assert kv.get("k").value == b"2"  # type: ignore[union-attr]
    assert kv.get("j") is None


def test_txn_too_large(kv: KvBackend) -> None:
    limit = kv.max_txn_ops
    ops = [Put(f"big/{i:05d}", b"v") for i in range(limit + 1)]
    with pytest.raises(TxnTooLarge, match=str(limit)):
        kv.txn([], ops)
    with pytest.raises(TxnTooLarge):
        kv.txn([Compare(f"c/{i}", revision=0) for i in range(limit + 1)], [])
    assert kv.range("big/") == []

    assert kv.txn([Compare("big/00000", revision=0)], ops[:limit]).succeeded
    assert len(kv.range("big/", limit=limit + 1)) == limit


def test_batch_put_1000_keys(kv: KvBackend) -> None:
    kv.put("b/0003", b"old")
    items = [(f"b/{i:04d}", json.dumps({"i": i}).encode()) for i in range(1000)]
    items.append(("b/0001", b"duplicate: the last one wins"))
    kv.batch_put(items)

    stored = list(kv.scan("b/"))
    assert len(stored) == 1000
    values = {item.key: item.value for item in stored}
    assert values["b/0001"] == b"duplicate: the last one wins"
    assert values["b/0003"] == b'{"i": 3}'
    assert values["b/0999"] == b'{"i": 999}'
    assert all(item.mod_revision > 0 for item in stored)
    kv.batch_put([])


def test_concurrent_cas_increments_lose_no_update(kv_store: KvFactory) -> None:
    kv_store("").put("counter", b"0")
    per_thread = 50
    succeeded = [0, 0]
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        kv = kv_store("")  # one backend (connection pool / channel) per thread
        try:
            done = 0
            while done < per_thread:
                cur = kv.get("counter")
                assert cur is not None
                nxt = str(int(cur.value) + 1).encode()
                if kv.txn(
                    [Compare("counter", revision=cur.mod_revision)], [Put("counter", nxt)]
                ).succeeded:
                    done += 1
            succeeded[slot] = done
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    final = kv_store("").get("counter")
    assert final is not None
    assert int(final.value) == sum(succeeded) == 2 * per_thread


def test_close_is_idempotent(kv_store: KvFactory) -> None:
    kv = kv_store("closing/")
    kv.put("a", b"1")
    kv.close()
    kv.close()  # a no-op, not an error
    with pytest.raises(KvUnavailable):
        kv.get("a")
    stored = kv_store("closing/").get("a")  # closing lost nothing written
    assert stored is not None and stored.value == b"1"


# --- snapshot --------------------------------------------------------------------------


def _read(kv: KvBackend, prefix: str, page_size: int) -> tuple[int, list[list[tuple[str, bytes]]]]:
    """The snapshot's revision and its pages under `prefix`, as (key, value) lists."""
    with kv.snapshot() as snap:
        pages = [
            list(zip(page.keys, page.values, strict=True))
            for page in snap.pages(prefix, page_size=page_size)
        ]
        return snap.revision, pages


def test_snapshot_pages_cover_every_key_once(kv: KvBackend) -> None:
    keys = [f"s/{i:03d}" for i in range(25)]
    kv.batch_put([(key, f"value of {key}".encode()) for key in reversed(keys)])
    last = kv.put("s/024", b"rewritten")
    for outside in ["s", "s0", "r/x", "t/s/1"]:
        kv.put(outside, b"outside")
    want = {key: f"value of {key}".encode() for key in keys} | {"s/024": b"rewritten"}

    for page_size in (1, 7, 25, 1000):
        revision, pages = _read(kv, "s/", page_size)
        assert revision >= last
        assert all(1 <= len(page) <= page_size for page in pages)
        flat = [item for page in pages for item in page]
        assert len(flat) == len(keys), f"page_size={page_size}: a key missing or repeated"
        assert dict(flat) == want
        assert len(pages) == -(-len(keys) // page_size)


def test_snapshot_reads_several_prefixes_at_one_revision(kv_store: KvFactory) -> None:
    kv, writer = kv_store(""), kv_store("")
    kv.batch_put([(f"a/{i:02d}", b"old") for i in range(10)] + [("b/1", b"old")])
    with kv.snapshot() as snap:
        first = snap.pages("a/", page_size=3)
        head = next(first)
        # Writes after the snapshot opened, before and during its reads.
        writer.put("a/00", b"new")
        writer.put("a/99", b"new")
        writer.delete("a/05")
        writer.put("b/1", b"new")
        writer.put("b/2", b"new")
        rest = [item for page in first for item in zip(page.keys, page.values, strict=True)]
        other = [
            item for page in snap.pages("b/") for item in zip(page.keys, page.values, strict=True)
        ]
        # Two readers of one snapshot may interleave.
        one, two = snap.pages("a/", page_size=4), snap.pages("b/", page_size=1)
        interleaved = [next(one), next(two), *one, *two]
    seen = dict(zip(head.keys, head.values, strict=True)) | dict(rest)
    assert seen == {f"a/{i:02d}": b"old" for i in range(10)}
    assert other == [("b/1", b"old")]
    assert sum(len(page.keys) for page in interleaved) == 11
    # The writes did land: a new snapshot sees them.
    _, after = _read(kv, "", 1000)
    now = dict(item for page in after for item in page)
    assert now["a/00"] == now["a/99"] == now["b/1"] == now["b/2"] == b"new"
    assert "a/05" not in now


def test_snapshot_is_consistent_under_concurrent_writes(kv_store: KvFactory) -> None:
    """A writer thread puts and deletes all through the read; the snapshot shows the store
    exactly as of its revision: every write at or below it, none above."""
    kv = kv_store("")
    initial = {f"c/{i:03d}": b"0" for i in range(60)}
    kv.batch_put(list(initial.items()))
    log: list[tuple[int, str, bytes | None]] = []  # (revision, key, value or None: deleted)
    lock = threading.Condition()
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        writer = kv_store("")
        try:
            n = 0
            while not stop.is_set():
                n += 1
                key = f"c/{(n * 7) % 80:03d}"  # existing keys and new ones
                value = None if n % 5 == 0 else str(n).encode()
                op = Delete(key) if value is None else Put(key, value)
                # The revision of the write itself, even with other writers on the store.
                entry = (writer.txn([], [op]).revision, key, value)
                with lock:
                    log.append(entry)
                    lock.notify_all()
        except BaseException as exc:
            errors.append(exc)
            with lock:
                lock.notify_all()

    def wait_for(count: int) -> None:
        with lock:
            assert lock.wait_for(lambda: len(log) >= count or errors, timeout=60)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        wait_for(5)
        with kv.snapshot() as snap:
            pages = snap.pages("c/", page_size=4)
            head = next(pages)
            seen = dict(zip(head.keys, head.values, strict=True))
            with lock:
                written_before_page_two = len(log)
            wait_for(written_before_page_two + 10)  # writes land while the read goes on
            for page in pages:
                seen.update(zip(page.keys, page.values, strict=True))
            revision = snap.revision
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors
    want: dict[str, bytes] = dict(initial)
    for rev, key, value in log:
        if rev > revision:
            continue
        if value is None:
            want.pop(key, None)
        else:
            want[key] = value
    assert any(rev > revision for rev, _, _ in log), "no write landed during the read"
    assert seen == want


def test_snapshot_of_an_empty_prefix_and_of_the_whole_store(kv_store: KvFactory) -> None:
    one, two = kv_store("one/"), kv_store("two/")
    _, nothing = _read(one, "", 10)
    assert nothing == []  # a store with no key under the key prefix: no page at all
    one.batch_put([("x/1", b"1"), ("y", b"2")])
    two.put("x/2", b"other cluster")
    _, missing = _read(one, "z/", 10)
    assert missing == []
    # The empty prefix is every key of this key prefix, and none of another.
    _, everything = _read(one, "", 1)
    assert sorted(item for page in everything for item in page) == [("x/1", b"1"), ("y", b"2")]


def test_snapshot_ends_with_its_block(kv: KvBackend) -> None:
    kv.batch_put([(f"e/{i}", b"v") for i in range(5)])
    with kv.snapshot() as snap:
        with pytest.raises(InvalidArgument):
            snap.pages("e/", page_size=0)
        unfinished = snap.pages("e/", page_size=2)
        assert len(next(unfinished).keys) == 2
    with pytest.raises(KvUnavailable, match="snapshot"):
        next(unfinished)
    with pytest.raises(KvUnavailable, match="snapshot"):
        next(snap.pages("e/"))
    # Leaving a read unfinished leaves nothing held: writes and new snapshots go on.
    kv.put("e/9", b"v")
    _, pages = _read(kv, "e/", 100)
    assert len(pages[0]) == 6
