"""The node harness leaves the host as it found it: after Ctrl-C, and after SIGKILL once
`python -m cronwell.testing.node down` ran (or the next node started).

Other nodes may run meanwhile (the session's, another worktree's), so what is checked is
what this test's own runs recorded in their state.json; the sysctls and the masked
directories are shared, so they are compared only when no other node runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cronwell.testing.controlplane import find_assets
from cronwell.testing.node import DIR_PREFIX, MASKED_DIRS, SYSCTLS, _sysctl_path


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _iptables() -> str:
    """The host's rules (no counters, no timestamps)."""
    return "".join(_run("iptables", "-t", table, "-S") for table in ("filter", "nat", "mangle"))


def _node_dirs() -> list[str]:
    return sorted(str(p) for p in Path("/tmp").glob(f"{DIR_PREFIX}*") if p.is_dir())


def _shared_state() -> dict[str, object]:
    """Host state every node run touches: the kubelet's sysctls, the masked dirs."""
    return {
        "sysctls": {name: _sysctl_path(name).read_text().strip() for name in SYSCTLS},
        "dirs": {d: os.path.exists(d) for d in (*MASKED_DIRS, "/run/containerd")},
    }


def _leftovers(state: dict[str, Any]) -> list[str]:
    """What is left of one run: its dir, netns, veth, routes, cgroups, mounts, processes."""
    found = []
    run_dir, netns, veth = state["dir"], state["netns"], state["veth"]
    if os.path.exists(run_dir):
        found.append(f"dir {run_dir}")
    if netns in _run("ip", "netns", "list"):
        found.append(f"netns {netns}")
    if f"{veth}@" in _run("ip", "-o", "link", "show") or veth in _run("ip", "route"):
        found.append(f"link or route {veth}")
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*{state['cgroup_root']}")]
    mounts = Path("/proc/self/mountinfo").read_text()
    if run_dir in mounts or netns in mounts:
        found.append("mounts")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if run_dir.encode() in cmdline.read_bytes():
                found.append(f"process {cmdline.parent.name}")
        except OSError:
            continue
    return found


def _up(tmp: Path) -> tuple[subprocess.Popen[str], str, dict[str, Any]]:
    """`node up` in the background, once Ready: the process, its KUBECONFIG, its state."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cronwell.testing.node", "up"],
        stdout=subprocess.PIPE,
        stderr=(tmp / "up.log").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until Ready (or the process failed)
    assert line.startswith("export KUBECONFIG="), (tmp / "up.log").read_text()
    run_dir = proc.stdout.readline().split()[3]
    state = json.loads((Path(run_dir) / "state.json").read_text())
    return proc, line.split("=", 1)[1].strip(), state


def _run_pod(kubeconfig: str) -> None:
    kubectl = str(find_assets(("kubectl",)) / "kubectl")
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    pod = ["run", "p", "--image=localhost/cronwell/pause:3.10.1", "--image-pull-policy=Never"]
    subprocess.run([kubectl, *pod], env=env, check=True, capture_output=True)
    wait = ["wait", "--for=condition=Ready", "pod/p", "--timeout=90s"]
    subprocess.run([kubectl, *wait], env=env, check=True, capture_output=True, timeout=120)


@pytest.mark.timeout(600)
def test_ctrl_c_and_sigkill_leave_nothing_behind(tmp_path: Path) -> None:
    alone = not _node_dirs()
    shared, iptables = _shared_state(), _iptables()

    proc, kubeconfig, state = _up(tmp_path)
    _run_pod(kubeconfig)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    assert _leftovers(state) == []

    proc, kubeconfig, state = _up(tmp_path)
    _run_pod(kubeconfig)
    proc.kill()
    proc.wait()
    time.sleep(1)
    # The pod's shim, the namespace and the cgroups outlive a SIGKILLed harness...
    left = _leftovers(state)
    assert any(item.startswith("process") for item in left), left
    assert f"netns {state['netns']}" in left, left
    down = subprocess.run(
        [sys.executable, "-m", "cronwell.testing.node", "down"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    assert f"cleaned {state['dir']}" in down.stderr
    # ...until `down` removes them and restores what the kubelet changed.
    assert _leftovers(state) == []
    assert _iptables() == iptables  # the node's rules live in its netns
    if alone and not _node_dirs():
        assert _shared_state() == shared
