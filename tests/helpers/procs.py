"""Run cronwell commands as real processes (kill -9, SIGSTOP, SIGTERM them in tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def spawn(
    *args: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m cronwell ARGS` in its own process group, output to `log`."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "cronwell", *args],
        env=os.environ | (env or {}),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(p: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode
