"""`metasrv.wire.parse_rfc3339`, the one time format the API takes (`GET /v1/events?since=`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metasrv.wire import parse_rfc3339


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        ("2026-11-25T08:00:00Z", datetime(2026, 11, 25, 8, tzinfo=UTC)),
        ("2026-11-25t09:30:00.5+01:30", datetime(2026, 11, 25, 8, 0, 0, 500_000, tzinfo=UTC)),
        ("2026-11-25 03:00:00-05:00", datetime(2026, 11, 25, 8, tzinfo=UTC)),
        ("2026-11-25T08:00:00.123456789z", datetime(2026, 11, 25, 8, 0, 0, 123_456, tzinfo=UTC)),
        ("2016-12-31T23:59:60Z", datetime(2016, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
        ("0001-01-01T00:00:00+01:00", datetime.min.replace(tzinfo=UTC)),
        ("9999-12-31T23:59:59-01:00", datetime.max.replace(tzinfo=UTC)),
    ],
)
def test_rfc3339_times_are_read_in_utc(text: str, utc: datetime) -> None:
    assert parse_rfc3339(text) == utc
    assert parse_rfc3339(text).tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1700000000", "RFC 3339"),  # Unix seconds: not this format
        ("2026-11-25T08:00:00", "offset"),
        ("2026-11-25", "offset"),
        ("2026-11-25T08:00Z", "RFC 3339"),
        ("2026-11-25T08:00:00 01:00", "%2B"),
        ("2026-11-25T08:00:00+1:00", "RFC 3339"),
        ("2026-02-30T00:00:00Z", "day is out of range"),
        ("2026-11-25T24:00:00Z", "not a valid time"),
        ("0000-01-01T00:00:00Z", "out of range"),
        ("", "RFC 3339"),
    ],
)
def test_anything_else_is_refused_with_the_expected_form(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("+", r"\+")):
        parse_rfc3339(text)


# RFC 3339 offsets are whole minutes (zoneinfo's historic LMT offsets are not).
OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))


@given(st.datetimes(timezones=OFFSETS))
def test_every_aware_datetime_round_trips(at: datetime) -> None:
    try:
        expected = at.astimezone(UTC)
    except OverflowError:
        return
    assert parse_rfc3339(at.isoformat()) == expected
