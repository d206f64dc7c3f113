"""Schedule engine speed: `next_after` per call, median and p99, through the path the
scheduler uses (`ScheduledJobSpec` -> `JobSchedule.from_spec` -> `next_after`).

    .venv/bin/python -m bench.schedule [--calls 2000] [--budget 20]

Per-minute, per-second and yearly schedules in America/New_York (outside DST, an hour
before the spring-forward change, an hour before the fall-back change) and
Australia/Lord_Howe (an hour before its half-hour spring-forward). Calls are chained
(each call starts from the previous answer) on 20 chains whose starts are spread over the
two hours from the case's start; chains are called in turn, so a case cut short by
`--budget` seconds still samples the whole window. No database: pure computation. The
garbage collector is off while timing (as `timeit` does): its pauses depend on the whole
process's heap, not on the engine.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from cronwell.models import ScheduledJobSpec
from cronwell.schedule import JobSchedule

CHAINS = 20
WINDOW = timedelta(hours=2)

# case -> (zone, local start, yearly expression for that zone and window)
CASES: dict[str, tuple[str, datetime, str]] = {
    "ny_outside_dst": ("America/New_York", datetime(2026, 6, 15, 12, 0), "0 12 15 6 *"),
    "ny_before_spring": ("America/New_York", datetime(2026, 3, 8, 1, 0), "30 2 8 3 *"),
    "ny_before_fall": ("America/New_York", datetime(2026, 11, 1, 0, 0), "30 1 1 11 *"),
    "lord_howe_before_spring": ("Australia/Lord_Howe", datetime(2026, 10, 4, 1, 0), "15 2 4 10 *"),
}
KINDS = {"minute": "* * * * *", "second": "* * * * * *"}


def measure(zone: str, expr: str, start: datetime, calls: int, budget: float) -> dict[str, Any]:
    spec = ScheduledJobSpec.model_validate(
        {"schedule": expr, "timeZone": zone, "target": {"log": {}}}
    )
    sched = JobSchedule.from_spec("bench", spec)
    t0 = start.replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)
    cursors = [t0 + WINDOW * i / CHAINS for i in range(CHAINS)]
    times: list[float] = []
    began = time.perf_counter()
    gc.disable()
    try:
        while len(times) < calls and (time.perf_counter() - began < budget or len(times) < 100):
            for i, cur in enumerate(cursors):
                a = time.perf_counter_ns()
                nxt = sched.next_after(cur)
                times.append((time.perf_counter_ns() - a) / 1000)
                assert nxt is not None and nxt > cur
                cursors[i] = nxt
    finally:
        gc.enable()
    times.sort()
    return {
        "calls": len(times),
        "median_us": round(statistics.median(times), 1),
        "p99_us": round(times[min(len(times) - 1, int(len(times) * 0.99))], 1),
    }


def schedule_bench(calls: int = 2000, budget: float = 20.0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, (zone, start, yearly) in CASES.items():
        for kind, expr in (*KINDS.items(), ("yearly", yearly)):
            out[f"{case}.{kind}"] = measure(zone, expr, start, calls, budget)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per case")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per case (>= 100 calls)")
    args = ap.parse_args()
    for k, v in schedule_bench(args.calls, args.budget).items():
        print(f"{k:<36} {json.dumps(v)}", flush=True)


if __name__ == "__main__":
    main()
