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

__all__ = [
    "Env",
    "_fmt_time",
    "_load_or_fail",
    "main",
    "metrics_port_option",
    "render_dead",
    "render_runs",
    "run",
    "run_until_signal",
]
