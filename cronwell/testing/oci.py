"""OCI image archives without Docker or a registry: the pause image and test images.

    python3 cronwell/testing/oci.py pause <k8s.io/kubernetes module>/build/pause OUT.tar

Why: every Pod's sandbox runs the pause container and no registry is reachable here, so
images are packed locally and loaded with ``ctr images import``. pause.c is compiled the
way build/pause/Makefile does (static gcc, -Os, VERSION from its TAG). Archives are
byte-reproducible (mtime 0, root-owned). Standard library only: hack/envtest.sh runs
this file with the system python3 before any virtualenv exists.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PAUSE_REPO = "localhost/cronwell/pause"


def _tar(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    """A reproducible tar of name -> (content, mode); a name ending in / is a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mode, info.mtime = mode, 0
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_archive(
    out: Path, name: str, files: Mapping[str, tuple[bytes, int]], config: Mapping[str, Any]
) -> None:
    """Write a one-layer OCI image archive named ``name`` (``repo:tag``) to ``out``.

    ``files`` become the layer (name -> (content, mode)); ``config`` is the image
    config's ``config`` object (Entrypoint, User, ...).
    """
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_tar = _tar(files)
    layer = blob(gzip.compress(layer_tar, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": dict(config),
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()],
        },
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(
            json.dumps(image_config, sort_keys=True).encode(),
            "application/vnd.oci.image.config.v1+json",
        ),
        "layers": [layer],
    }
    descriptor = blob(json.dumps(manifest, sort_keys=True).encode(), str(manifest["mediaType"]))
    descriptor["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [descriptor],
    }
    archive = {
        "oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
        "index.json": (json.dumps(index, sort_keys=True).encode(), 0o644),
    }
    for digest, data in blobs.items():
        archive[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = (data, 0o644)
    out.write_bytes(_tar(archive))


def image_name(archive: Path) -> str:
    """The name an archive written by write_archive gives its image."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json")
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["io.containerd.image.name"])


def build_pause(pause_dir: Path, out: Path) -> str:
    """Compile Kubernetes' pause.c statically, write its image archive, return its name."""
    match = re.search(r"^TAG \?= (\S+)$", (pause_dir / "Makefile").read_text(), re.M)
    if match is None:
        raise ValueError(f"no TAG in {pause_dir / 'Makefile'}")
    tag = match.group(1)
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        cflags = ["-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}-cronwell"]
        source = str(pause_dir / "linux" / "pause.c")
        subprocess.run(["gcc", *cflags, "-o", str(binary), source], check=True)
        subprocess.run(["strip", str(binary)], check=True)
        pause = binary.read_bytes()
    name = f"{PAUSE_REPO}:{tag}"
    write_archive(
        out, name, {"pause": (pause, 0o755)}, {"Entrypoint": ["/pause"], "User": "65535:65535"}
    )
    return name


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "pause":
        print("usage: oci.py pause <k8s.io/kubernetes dir>/build/pause OUT.tar", file=sys.stderr)
        return 2
    name = build_pause(Path(argv[1]), Path(argv[2]))
    print(f"oci: {name} -> {argv[2]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
