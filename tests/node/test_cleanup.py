"""The node harness leaves the host as it found it: after Ctrl-C, and after SIGKILL once
`python -m cronwell.testing.node down` ran (or the next node started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cronwell.testing.node import DIR_PREFIX, MASKED_DIRS, SYSCTLS, _sysctl_path

KUBECTL_TIMEOUT = "--timeout=90s"


def _node_dirs() -> list[str]:
    return sorted(str(p) for p in Path("/tmp").glob(f"{DIR_PREFIX}*") if p.is_dir())


def _host_state(others: list[str]) -> dict[str, object]:
    """What a node run may change on the host; ``others``: dirs of nodes already running
    (the session's), whose pods come and go meanwhile."""

    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{DIR_PREFIX}*"))
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        "sysctls": {name: _sysctl_path(name).read_text().strip() for name in SYSCTLS},
        "netns": run("ip", "netns", "list"),
        "links": run("ip", "-o", "link", "show"),
        "routes": run("ip", "route"),
        "iptables": run("iptables-save"),
        "mounts": len(mounts),
        "cgroups": cgroups,
        "dirs": {d: os.path.exists(d) for d in (*MASKED_DIRS, "/run/containerd")},
        "node_dirs": _node_dirs(),
        "shims": sorted(_live_shims(others)),
    }


def _live_shims(others: list[str]) -> list[int]:
    """containerd shims of no other node that are not zombies (PID 1 reaps those)."""
    shims = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split(" (", 1)[1].rsplit(")", 1)
            cmdline = (stat.parent / "cmdline").read_text()
        except OSError:
            continue
        # An empty cmdline: the process is exiting (its memory is gone), not a leftover.
        if not comm.startswith("containerd-shim") or rest.split()[0] == "Z" or not cmdline:
            continue
        if not any(other in cmdline for other in others):
            shims.append(int(stat.parent.name))
    return shims


def _assert_unchanged(before: dict[str, object], after: dict[str, object]) -> None:
    changed = {key: (before[key], value) for key, value in after.items() if before[key] != value}
    assert not changed, changed


def _up(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """`node up` in the background; returns it and its KUBECONFIG once the node is Ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cronwell.testing.node", "up"],
        stdout=subprocess.PIPE,
        stderr=(tmp / "up.log").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until Ready (or the process failed)
    assert line.startswith("export KUBECONFIG="), (tmp / "up.log").read_text()
    return proc, line.split("=", 1)[1].strip()


def _run_pod(kubeconfig: str) -> None:
    from cronwell.testing.controlplane import find_assets

    kubectl = str(find_assets(("kubectl",)) / "kubectl")
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    pod = ["run", "p", "--image=localhost/cronwell/pause:3.10.1", "--image-pull-policy=Never"]
    subprocess.run([kubectl, *pod], env=env, check=True, capture_output=True)
    wait = ["wait", "--for=condition=Ready", "pod/p", KUBECTL_TIMEOUT]
    subprocess.run([kubectl, *wait], env=env, check=True, capture_output=True, timeout=120)


@pytest.mark.timeout(600)
def test_ctrl_c_and_sigkill_leave_nothing_behind(tmp_path: Path) -> None:
    others = _node_dirs()
    before = _host_state(others)

    proc, kubeconfig = _up(tmp_path)
    _run_pod(kubeconfig)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    _assert_unchanged(before, _host_state(others))

    proc, kubeconfig = _up(tmp_path)
    _run_pod(kubeconfig)
    proc.kill()
    proc.wait()
    time.sleep(1)
    crashed = _host_state(others)
    # The pod's shim and the namespace outlive a SIGKILLed harness...
    assert crashed["netns"] != before["netns"] and crashed["shims"] != before["shims"]
    down = subprocess.run(
        [sys.executable, "-m", "cronwell.testing.node", "down"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    assert "cleaned 1 run(s)" in down.stderr
    # ...until `down` removes them and restores what the kubelet changed.
    _assert_unchanged(before, _host_state(others))
