"""Pure parts of the simulator: the seeded region plan and the on-disk ledger/manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from metasrv.errors import InvalidArgument
from toolbox.simulator import (
    Manifest,
    RegionKind,
    RegionStore,
    WalRow,
    WorkloadConfig,
    digest,
    plan_regions,
)


def test_region_plan_is_fixed_by_the_seed() -> None:
    config = WorkloadConfig(nodes=3, regions_per_node=8, slow_fraction=0.25, idle_fraction=0.125)
    plans = plan_regions(config)
    assert plans == plan_regions(config)
    assert plans != plan_regions(WorkloadConfig(nodes=3, regions_per_node=8, seed=8))
    kinds = [p.kind for p in plans]
    assert (kinds.count(RegionKind.IDLE), kinds.count(RegionKind.SLOW)) == (3, 6)
    assert len({p.region_id for p in plans}) == 24
    assert all((p.weight == 0) == (p.kind is RegionKind.IDLE) for p in plans)
    assert {p.region_id >> 32 for p in plans if p.node_id == 2} == {config.table_id + 2}


def test_workload_config_rejects_impossible_shares() -> None:
    with pytest.raises(InvalidArgument):
        WorkloadConfig(slow_fraction=0.8, idle_fraction=0.3)
    with pytest.raises(InvalidArgument):
        WorkloadConfig(nodes=0)


def test_ledger_ignores_a_torn_last_line(tmp_path: Path) -> None:
    store = RegionStore(tmp_path)
    store.open_ledger()
    store.record_ack(0, 10, digest(b"a"))
    store.record_ack(1, 11, digest(b"b"))
    store.close_ledger()
    with (tmp_path / "ledger.jsonl").open("a") as fh:
        fh.write("2 12 0f")  # the process died mid-line: that acknowledgement never happened
    entries = store.read_ledger()
    assert [(e.seq, e.entry_id) for e in entries] == [(0, 10), (1, 11)]
    assert entries[1].digest == digest(b"b")


def test_manifest_names_only_durable_ssts(tmp_path: Path) -> None:
    store = RegionStore(tmp_path)
    rows = [WalRow(5, 0, b'{"x": 1}'), WalRow(9, 1, b'{"x": 2}')]
    name = store.write_sst(1, rows)
    store.write_sst(2, rows[:1])  # a flush cut short: never named by a manifest
    manifest = Manifest(1, "t_0", 9, 1, (name,))
    store.commit_manifest(manifest)
    assert store.load_manifest() == manifest
    assert store.remove_orphans(manifest) == ["sst_00000002.jsonl"]
    assert list(store.read_ssts(manifest)) == rows
