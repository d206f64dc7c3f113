"""A command's pool size: CRONWELL_POOL_MAX_SIZE wins when set (the worker pinned 8 and
the relay 4 whatever it said), else the command's own default, else the setting's."""

from __future__ import annotations

import pytest

from cronwell.cli.main import pool_size
from cronwell.settings import DatabaseSettings


def test_the_variable_wins_over_a_commands_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONWELL_POOL_MAX_SIZE", "16")
    s = DatabaseSettings()
    assert pool_size(s, 4) == 16
    assert pool_size(s, None) == 16


def test_without_the_variable_the_commands_default_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRONWELL_POOL_MAX_SIZE", raising=False)
    s = DatabaseSettings()
    assert pool_size(s, 4) == 4
    assert pool_size(s, None) == 8
