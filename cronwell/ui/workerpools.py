"""The cluster's WorkerPools, for the forecast view: with a Kubernetes client (`--auth
kubernetes`) the dashboard plans each pool with the settings the operator's pre-scaler
uses (its WorkerPool's SLO, replicas per pod, bounds, lead time), not the defaults."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import pydantic
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cronwell import kubejson
from cronwell.models import GROUP, VERSION
from cronwell.workerpool import WorkerPoolSpec

log = logging.getLogger(__name__)

TTL_SECONDS = 30.0
"""How long a listing is reused: WorkerPools change by `kubectl apply`, not per second."""


@dataclass
class ClusterPools:
    """The WorkerPools' specs by pool name (a pool is its WorkerPool's name, as the
    pre-scaler reads them: the first of a name wins, invalid ones are left out), listed at
    most every TTL_SECONDS. None when the API server cannot say: the view then plans with
    the defaults and says so."""

    api: client.ApiClient
    ttl: float = TTL_SECONDS
    _at: float = field(default=-1e18, init=False)
    _specs: dict[str, WorkerPoolSpec] | None = field(default=None, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    async def get(self) -> dict[str, WorkerPoolSpec] | None:
        async with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                self._specs = await asyncio.to_thread(self._list)
                self._at = time.monotonic()
            return self._specs

    def _list(self) -> dict[str, WorkerPoolSpec] | None:
        try:
            doc = kubejson.request(
                self.api,
                "GET",
                f"/apis/{GROUP}/{VERSION}/workerpools",
            )
        except (ApiException, HTTPError, OSError) as e:
            log.warning("forecast: cannot list WorkerPools (planning with defaults): %s", e)
            return None
        specs: dict[str, WorkerPoolSpec] = {}
        for item in doc.get("items") or []:
            try:
                spec = WorkerPoolSpec.model_validate(item.get("spec") or {})
            except pydantic.ValidationError:
                continue  # the operator reports it on the WorkerPool's status
            specs.setdefault(str(item["metadata"]["name"]), spec)
        return specs
