from __future__ import annotations

import pytest

from runs.configuration.durations import parse_duration, parse_optional_duration


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        (90, 90),
        (0, 0),
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("4h", 14400),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("2w", 1209600),
        (" 10M ", 600),
    ],
)
def test_durations_become_seconds(written: object, seconds: int) -> None:
    assert parse_duration(written) == seconds


@pytest.mark.parametrize("written", [-1, "-5m", "5 minutes", "1.5h", "h", "", True, 1.5, None, "off", [60]])
def test_bad_durations_are_rejected(written: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(written)


def test_off_means_no_limit_only_where_allowed() -> None:
    assert parse_optional_duration("off") is None
    assert parse_optional_duration("OFF") is None
    assert parse_optional_duration("2h") == 7200
