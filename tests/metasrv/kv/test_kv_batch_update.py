"""`KvBackend.batch_update` (the leader's fenced checkpoint write) on real etcd, PostgreSQL
and SQLite: it overwrites only keys that exist, and nothing of a chunk whose fence broke."""

from __future__ import annotations

from metasrv.kv import Compare, KvBackend

FENCE_KEY = "election"


def _fence(kv: KvBackend, value: bytes) -> list[Compare]:
    kv.put(FENCE_KEY, value)
    return [Compare(FENCE_KEY, value=value)]


def test_overwrites_existing_keys_and_never_creates_one(kv: KvBackend) -> None:
    fence = _fence(kv, b"term-1")
    kv.batch_put([(f"r/{i:04d}", b"old") for i in range(0, 300, 2)])  # the even keys
    before = kv.get("r/0000")
    assert before is not None

    result = kv.batch_update([(f"r/{i:04d}", b"new") for i in range(300)], fence)

    assert not result.fenced
    assert sorted(result.written) == [f"r/{i:04d}" for i in range(0, 300, 2)]
    stored = {item.key: item.value for item in kv.scan("r/")}
    assert stored == {f"r/{i:04d}": b"new" for i in range(0, 300, 2)}
    after = kv.get("r/0000")
    assert after is not None and after.mod_revision > before.mod_revision


def test_a_broken_fence_writes_nothing(kv: KvBackend) -> None:
    fence = _fence(kv, b"term-1")
    kv.batch_put([(f"r/{i:04d}", b"old") for i in range(300)])
    kv.put(FENCE_KEY, b"term-2")  # another leader's term

    result = kv.batch_update([(f"r/{i:04d}", b"late") for i in range(300)], fence)

    assert result.fenced and list(result.written) == []
    assert {item.value for item in kv.scan("r/")} == {b"old"}


def test_an_absent_fence_key_writes_nothing(kv: KvBackend) -> None:
    fence = _fence(kv, b"term-1")
    kv.put("r/1", b"old")
    kv.delete(FENCE_KEY)  # the lease ran out: nobody leads

    result = kv.batch_update([("r/1", b"late")], fence)

    assert result.fenced and list(result.written) == []
    stored = kv.get("r/1")
    assert stored is not None and stored.value == b"old"


def test_no_fence_and_duplicates(kv: KvBackend) -> None:
    kv.put("r/1", b"old")
    result = kv.batch_update([("r/1", b"a"), ("r/2", b"x"), ("r/1", b"b")], [])
    assert not result.fenced and list(result.written) == ["r/1"]
    stored = kv.get("r/1")
    assert stored is not None and stored.value == b"b"
    assert kv.get("r/2") is None
