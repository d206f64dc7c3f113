"""Operator settings are grouped, but the chart's variables and the CLI's flags keep their
names: each group reads its variables, and every flag lands in a field."""

from __future__ import annotations

import pytest

from cronwell_operator.cli import operator as operator_command
from cronwell_operator.settings import OperatorSettings, flat_names

# One variable of each group (and the top level), as the chart or a user sets them.
ENV = {
    "CRONWELL_OPERATOR_NAMESPACES": '["team-a", "team-b"]',
    "CRONWELL_OPERATOR_LEADER_ELECTION": "false",
    "CRONWELL_OPERATOR_LEASE_DURATION_SECONDS": "7",
    "CRONWELL_OPERATOR_STATUS_QPS": "3.5",
    "CRONWELL_OPERATOR_WEBHOOK_MAX_OCCURRENCES_PER_HOUR": "12",
    "CRONWELL_OPERATOR_WEBHOOK_REQUIRE_KNOWN_POOL": "false",
    "CRONWELL_OPERATOR_POOL_NAMESPACES": '{"batch": "team-a,team-b"}',
    "CRONWELL_OPERATOR_TENANCY_SYNC_SECONDS": "4",
    "CRONWELL_OPERATOR_PRESCALE": "false",
    "CRONWELL_OPERATOR_SCALE_INTERVAL_SECONDS": "9",
}


def test_each_group_reads_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    s = OperatorSettings()
    assert s.namespaces == ["team-a", "team-b"]
    assert s.leadership.enabled is False and s.leadership.lease_duration_seconds == 7
    assert s.status.qps == 3.5 and s.status.burst == 40
    assert s.webhook.max_occurrences_per_hour == 12 and s.webhook.require_known_pool is False
    assert s.tenancy.pool_namespaces == {"batch": "team-a,team-b"}
    assert s.tenancy.sync_seconds == 4
    assert s.scaling.enabled is False and s.scaling.interval_seconds == 9


def test_flags_override_the_environment_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONWELL_OPERATOR_STATUS_QPS", "3.5")
    monkeypatch.setenv("CRONWELL_OPERATOR_STATUS_BURST", "5")
    s = OperatorSettings.from_flat({"status_burst": 9, "leader_election": False, "prescale": False})
    assert (s.status.qps, s.status.burst) == (3.5, 9)  # a flag given does not hide the rest
    assert s.leadership.enabled is False and s.scaling.enabled is False


def test_every_flag_is_a_setting_and_unknown_names_are_refused() -> None:
    flags = {p.name for p in operator_command.params} - {"kubeconfig", "metrics_port"}
    known = set(flat_names()) | {"namespaces", "identity"}
    assert flags <= known, flags - known
    with pytest.raises(ValueError, match="unknown operator setting 'status_qsp'"):
        OperatorSettings.from_flat({"status_qsp": 1})


def test_a_bad_flag_value_is_one_clear_line() -> None:
    """Like the scheduler's and the worker's settings: no pydantic traceback."""
    from click.testing import CliRunner

    result = CliRunner().invoke(operator_command, ["--status-qps", "-1"])
    assert result.exit_code == 1, result.output
    assert "invalid setting" in result.output and "qps" in result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)
