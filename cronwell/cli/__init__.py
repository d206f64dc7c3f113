"""The `cronwell` command (a package: see main.py)."""

from cronwell.cli.main import (
    Env,
    _fmt_time,
    _load_or_fail,
    main,
    metrics_port_option,
    render_dead,
    render_runs,
    run,
    run_until_signal,
)
from cronwell.cli.parse import duration_option, parse_duration, parse_instant

__all__ = [
    "Env",
    "_fmt_time",
    "_load_or_fail",
    "duration_option",
    "main",
    "metrics_port_option",
    "parse_duration",
    "parse_instant",
    "render_dead",
    "render_runs",
    "run",
    "run_until_signal",
]
