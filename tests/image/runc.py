"""Unpack an image archive and run it with runc as the kubelet would: the image's user,
entrypoint and environment, a read-only root filesystem, a fresh /tmp, no capabilities.

runc is what containerd runs underneath; using it directly needs no daemon and no registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Image:
    """A docker-archive unpacked: its root filesystem and its config (`docker inspect`'s)."""

    rootfs: Path
    config: dict[str, Any]
    repo_tags: list[str]
    layers: int


def manifest(archive: Path) -> dict[str, Any]:
    """The archive's manifest.json entry: Config (named by its digest), RepoTags, Layers."""
    with tarfile.open(archive) as outer:
        entry: dict[str, Any] = json.load(_member(outer, "manifest.json"))[0]
        return entry


def unpack(archive: Path, dest: Path) -> Image:
    """Apply the archive's layers in order, with OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`)."""
    rootfs = dest / "rootfs"
    rootfs.mkdir(parents=True)
    with tarfile.open(archive) as outer:
        manifest = json.load(_member(outer, "manifest.json"))[0]
        config = json.load(_member(outer, manifest["Config"]))
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=_member(outer, layer)) as tar:
                _apply_layer(tar, rootfs)
    return Image(rootfs, config["config"], manifest.get("RepoTags") or [], len(manifest["Layers"]))


def _member(tar: tarfile.TarFile, name: str) -> Any:
    f = tar.extractfile(name)
    assert f is not None, f"{name} missing from the image archive"
    return f


def _apply_layer(tar: tarfile.TarFile, rootfs: Path) -> None:
    keep = []
    for m in tar.getmembers():
        parent, base = os.path.split(m.name)
        if base == ".wh..wh..opq":
            for child in (rootfs / parent).glob("*"):
                _remove(child)
        elif base.startswith(".wh."):
            _remove(rootfs / parent / base.removeprefix(".wh."))
        elif not m.isdev():  # the runtime mounts /dev
            keep.append(m)
    # filter="tar" (3.11.4+): keep modes and owners, refuse paths that leave the rootfs.
    safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
    tar.extractall(rootfs, members=keep, numeric_owner=True, **safe)  # type: ignore[arg-type]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def bundle(
    image: Image,
    path: Path,
    args: list[str] | None = None,
    *,
    env: dict[str, str] | None = None,
    binds: dict[str, Path] | None = None,
    tmp: Path | None = None,
) -> list[str]:
    """Write an OCI bundle running the image (args replace CMD, as a Pod's `args`) in the
    host's network namespace; return the runc command that runs it in the foreground.

    binds maps container paths to host files mounted read-only (a Secret's volume); tmp, if
    given, is the host directory mounted on /tmp, so a test can see what the process wrote.
    """
    cfg = image.config
    uid, _, gid = cfg.get("User", "0").partition(":")
    path.mkdir(parents=True, exist_ok=True)
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "mode=755"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": "/etc/resolv.conf",
            "options": ["rbind", "ro"],
        },
    ]
    if tmp is None:
        mounts.append(
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev"],
            }
        )
    else:
        tmp.chmod(0o1777)
        mounts.append(
            {"destination": "/tmp", "type": "bind", "source": str(tmp), "options": ["rbind", "rw"]}
        )
    for dest, src in (binds or {}).items():
        mounts.append(
            {"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "ro"]}
        )
    spec = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid or uid)},
            "args": cfg.get("Entrypoint", []) + (args if args is not None else cfg.get("Cmd", [])),
            "env": cfg.get("Env", []) + [f"{k}={v}" for k, v in (env or {}).items()],
            "cwd": cfg.get("WorkingDir") or "/",
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "noNewPrivileges": True,
        },
        "root": {"path": str(image.rootfs), "readonly": True},
        "hostname": "cronwell-test",
        "mounts": mounts,
        # No network namespace: the host's, so 127.0.0.1 is the test's PostgreSQL.
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]},
    }
    (path / "config.json").write_text(json.dumps(spec))
    return ["runc", "--root", str(path / "state"), "run", "--bundle", str(path), _name(path)]


def _name(path: Path) -> str:
    return f"cronwell-test-{os.getpid()}-{path.name}"


def _runc(path: Path, *args: str) -> None:
    subprocess.run(["runc", "--root", str(path / "state"), *args], capture_output=True)


def run(image: Image, path: Path, args: list[str] | None = None, **kw: Any) -> Result:
    """Run the image to completion (see bundle() for the arguments)."""
    argv = bundle(image, path, args, **kw)
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
    finally:
        _runc(path, "delete", "--force", _name(path))
    return Result(p.returncode, p.stdout, p.stderr)


@contextmanager
def running(
    image: Image, path: Path, args: list[str] | None = None, **kw: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """Start the image; on exit send SIGTERM (as the kubelet does), wait, then clean up.

    Output goes to path/output. The Popen's returncode is the container's exit status.
    """
    argv = bundle(image, path, args, **kw)
    with (path / "output").open("wb") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield p
    finally:
        _runc(path, "kill", _name(path), "TERM")
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _runc(path, "kill", _name(path), "KILL")
            p.wait()
        _runc(path, "delete", "--force", _name(path))
