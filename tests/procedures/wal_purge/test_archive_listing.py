"""The purge's listing of a topic's archive against the real S3 server, when one listing
leaves out an object that exists: S3Proxy's filesystem backend can list a topic while another
object of it is being written and miss objects already there. A range a listing leaves short
is listed again, up to three listings (`LISTINGS`), and what they saw merged; a real gap stays one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metasrv.archive import ObjectStore, StoredObject, WalRecord
from metasrv.settings import ArchiveSettings
from procedures.wal_purge import archived_ranges, covering_chain
from tests._archive import archive_settings, put_archived
from toolbox.stack import S3Endpoint


def _records(first: int, last: int) -> list[WalRecord]:
    return [WalRecord(i, 0, None, b"v%d" % i) for i in range(first, last + 1)]


@pytest.fixture
def settings(s3_endpoint: S3Endpoint, s3_prefix: str) -> ArchiveSettings:
    return archive_settings(s3_endpoint, s3_prefix)


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch, archive_store: ObjectStore) -> Iterator[list[int]]:
    """The real listing, with the first one leaving out the object of entries 10..19 (as
    the server does under a concurrent put); yields how many objects each listing returned."""
    real = ObjectStore.list
    counts: list[int] = []

    def first_one_short(self: ObjectStore, prefix: str) -> list[StoredObject]:
        missed = "00000000000000000010-" if not counts else None
        listed = [o for o in real(self, prefix) if missed is None or missed not in o.key]
        counts.append(len(listed))
        return listed

    monkeypatch.setattr(ObjectStore, "list", first_one_short)
    yield counts


async def test_a_listing_that_misses_an_object_is_listed_again(
    settings: ArchiveSettings, archive_store: ObjectStore, listings: list[int]
) -> None:
    for first, last in ((0, 9), (10, 19), (20, 29)):
        put_archived(archive_store, "t", _records(first, last))

    chain = await covering_chain(settings, "t", 0, 30, timeout=5.0)

    assert chain is not None
    assert [(r.first_entry_id, r.last_entry_id) for r in chain] == [(0, 9), (10, 19), (20, 29)]
    assert listings == [2, 3]  # the second listing found what the first missed


async def test_a_real_gap_is_listed_at_most_listings_times_and_stays_a_gap(
    settings: ArchiveSettings, archive_store: ObjectStore, listings: list[int]
) -> None:
    for first, last in ((0, 9), (20, 29)):
        put_archived(archive_store, "t", _records(first, last))

    assert await covering_chain(settings, "t", 0, 30, timeout=5.0) is None
    assert len(listings) == 3  # procedures/wal_purge/_archive.py: LISTINGS


async def test_without_a_wanted_range_one_listing_is_made(
    settings: ArchiveSettings, archive_store: ObjectStore, listings: list[int]
) -> None:
    put_archived(archive_store, "t", _records(0, 9))

    ranges = await archived_ranges(settings, "t", timeout=5.0)

    assert [(r.first_entry_id, r.last_entry_id) for r in ranges] == [(0, 9)]
    assert listings == [1]
