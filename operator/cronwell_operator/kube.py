"""The operator's own Kubernetes calls (status, Events, Lease, listing) outside kopf's handlers.

The `kubernetes` client is synchronous: each call runs in a worker thread. Its errors are
translated here into cronwell errors (KubeError and subclasses), raised `from` the original.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from cronwell import kubejson
from cronwell.errors import ApiUnavailable, CronwellError
from cronwell.models import GROUP, VERSION

PLURAL = "scheduledjobs"
KIND = "ScheduledJob"
COMPONENT = "cronwell-operator"


class KubeError(CronwellError):
    """The API server refused a request or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None):
        self.status = status
        super().__init__(message)


class KubeNotFound(KubeError):
    """The object does not exist (any more)."""


class KubeConflict(KubeError):
    """Optimistic concurrency: the object changed since it was read, or already exists."""


class KubeInvalid(KubeError):
    """The API server refused the object itself (400/422): its message says why."""


class KubeUnavailable(KubeError, ApiUnavailable):
    """The API server could not be reached, or answered 429/5xx: retry later."""


def _translate(e: Exception, what: str) -> KubeError:
    if isinstance(e, ApiException):
        status = e.status or 0
        cls = {404: KubeNotFound, 409: KubeConflict}.get(status, KubeError)
        if status == 429 or status >= 500:
            cls = KubeUnavailable
        return cls(f"{what}: HTTP {e.status} {e.reason}", status=e.status)
    return KubeUnavailable(f"{what}: {e}")


@dataclass(frozen=True)
class CRef:
    """Identity of one ScheduledJob CR."""

    uid: str
    namespace: str
    name: str


class Kube:
    """Async façade over the calls the operator makes besides kopf's own."""

    def __init__(self, api: client.ApiClient, *, threads: int = 16):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        # Bulk calls (status, Events, lists) and Lease calls never share threads: a renewal
        # queued behind a burst of status patches would miss its deadline and cost the
        # leadership (seen at 1,000 CRs with the default executor's 6 threads).
        self._bulk = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
        self._lease = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kube-lease")

    def close(self) -> None:
        self._bulk.shutdown(wait=False, cancel_futures=True)
        self._lease.shutdown(wait=False, cancel_futures=True)
        self.api.close()  # type: ignore[no-untyped-call]

    async def _call(
        self, what: str, fn: Any, *args: Any, lease_thread: bool = False, **kwargs: Any
    ) -> Any:
        loop = asyncio.get_running_loop()
        pool = self._lease if lease_thread else self._bulk
        try:
            return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))
        except (ApiException, HTTPError, OSError) as e:
            raise _translate(e, what) from e

    async def dry_run_job(self, job: dict[str, Any]) -> None:
        """Create `job` with dryRun=All and fieldValidation=Strict (the worker's own request,
        cronwell.kubejson): the API server runs its schema, its rules and the cluster's
        admission, and stores nothing. KubeInvalid carries its message."""
        meta = job["metadata"]
        what = f"dry-run create Job {meta['namespace']}/{meta['name']}"
        query = [("fieldValidation", "Strict"), ("dryRun", "All")]
        call = functools.partial(
            kubejson.request, self.api, "POST", kubejson.jobs_path(meta["namespace"]), query, job
        )
        try:
            await asyncio.get_running_loop().run_in_executor(self._bulk, call)
        except ApiException as e:
            if e.status == 409:
                return  # a Job of that name exists: the rest of it was valid
            if e.status in (400, 422):
                message = kubejson.api_message(e) or f"HTTP {e.status}"
                raise KubeInvalid(message, status=e.status) from None
            raise _translate(e, what) from e
        except (HTTPError, OSError) as e:
            raise _translate(e, what) from e

    # -- ScheduledJobs

    async def _list_objects(
        self, plural: str, namespaces: Iterable[str] = ()
    ) -> list[dict[str, Any]]:
        """Every object of ours of this plural in these namespaces (all when empty), whole,
        paginated (each page a consistent snapshot)."""
        out: list[dict[str, Any]] = []
        targets: list[str | None] = [*namespaces] or [None]
        for ns in targets:
            cont: str | None = None
            while True:
                kw: dict[str, Any] = {"limit": 500, **({"_continue": cont} if cont else {})}
                where = f"list {plural}.{GROUP} in {ns or 'all namespaces'}"
                c = self.custom
                if ns is None:
                    call = functools.partial(c.list_cluster_custom_object, GROUP, VERSION)
                else:
                    call = functools.partial(c.list_namespaced_custom_object, GROUP, VERSION, ns)
                page = await self._call(where, call, plural, **kw)
                out += page.get("items", [])
                cont = page.get("metadata", {}).get("continue")
                if not cont:
                    break
        return out

    async def list_scheduledjobs(self, namespaces: Iterable[str] = ()) -> list[CRef]:
        """Every ScheduledJob's identity."""
        items = await self._list_objects(PLURAL, namespaces)
        return [
            CRef(i["metadata"]["uid"], i["metadata"]["namespace"], i["metadata"]["name"])
            for i in items
        ]

    async def get_scheduledjob(self, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self._call(
            f"get ScheduledJob {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
        )
        return obj

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (keys set to None are removed)."""
        await self._call(
            f"patch status of ScheduledJob {namespace}/{name}",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    # -- Events

    async def post_event(
        self,
        ref: CRef,
        *,
        type_: str,
        reason: str,
        message: str,
        instance: str,
        kind: str = KIND,
    ) -> None:
        """An Event about one of our objects (a ScheduledJob unless `kind` says otherwise)."""
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{ref.name}.{uuid.uuid4().hex[:16]}", namespace=ref.namespace
            ),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind=kind,
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=instance,
        )
        await self._call(
            f"post Event {reason} for {kind} {ref.namespace}/{ref.name}",
            self.core.create_namespaced_event,
            ref.namespace,
            event,
        )

    # -- Lease

    async def get_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        try:
            lease: client.V1Lease = await self._call(
                f"get Lease {namespace}/{name}",
                self.coordination.read_namespaced_lease,
                name,
                namespace,
                lease_thread=True,
            )
        except KubeNotFound:
            return None
        return lease

    async def create_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease:
        assert lease.metadata is not None
        created: client.V1Lease = await self._call(
            f"create Lease {namespace}/{lease.metadata.name}",
            self.coordination.create_namespaced_lease,
            namespace,
            lease,
            lease_thread=True,
        )
        return created

    async def replace_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease:
        """Replace with the resourceVersion read: KubeConflict if anyone wrote it since."""
        assert lease.metadata is not None
        replaced: client.V1Lease = await self._call(
            f"update Lease {namespace}/{lease.metadata.name}",
            self.coordination.replace_namespaced_lease,
            lease.metadata.name,
            namespace,
            lease,
            lease_thread=True,
        )
        return replaced

    # -- admission (the webhook's lookups: WorkerPool names, Namespace annotations)

    async def list_cluster_names(self, plural: str) -> list[str] | None:
        """Names of every object of one of our resources, cluster-wide; None when the API
        server does not serve the resource (its CRD is not installed)."""
        try:
            items = await self._list_objects(plural)
        except KubeNotFound:
            return None
        return [item["metadata"]["name"] for item in items]

    async def workerpool_names(self) -> list[str] | None:
        """Every WorkerPool's name; None without the WorkerPool CRD."""
        return await self.list_cluster_names(self.WP_PLURAL)

    async def namespace_meta(self, name: str) -> dict[str, dict[str, str]]:
        """A Namespace's labels and annotations (both {} if it does not exist)."""
        try:
            ns: client.V1Namespace = await self._call(
                f"get Namespace {name}", self.core.read_namespace, name
            )
        except KubeNotFound:
            return {"labels": {}, "annotations": {}}
        meta = ns.metadata
        return {
            "labels": dict((meta.labels if meta else None) or {}),
            "annotations": dict((meta.annotations if meta else None) or {}),
        }

    async def list_namespaces(self, names: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Namespaces (these, or all) as {name, labels, annotations} (the tenancy sync)."""
        wanted = list(names)
        if wanted:
            out = []
            for n in wanted:
                meta = await self.namespace_meta(n)
                out.append({"name": n, **meta})
            return out
        page = await self._call("list Namespaces", self.core.list_namespace)
        return [
            {
                "name": ns.metadata.name,
                "labels": dict(ns.metadata.labels or {}),
                "annotations": dict(ns.metadata.annotations or {}),
            }
            for ns in page.items
        ]

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data, base64 as stored (KubeNotFound when it is absent). Only the
        operator calls this: workers never read Secrets."""
        secret: client.V1Secret = await self._call(
            f"get Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace
        )
        return {k: str(v) for k, v in (secret.data or {}).items()}

    @staticmethod
    def secret_key(data: dict[str, str], namespace: str, name: str, key: str) -> str:
        """One key of a Secret's data, decoded (KubeNotFound when the key is absent)."""
        if key not in data:
            raise KubeNotFound(
                f"Secret {namespace}/{name} has no key {key!r} (keys: "
                f"{', '.join(sorted(data)) or 'none'})"
            )
        return base64.b64decode(data[key]).decode("utf-8", errors="replace")

    # -- WorkerPools, scale, HPA (the pre-scaler's calls: operator/cronwell_operator/scaler.py)

    WP_PLURAL = "workerpools"
    WP_KIND = "WorkerPool"

    async def list_workerpools(self, namespaces: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Every WorkerPool of these namespaces (all when empty), whole objects."""
        return await self._list_objects(self.WP_PLURAL, namespaces)

    async def patch_workerpool_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge-patch a WorkerPool's status subresource (keys set to None are removed)."""
        await self._call(
            f"patch status of WorkerPool {namespace}/{name}",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            self.WP_PLURAL,
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    async def read_deployment_scale(self, namespace: str, name: str) -> int:
        """spec.replicas of a Deployment's scale subresource (KubeNotFound if it is gone)."""
        scale: client.V1Scale = await self._call(
            f"get scale of Deployment {namespace}/{name}",
            self.apps.read_namespaced_deployment_scale,
            name,
            namespace,
        )
        return int((scale.spec.replicas if scale.spec else None) or 0)

    async def read_deployment_ready(self, namespace: str, name: str) -> int:
        """status.readyReplicas of a Deployment: its pods passing their readiness probes."""
        dep: client.V1Deployment = await self._call(
            f"get Deployment {namespace}/{name}",
            self.apps.read_namespaced_deployment,
            name,
            namespace,
        )
        return int((dep.status.ready_replicas if dep.status else None) or 0)

    async def patch_deployment_scale(self, namespace: str, name: str, replicas: int) -> int:
        """Set spec.replicas through the scale subresource (never the Deployment itself)."""
        scale: client.V1Scale = await self._call(
            f"scale Deployment {namespace}/{name} to {replicas}",
            self.apps.patch_namespaced_deployment_scale,
            name,
            namespace,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )
        return int((scale.spec.replicas if scale.spec else None) or 0)

    async def list_hpas(self, namespace: str) -> list[dict[str, Any]]:
        """autoscaling/v2 HorizontalPodAutoscalers of a namespace, as camelCase dicts."""
        page = await self._call(
            f"list HorizontalPodAutoscalers in {namespace}",
            self.autoscaling.list_namespaced_horizontal_pod_autoscaler,
            namespace,
        )
        doc = self.api.sanitize_for_serialization(page)  # type: ignore[no-untyped-call]
        items: list[dict[str, Any]] = doc.get("items", [])
        return items

    async def patch_hpa(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch an HPA; a metadata.resourceVersion in `patch` makes it conditional
        (KubeConflict when the HPA changed since it was read)."""
        await self._call(
            f"patch HorizontalPodAutoscaler {namespace}/{name}",
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
            patch,
            _content_type="application/merge-patch+json",
        )

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def autoscaling(self) -> client.AutoscalingV2Api:
        return client.AutoscalingV2Api(self.api)
