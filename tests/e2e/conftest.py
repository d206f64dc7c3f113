"""e2e fixtures: a real Kubernetes API server, from E2E_KUBECONFIG or a local control plane.

Every test under tests/e2e is marked ``e2e`` here, so ``pytest -m 'not e2e'`` skips them
without each module having to remember the marker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from cronwell.embedded import EmbeddedPostgres
from cronwell.testing.controlplane import (
    MISSING_BINARIES_HINT,
    Cluster,
    ControlPlane,
    ControlPlaneError,
    ExistingCluster,
    find_assets,
)
from tests.helpers.kube import crd_namespace, fresh_namespace, store_database

E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Session-wide hook: called with every collected item, so keep to this directory's.
    for item in items:
        if E2E_DIR in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def kube() -> Iterator[Cluster]:
    """The cluster under test: E2E_KUBECONFIG's if set, else a local etcd + kube-apiserver."""
    if kubeconfig := os.environ.get("E2E_KUBECONFIG"):
        yield ExistingCluster(kubeconfig)
        return
    try:
        assets = find_assets()
    except ControlPlaneError as exc:
        problem = str(exc)
    else:
        with ControlPlane(assets) as plane:
            yield plane
        return
    pytest.fail(
        f"e2e tests need a Kubernetes API server and none is available: {problem}\n"
        "(in short: run `make envtest`, or export E2E_KUBECONFIG)",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def kube_api(kube: Cluster) -> Iterator[Any]:
    """A ``kubernetes`` ApiClient for the cluster under test."""
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(kube: Cluster, kube_api: Any) -> Iterator[str]:
    """A fresh namespace per test (without a controller-manager it stays Terminating)."""
    yield from fresh_namespace(kube, kube_api, "e2e")


@pytest.fixture(scope="session")
def control_plane_assets() -> Path:
    """Binaries for tests that start their own ControlPlane; skip on an external cluster."""
    try:
        return find_assets()
    except ControlPlaneError:
        if os.environ.get("E2E_KUBECONFIG"):
            pytest.skip("needs the local control-plane binaries (E2E_KUBECONFIG is in use)")
        pytest.fail(f"local control-plane binaries missing: {MISSING_BINARIES_HINT}")


@pytest.fixture(scope="module")
def ns(kube: Cluster, kube_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace per test module, with cronwell's CRDs installed."""
    yield from crd_namespace(kube, kube_api, request)


@pytest.fixture(scope="module")
def store(pg_server: EmbeddedPostgres, template_db: str, request: pytest.FixtureRequest) -> str:
    """A migrated database per test module."""
    return store_database(pg_server, template_db, request)
