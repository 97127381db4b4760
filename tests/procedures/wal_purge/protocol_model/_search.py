"""Breadth-first search over every interleaving, states deduped by hash, and the
liveness check over what it explored.

States are kept by their 64-bit hash with the hash of the state they were first reached
from and the action's label, so memory is a few dozen bytes a state; a trace is rebuilt
by replaying the labels from the initial state. (Two distinct states sharing a 64-bit
hash would merge: at a few million states the chance is about 1e-7.)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.procedures.wal_purge.protocol_model._actions import Model
from tests.procedures.wal_purge.protocol_model._liveness import settle
from tests.procedures.wal_purge.protocol_model._world import Bounds, State, Variant, initial


@dataclass(frozen=True, slots=True)
class Counterexample:
    violation: str
    trace: tuple[tuple[str, State], ...]
    """(label, state after it) from the initial state to the violation."""

    def render(self, *, states: bool = False) -> str:
        lines = [f"VIOLATION: {self.violation}", "trace:"]
        for n, (label, state) in enumerate(self.trace, 1):
            lines.append(f"  {n:2d}. {label}")
            if states:
                lines.append(f"      {state}")
        return "\n".join(lines)


@dataclass(slots=True)
class Result:
    bounds: Bounds
    variant: Variant
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    complete: bool = False
    """Every reachable state was explored (no early stop, no state limit hit)."""
    counterexamples: list[Counterexample] = field(default_factory=list)

    def summary(self) -> str:
        found = f", {len(self.counterexamples)} counterexample(s)" if self.counterexamples else ""
        return (
            f"{self.bounds.describe()}; variant {self.variant.name or 'NONE'}: "
            f"{self.states} states, {self.transitions} transitions, {self.seconds:.1f} s"
            f"{'' if self.complete else ' (stopped early)'}{found}"
        )


def _trace(
    model: Model, parents: dict[int, tuple[int, str]], root: State, last: int
) -> list[tuple[str, State]]:
    chain: list[tuple[int, str]] = []
    h = last
    while True:
        parent, label = parents[h]
        if parent == h:
            break
        chain.append((h, label))
        h = parent
    chain.reverse()
    out: list[tuple[str, State]] = []
    state = root
    for h, label in chain:
        for got_label, nxt, _bad in model.successors(state):
            if got_label == label and hash(nxt) == h:
                state = nxt
                break
        else:  # pragma: no cover - the model is deterministic
            raise AssertionError(f"trace replay lost its way at {label!r}")
        out.append((label, state))
    return out


def search(
    bounds: Bounds,
    variant: Variant = Variant.NONE,
    *,
    stop_at_first: bool = True,
    liveness: bool = True,
    max_states: int | None = None,
    progress: Callable[[int, float], None] | None = None,
    wanted: Callable[[Counterexample], bool] | None = None,
) -> Result:
    """Explore every state reachable in `bounds`; check the safety invariants on every
    transition and (with `liveness`) that every explored state settles (_liveness.py).

    `stop_at_first`: stop at the first counterexample (`wanted` by the predicate, when
    one is given: the others are kept, one per kind, and the search goes on)."""
    model = Model(bounds, variant)
    root = initial(bounds, variant)
    result = Result(bounds, variant)
    started = time.perf_counter()
    h0 = hash(root)
    parents: dict[int, tuple[int, str]] = {h0: (h0, "")}
    queue: deque[State] = deque([root])
    seen_kinds: set[str] = set()
    next_report = 100_000

    def found(violation: str, trace: Callable[[], list[tuple[str, State]]]) -> bool:
        """Keep it (the first of each kind, and each wanted one); whether the search
        stops here."""
        kind = violation.split(":")[0]  # every violation starts with its kind
        if kind in seen_kinds and wanted is None:
            return stop_at_first
        example = Counterexample(violation, tuple(trace()))
        want = wanted is None or wanted(example)
        if kind not in seen_kinds or want:
            result.counterexamples.append(example)
        seen_kinds.add(kind)
        return stop_at_first and want

    while queue:
        state = queue.popleft()
        h = hash(state)
        if liveness:
            stuck = settle(model, state)
            if stuck is not None:
                violation, tail = stuck
                settling = [(f"(settling) {label}", st) for label, st in tail]
                if found(
                    f"liveness: {violation}",
                    lambda: [*_trace(model, parents, root, h), *settling],  # noqa: B023
                ):
                    break
        stop = False
        for label, nxt, bad in model.successors(state):
            result.transitions += 1
            hn = hash(nxt)
            if hn not in parents:
                parents[hn] = (h, label)
                queue.append(nxt)
            if bad is not None and found(
                bad,
                lambda: [*_trace(model, parents, root, h), (label, nxt)],  # noqa: B023
            ):
                stop = True
                break
        if stop:
            break
        if progress is not None and len(parents) >= next_report:
            next_report += 100_000
            progress(len(parents), time.perf_counter() - started)
        if max_states is not None and len(parents) >= max_states:
            break
    else:
        result.complete = True
    result.states = len(parents)
    result.seconds = time.perf_counter() - started
    return result
