"""A long-running process (run_until_signal: worker, scheduler, operator, dashboard) runs
under the collector's thresholds for it, with what start-up made frozen out of every
collection. In a fresh interpreter: tuning this one would change the test run's collector."""

from __future__ import annotations

import json
import subprocess
import sys

from cronwell.cli.main import COLLECTOR_THRESHOLDS

PROBE = """
import gc, json
from cronwell.cli.main import run_until_signal
seen = {}
async def main():
    seen.update(thresholds=gc.get_threshold(), frozen=gc.get_freeze_count())
run_until_signal(main, lambda: None)
print(json.dumps(seen))
"""


def test_a_long_running_process_collects_under_its_thresholds_with_start_up_frozen() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert tuple(seen["thresholds"]) == COLLECTOR_THRESHOLDS != (700, 10, 10)
    assert seen["frozen"] > 10_000, seen  # the imports' objects (click, pydantic, psycopg)
