"""The `cronwell` command: main.py is the group and what every command shares; the other
modules each hold a group of commands (jobs, backfill, forecast, scheduler, admin, convert, ui);
render.py prints, parse.py reads durations and instants. Other packages import only the
names below (the worker's and operator's commands register through the `cronwell.cli`
entry points)."""

# The command modules register their commands on `main` when imported.
from cronwell.cli import admin, backfill, convert, forecast, jobs, scheduler, ui  # noqa: F401
from cronwell.cli.jobs import load_or_fail
from cronwell.cli.main import (
    Env,
    given_url,
    invalid_setting,
    main,
    metrics_port_option,
    run,
    run_until_signal,
    settings_or_fail,
)
from cronwell.cli.parse import duration_option, parse_duration, parse_instant
from cronwell.cli.render import fmt_time, json_line, render_dead, render_runs

__all__ = [
    "Env",
    "duration_option",
    "fmt_time",
    "given_url",
    "invalid_setting",
    "json_line",
    "load_or_fail",
    "main",
    "metrics_port_option",
    "parse_duration",
    "parse_instant",
    "render_dead",
    "render_runs",
    "run",
    "run_until_signal",
    "settings_or_fail",
]
