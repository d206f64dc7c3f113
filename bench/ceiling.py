"""Ceiling: cronwell's claim/complete SQL pattern driven with no cronwell code.

The same N pending occurrences as the `burst` section (materialised by the scheduler), then
W plain processes, each a minimal synchronous psycopg loop:

    UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT B) RETURNING ...
    + one fenced batch completion (UPDATE ... FROM unnest + INSERT attempts, as
      OccurrenceSucceedBatch does)

starting at T. What cronwell itself adds on top (overlap locking, asyncio tasks per attempt,
spec validation, heartbeats, metrics) is the difference to the `burst` figure.

    python -m bench.ceiling --loop URL BATCH     # one driver process (internal)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

CLAIM = """
UPDATE cronwell_occurrences o
SET state = 'running', attempt = o.attempt + 1, fence = nextval('cronwell_fence'),
    worker_id = %(w)s, started_at = now(), lease_expires_at = now() + interval '60 seconds'
WHERE o.id IN (SELECT id FROM cronwell_occurrences
               WHERE pool = 'default' AND state = 'pending' AND run_at <= now()
               ORDER BY run_at LIMIT %(b)s FOR UPDATE SKIP LOCKED)
RETURNING o.idempotency_key, o.fence
"""

COMPLETE = """
WITH done AS (
    UPDATE cronwell_occurrences o
    SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
    FROM unnest(%(k)s::text[], %(f)s::bigint[]) AS t(k, f)
    WHERE o.idempotency_key = t.k AND o.fence = t.f AND o.state = 'running'
    RETURNING o.id, o.idempotency_key, o.scheduled_for, o.attempt, o.fence, o.worker_id,
              o.started_at, o.finished_at)
INSERT INTO cronwell_attempts (occurrence_id, idempotency_key, scheduled_for, attempt, fence,
                               worker_id, outcome, started_at, finished_at)
SELECT id, idempotency_key, scheduled_for, attempt, fence, worker_id, 'succeeded', started_at,
       finished_at
FROM done
"""


def loop(url: str, batch: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        # Wait for T on the database's clock, as a worker does.
        row = conn.execute(
            "SELECT extract(epoch FROM min(run_at) - now()) FROM cronwell_occurrences"
            " WHERE state = 'pending'"
        ).fetchone()
        if row and row[0] and row[0] > 0:
            time.sleep(float(row[0]))
        w = f"ceiling-{os.getpid()}"
        idle = 0
        while idle < 3:
            rows = conn.execute(CLAIM, {"w": w, "b": batch}).fetchall()
            if not rows:
                idle += 1
                time.sleep(0.05)
                continue
            idle = 0
            conn.execute(COMPLETE, {"k": [r[0] for r in rows], "f": [r[1] for r in rows]})


async def ceiling(db: Any, url: str, n: int, workers: int, batch: int) -> dict[str, Any]:
    """Run after the burst's seeding + materialisation (occurrences pending, due at T)."""
    procs = [
        subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "bench.ceiling", "--loop", url, str(batch)],
            start_new_session=True,
        )
        for _ in range(workers)
    ]
    t0 = time.monotonic()
    while any(p.poll() is None for p in procs):
        await asyncio.sleep(0.1)
        if time.monotonic() - t0 > 600:
            for p in procs:
                p.kill()
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min(scheduled_for))"
            " AS total, percentile_disc(0.99) WITHIN GROUP"
            " (ORDER BY extract(epoch FROM started_at - scheduled_for)) AS p99,"
            " percentile_disc(0.5) WITHIN GROUP"
            " (ORDER BY extract(epoch FROM started_at - scheduled_for)) AS p50"
            " FROM cronwell_occurrences WHERE state = 'succeeded'"
        )
        r = await cur.fetchone()
    total = float(r["total"])
    return {
        "occurrences": n,
        "succeeded": r["n"],
        "workers": workers,
        "batch": batch,
        "start_lag_p50_s": round(float(r["p50"]), 3),
        "start_lag_p99_s": round(float(r["p99"]), 3),
        "all_succeeded_after_s": round(total, 3),
        "per_second": round(r["n"] / max(total, 1e-3)),
    }


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--loop":
    loop(sys.argv[2], int(sys.argv[3]))
