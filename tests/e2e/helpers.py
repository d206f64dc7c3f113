"""Helpers shared by e2e test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from cronwell.testing.controlplane import Cluster


def fresh_namespace(kube: Cluster, kube_api: Any, prefix: str) -> Iterator[str]:
    """Create `<prefix>-<random>`, yield its name, delete it (it stays Terminating without
    a controller-manager). Fixtures `yield from` it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(kube_api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
