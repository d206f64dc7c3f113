"""`make dev-cluster`: a local control plane (etcd + kube-apiserver), an embedded
PostgreSQL, the CRDs, and cronwell's operator, a scheduler and a worker as local processes.

Prints the KUBECONFIG to export, so `kubectl apply -f examples/scheduledjobs/` and
`kubectl get scheduledjobs -w` work from another shell. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import stop_all  # noqa: E402
from cronwell.embedded import EmbeddedPostgres  # noqa: E402
from cronwell.testing.controlplane import ControlPlane  # noqa: E402


def _has_command(name: str) -> bool:
    r = subprocess.run(
        [sys.executable, "-m", "cronwell", name, "--help"], capture_output=True, check=False
    )
    return r.returncode == 0


def main() -> None:
    data = Path(os.environ.get("CRONWELL_DEV_DATA_DIR", ROOT / ".dev-cluster"))
    data.mkdir(exist_ok=True)
    pg = EmbeddedPostgres(data / "postgres")
    url = pg.start()
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ControlPlane() as cp:
        crds = sorted((ROOT / "crds").glob("*.yaml"))
        if crds:
            cp.install_crds(crds)
        env = os.environ | {"CRONWELL_DATABASE_URL": url, "KUBECONFIG": str(cp.kubeconfig)}
        subprocess.run([sys.executable, "-m", "cronwell", "migrate"], env=env, check=True)
        commands = [["scheduler"], ["worker", "--pool", "default"]]
        if _has_command("operator"):
            commands.insert(0, ["operator"])
        else:
            print("note: `cronwell operator` is not available in this build", flush=True)
        procs = []
        for cmd in commands:
            log = open(data / f"{cmd[0]}.log", "ab")  # noqa: SIM115 - lives as long as the process
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cronwell", *cmd],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        print(
            f"\nexport KUBECONFIG={cp.kubeconfig}\nexport CRONWELL_DATABASE_URL={url}\n"
            f"logs in {data}/*.log; Ctrl-C to stop\n",
            flush=True,
        )
        stop.wait()
        stop_all(procs)
    pg.stop()


if __name__ == "__main__":
    main()
