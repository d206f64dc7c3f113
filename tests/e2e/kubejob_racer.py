"""One racing worker for tests/e2e/test_kubejob.py, as a real process (to be killed with -9):
`python -m tests.e2e.kubejob_racer KUBECONFIG OCCURRENCE_JSON GO_FILE`. Prints `ready`, waits
for GO_FILE (so that all racers start together), runs ensure_job, prints the Job's name
and uid as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from kubernetes import config

from cronwell.kubejob import Occurrence
from cronwell_worker.kubejob import JobClient, ensure_job
from tests.e2e.test_kubejob import TEMPLATE


def main() -> None:
    kubeconfig, occ_json, go = sys.argv[1:4]
    fields = json.loads(occ_json)
    occ = Occurrence(**fields | {"scheduled_for": datetime.fromisoformat(fields["scheduled_for"])})
    api = config.new_client_from_config(config_file=kubeconfig)
    jobs = JobClient(api)
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    ref = asyncio.run(ensure_job(jobs, TEMPLATE, occ))
    print(json.dumps({"name": ref.name, "uid": ref.uid}), flush=True)
    jobs.close()
    api.close()


if __name__ == "__main__":
    main()
