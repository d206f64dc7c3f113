"""Helpers shared by e2e test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cronwell.testing.controlplane import Cluster, ControlPlaneError, find_assets


def fresh_namespace(kube: Cluster, kube_api: Any, prefix: str) -> Iterator[str]:
    """Create `<prefix>-<random>`, yield its name, delete it (it stays Terminating without
    a controller-manager). Fixtures `yield from` it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(kube_api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


class Helm:
    """The helm CLI from the envtest assets, bound to `kube` and to its own config/cache
    dirs under `home` (never the user's). Shared by the chart test modules."""

    def __init__(self, kube: Cluster, home: Path):
        try:
            self.binary = find_assets(("helm",)) / "helm"
        except ControlPlaneError as e:
            pytest.fail(f"helm is needed for the chart tests: {e}")
        self.kube = kube
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kube.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=120, env=self.env
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{proc.stderr}")
        return proc
