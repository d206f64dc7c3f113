"""Helpers shared by the hack/bench_*.py sections (benchmark-only code)."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Sequence
from typing import Any


def lag_stats(lags: list[float], prefix: str = "start_lag") -> dict[str, Any]:
    """p50/p95/p99/max/mean of a list of seconds (sorted in place)."""
    lags.sort()
    if not lags:
        return {}

    def pct(p: float) -> float:
        return round(lags[min(len(lags) - 1, int(p * len(lags)))], 3)

    return {
        f"{prefix}_p50_s": pct(0.50),
        f"{prefix}_p95_s": pct(0.95),
        f"{prefix}_p99_s": pct(0.99),
        f"{prefix}_max_s": round(lags[-1], 3),
        f"{prefix}_mean_s": round(statistics.fmean(lags), 3),
    }


def db_url(server_url: str, dbname: str) -> str:
    """The same server's URL pointed at another database."""
    return server_url.rsplit("/", 1)[0] + "/" + dbname


def stop_all(procs: Sequence[subprocess.Popen[Any]], timeout: float = 30) -> None:
    """SIGTERM every process at once, then wait for each (SIGKILL after `timeout`)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


async def succeeded_lags(conn: Any) -> tuple[list[float], float | None]:
    """Start lags (seconds, database clock) of the succeeded occurrences, and when the
    last of them finished relative to its instant (None: none succeeded)."""
    cur = await conn.execute(
        "SELECT extract(epoch FROM started_at - scheduled_for)::float8 AS lag,"
        " extract(epoch FROM finished_at - scheduled_for)::float8 AS done_after"
        " FROM cronwell_occurrences WHERE state = 'succeeded'"
    )
    rows = await cur.fetchall()
    done = max((float(r["done_after"]) for r in rows), default=None)
    return [float(r["lag"]) for r in rows], done
