"""Leader faults under load: SIGKILL in the middle of a purge, SIGSTOP past the lease.

Three `metasrv start` processes on etcd; simulated datanodes write, flush and heartbeat
the whole time; the auto-prune ticker purges every 2 s. After each scenario every
datanode is crashed and replayed (tests/faults/_cluster.py `recovery_check`).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from procedures import ProcedureState
from tests._wait import wait_until
from tests.faults._budget import FaultBudget
from tests.faults._cluster import FaultCluster
from tests.faults._daemons import Daemon
from tests.faults._summary import FaultSummary

pytestmark = pytest.mark.faults

FINISHED_OK = (ProcedureState.SUCCEEDED, ProcedureState.SKIPPED)
# What a leader logs when it commits something: a deposed one must log none of these
# (until it wins a later term, which "elected leader" marks).
COMMITS = {"procedure submitted", "procedure finished"}
DELETED = "deleted WAL records"
NEW_TERM = "elected leader"
LOST_TERM = "lost leadership"


def test_leader_sigkilled_mid_purge_new_leader_resumes(
    cluster: FaultCluster, budget: FaultBudget
) -> None:
    lease = cluster.spec.lease_secs
    for _ in range(budget.rounds):
        interrupted: list[str] = []
        for _attempt in range(5):
            assert cluster.wait_in_flight(), "no purge ever started"
            old, interrupted = cluster.kill_leader()
            if interrupted:
                break
            # The purge finished between the scan and the kill: heal and try again.
            cluster.heal()
        assert interrupted, "never killed a leader while a purge was unfinished"
        killed_at = time.monotonic()
        new, _ = cluster.wait_leader(timeout=lease + 30, exclude=old)
        took = time.monotonic() - killed_at
        records = cluster.finish_resumed(interrupted)
        assert all(r.state in FINISHED_OK for r in records), [
            (r.id, r.state, r.error) for r in records
        ]
        print(
            f"SIGKILL {old.name}: {new.name} serving after {took:.1f}s, resumed "
            + ", ".join(f"{r.id[:8]}@{r.step}->{r.state.value}" for r in records)
        )
        old.start()
        cluster.run_for(budget.settle)
    cluster.assert_recovers()


def test_paused_leader_commits_nothing_after_it_continues(
    cluster: FaultCluster, budget: FaultBudget, summary: FaultSummary
) -> None:
    lease = cluster.spec.lease_secs
    for _ in range(budget.rounds):
        assert cluster.wait_in_flight(), "no purge ever started"
        old, _ = cluster.wait_leader()
        old.pause()
        summary.fault()
        interrupted = sorted(cluster.unfinished())
        new, _ = cluster.wait_leader(timeout=lease + 30, exclude=old)
        finished = {r.id: r for r in cluster.finish_resumed(interrupted)}
        # Let the new leader work a little, so the paused one wakes to a changed world.
        cluster.run_for(1.0)

        continued_at = time.time()
        old.resume()
        _wait_refers_away(old, timeout=lease + 15)
        # The moment the absence of commits is checked: the deposed process has run its
        # leader stop hooks (its procedures and ticker stopped), so it commits nothing more
        # in its old term.
        deposed = _until_new_term(_wait_stepped_down(old, since=continued_at, timeout=lease + 15))

        # Records the new term finished were not overwritten by the old one.
        after = cluster.procedure_records()
        for pid, record in finished.items():
            assert after[pid] == record, (record, after[pid])
        # A procedure already terminal in the kv store when the process was paused was
        # committed before; its "finished" line may still come out after SIGCONT.
        committed = [
            r
            for r in deposed
            if r.get("msg") in COMMITS
            and not (
                r.get("msg") == "procedure finished" and r.get("procedure_id") not in interrupted
            )
        ]
        assert committed == [], committed
        # Deleting is not a commit of its own: the purge deletes below the topic's marker,
        # written first and fenced (invariant 5). A DeleteRecords in flight when the
        # process was paused, or sent right after a marker its own term wrote, is logged
        # after SIGCONT; it must be at or below a marker some term committed.
        markers = cluster.monitor.markers
        above = [
            r
            for r in deposed
            if r.get("msg") == DELETED and r.get("offset", 0) > markers.get(str(r.get("topic")), -1)
        ]
        assert above == [], (above, markers)
        refused = [r.get("msg") for r in deposed if r.get("level") in ("warning", "error")]
        print(
            f"SIGSTOP {old.name} ({len(interrupted)} unfinished): {new.name} took over; "
            f"after SIGCONT {old.name} logged {len(refused)} warnings, 0 commits: {refused[:5]}"
        )
        cluster.run_for(budget.settle)
    cluster.assert_recovers()


def test_leadership_returning_to_a_process_restarts_its_auto_purges(
    cluster: FaultCluster, budget: FaultBudget, summary: FaultSummary
) -> None:
    """A loses the lease while its ticker waits on purges it submitted; B finishes them;
    A leads again: A's ticker must purge again (it once waited forever on the purges B
    had finished)."""
    lease = cluster.spec.lease_secs
    a, _ = cluster.wait_leader()
    assert cluster.wait_in_flight(), "no purge ever started"
    a.pause()
    summary.fault()
    waited_on = sorted(cluster.unfinished())
    b, _ = cluster.wait_leader(timeout=lease + 30, exclude=a)
    # B finishes the purges A's ticker round is still waiting for.
    cluster.finish_resumed(waited_on)
    a.resume()
    _wait_refers_away(a, timeout=lease + 15)
    # Only A may win the next election: the third daemon is paused while B dies.
    others = [d for d in cluster.daemons if d is not a and d is not b]
    for daemon in others:
        daemon.pause()
    _, interrupted = cluster.kill_leader()
    summary.fault(1 + len(others))
    try:
        again, _ = cluster.wait_leader(timeout=lease + 30)
        assert again is a, again.name
    finally:
        for daemon in others:
            daemon.resume()
    cluster.finish_resumed(interrupted)
    markers = dict(cluster.monitor.markers)
    cluster.wait_purge_progress(markers, timeout=60)
    b.start()
    cluster.run_for(budget.settle)
    cluster.assert_recovers()


def _until_new_term(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log records up to the process's next election win (if it wins a later term)."""
    out = []
    for record in records:
        if record.get("msg") == NEW_TERM:
            break
        out.append(record)
    return out


def _wait_stepped_down(daemon: Daemon, *, since: float, timeout: float) -> list[dict[str, Any]]:
    """The process's log records since `since` (epoch s), once they hold its "lost
    leadership": logged after every leader stop hook of the lost term has run."""

    def stepped_down() -> list[dict[str, Any]] | None:
        records = daemon.log_records(since=since)
        return records if any(r.get("msg") == LOST_TERM for r in records) else None

    return wait_until(
        stepped_down, f"deposed {daemon.name} to log {LOST_TERM!r}", timeout=timeout, interval=0.1
    )


def _wait_refers_away(daemon: Daemon, timeout: float) -> None:
    """The process answers heartbeats with 421 naming another process (it knows it was
    deposed; the name may be any later leader: the machine may fail over by itself)."""
    body: dict[str, object] = {"node_id": 0, "addr": None, "regions": [], "topics": []}

    seen: list[tuple[int, str]] = []

    def refers_away() -> bool:
        response = httpx.post(f"{daemon.url}/v1/heartbeat", json=body, timeout=2)
        seen.append((response.status_code, response.text))
        if response.status_code != 421:
            return False
        named = response.json()["error"].get("leader")
        return named is not None and named != daemon.addr

    try:
        wait_until(
            refers_away,
            f"deposed {daemon.name} to refer to another leader",
            timeout=timeout,
            interval=0.1,
            ignore=(httpx.HTTPError,),
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {seen[-1:]}") from None
