"""Partition arithmetic and the width setting (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pydantic
import pytest

from cronwell.settings import SchedulerSettings
from cronwell.store.history_partitions import _gaps, partition_name

D = datetime(2026, 12, 4, tzinfo=UTC)


def test_width_must_divide_a_day() -> None:
    assert SchedulerSettings(history_partition_seconds=3600).history_partition_seconds == 3600
    with pytest.raises(pydantic.ValidationError, match="does not divide a day"):
        SchedulerSettings(history_partition_seconds=7000)
    assert SchedulerSettings(history_partition_seconds=300).history_partition_seconds == 300
    with pytest.raises(pydantic.ValidationError):
        SchedulerSettings(history_partition_seconds=30)


def test_gaps_are_grid_cells_minus_existing_ranges() -> None:
    day = timedelta(days=1)
    taken = [(datetime.min.replace(tzinfo=UTC), D + day)]
    assert _gaps(D, D + 3 * day, 86400, taken) == [
        (D + day, D + 2 * day),
        (D + 2 * day, D + 3 * day),
    ]
    # A wider grid after hourly partitions: the first cell is clipped to the last bound.
    taken = [(D, D + timedelta(hours=13))]
    assert _gaps(D, D + day, 86400, taken) == [(D + timedelta(hours=13), D + day)]
    assert _gaps(D, D + day, 86400, [(D, D + day)]) == []


def test_partition_names() -> None:
    assert partition_name("cronwell_occurrences", D, D + timedelta(days=1)) == (
        "cronwell_occurrences_p20261204"
    )
    assert partition_name(
        "cronwell_attempts", D + timedelta(hours=13), D + timedelta(hours=14)
    ) == ("cronwell_attempts_p20261204_1300")
