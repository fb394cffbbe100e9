"""buildctl.core.times: the one module that writes and reads stored times and duration flags."""

from datetime import datetime, timedelta, timezone

import pytest

from buildctl.core.errors import BadInputError
from buildctl.core.times import after, format_utc, parse_duration, parse_utc, utc_now


def test_parse_utc_reads_naive_and_zoned_times_as_utc():
    assert parse_utc("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_utc("2026-01-01T01:00:00+01:00") == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_utc("2026-01-01T00:00:00Z").tzinfo is not None
    with pytest.raises(ValueError):
        parse_utc("yesterday")


def test_stored_times_are_utc_with_microseconds_and_z():
    now = utc_now()
    assert now.endswith("Z") and len(now) == len("2026-01-01T00:00:00.000000Z")
    assert format_utc(datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == "2026-01-01T00:00:00.000000Z"
    assert format_utc(datetime(2026, 1, 1)) == "2026-01-01T00:00:00.000000Z"  # naive is UTC
    assert after("2026-01-01T00:00:00.000000Z", 3600) == "2026-01-01T01:00:00.000000Z"
    assert parse_utc(after(now, 1.5)) - parse_utc(now) == timedelta(seconds=1.5)


def test_durations():
    assert parse_duration("30m") == 1800 and parse_duration("2h") == 7200 and parse_duration("0") == 0
    assert parse_duration("90s") == 90 and parse_duration("1d") == 86400 and parse_duration(" 1.5 h ") == 5400
    for bad in ("", "5w", "-1m", "m", "1 2"):
        with pytest.raises(BadInputError, match="duration"):
            parse_duration(bad)


@pytest.mark.parametrize("seconds,text", [(3600, "1h"), (86400, "1d"), (90, "90s"), (120, "2m"), (0.5, "0.5s")])
def test_format_duration_reads_back_with_parse_duration(seconds, text):
    from buildctl.core.times import format_duration, parse_duration

    assert format_duration(seconds) == text and parse_duration(text) == seconds
