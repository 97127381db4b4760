"""A kv wrapper that fails chosen transactions of the REAL backend it wraps, and a leader
per kv backend (etcd, PostgreSQL) to run it under.

`FaultyKv` passes every call to the real store. A rule (`lose_answer`, `fail`) picks
transactions by what they write: a *lost answer* performs the transaction on the real
store and then raises `KvUnavailable`, as a connection that dropped after the commit
does (the write landed; the caller cannot know); a *failure* raises before the store
sees it (nothing landed). Reads fail only when asked (`fail_gets`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

import migrations
from metasrv import keys
from metasrv.errors import KvUnavailable, MetasrvError
from metasrv.kafka import KafkaAdmin
from metasrv.kv import Compare, EtcdKv, KeyValue, KvBackend, Put, TxnOp, TxnResult
from procedures import ProcedureRecord
from tests.metasrv.kv._pgschema import fresh_schema
from tests.procedures._harness import Harness, make_settings

BACKENDS = ["etcd", "postgresql"]
"""The production kv backends, as `pytest.fixture(params=...)` (services per conftest)."""

TxnMatch = Callable[[Sequence[Compare], Sequence[TxnOp]], bool]


def creates_procedure(compares: Sequence[Compare], ops: Sequence[TxnOp]) -> bool:
    """The transaction of `ProcedureStore.create` (a new record, compared absent)."""
    return any(
        c.key.startswith(keys.PROCEDURE_PREFIX) and c.revision == 0 for c in compares
    ) and any(isinstance(op, Put) and op.key.startswith(keys.PROCEDURE_PREFIX) for op in ops)


def saves_procedure(compares: Sequence[Compare], ops: Sequence[TxnOp]) -> bool:
    """A write of an existing procedure record (`ProcedureStore.save`)."""
    writes = any(isinstance(op, Put) and op.key.startswith(keys.PROCEDURE_PREFIX) for op in ops)
    return writes and not creates_procedure(compares, ops)


def written_records(ops: Sequence[TxnOp]) -> list[ProcedureRecord]:
    """The procedure records a transaction writes."""
    return [
        ProcedureRecord.from_json(op.value)
        for op in ops
        if isinstance(op, Put) and op.key.startswith(keys.PROCEDURE_PREFIX)
    ]


@dataclass
class _Rule:
    match: TxnMatch
    times: int | None
    """Transactions left to hit; None: every one until cleared."""
    perform: bool
    """Perform the transaction before raising (its answer is lost) or not (it failed)."""


class FaultyKv:
    """The real kv backend `inner`, with transactions failed by rule (module docstring)."""

    def __init__(self, inner: KvBackend) -> None:
        self._inner = inner
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self.hits = 0
        """Transactions failed or answered with a lost answer so far."""
        self._get_failures = 0
        self.landed: list[tuple[Sequence[Compare], Sequence[TxnOp], TxnResult]] = []
        """Transactions performed whose answer was lost, with what the store answered."""

    def as_backend(self) -> KvBackend:
        """This wrapper typed as the protocol it forwards (`__getattr__` covers the rest)."""
        return cast(KvBackend, self)

    def lose_answer(self, match: TxnMatch, times: int | None = 1) -> None:
        """The next `times` matching transactions land, then raise `KvUnavailable`."""
        with self._lock:
            self._rules.append(_Rule(match, times, perform=True))

    def fail(self, match: TxnMatch, times: int | None = 1) -> None:
        """The next `times` matching transactions raise `KvUnavailable` without landing."""
        with self._lock:
            self._rules.append(_Rule(match, times, perform=False))

    def fail_gets(self, times: int) -> None:
        """The next `times` single-key reads raise `KvUnavailable`."""
        with self._lock:
            self._get_failures += times

    def heal(self) -> None:
        """Drop every rule: the store answers everything again."""
        with self._lock:
            self._rules.clear()
            self._get_failures = 0

    def get(self, key: str) -> KeyValue | None:
        with self._lock:
            failing = self._get_failures > 0
            if failing:
                self._get_failures -= 1
        if failing:
            raise KvUnavailable("injected: kv read failed")
        return self._inner.get(key)

    def _rule_for(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.match(compares, ops):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    self.hits += 1
                    return rule
        return None

    def txn(
        self, compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult:
        rule = self._rule_for(compares, success)
        if rule is None:
            return self._inner.txn(compares, success, failure)
        if not rule.perform:
            raise KvUnavailable("injected: kv transaction failed before the store saw it")
        result = self._inner.txn(compares, success, failure)
        self.landed.append((compares, success, result))
        raise KvUnavailable("injected: kv transaction performed, its answer lost")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


LeaderFactory = Callable[..., Awaitable[Harness]]
"""`await factory(wrap=..., start=..., **settings_overrides)` -> a leader."""


@contextlib.asynccontextmanager
async def harnesses_on(
    backend: str,
    request: pytest.FixtureRequest,
    *,
    kafka: str,
    prefix: str,
    history_url: str,
) -> AsyncIterator[LeaderFactory]:
    """`await factory(wrap=..., start=..., **settings)` -> a leader on `backend`'s kv (etcd,
    or a fresh PostgreSQL schema); everything closed and cleaned after."""
    built: list[Harness] = []
    async with contextlib.AsyncExitStack() as stack:
        sql_url: str | None = None
        etcd = "127.0.0.1:0"
        if backend == "postgresql":
            sql_url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
            migrations.upgrade(sql_url)
        else:
            etcd = request.getfixturevalue("etcd_endpoint")

        async def factory(
            *,
            start: bool = True,
            wrap: Callable[[KvBackend], KvBackend] | None = None,
            **overrides: Any,
        ) -> Harness:
            settings = make_settings(
                kafka=kafka, etcd=etcd, prefix=prefix, sql_url=sql_url, **overrides
            )
            h = Harness(settings, history_url, wrap=wrap)
            built.append(h)
            if start:
                await h.start()
            return h

        try:
            yield factory
        finally:
            for h in built:
                await h.close()
            if sql_url is None:
                cleaner = EtcdKv([etcd], f"{prefix}/")
                cleaner.delete_prefix("")
                cleaner.close()
            admin = KafkaAdmin(kafka)
            with contextlib.suppress(MetasrvError):
                admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
