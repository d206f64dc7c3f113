"""What the workers need to know of the cluster, synced into the store by the leader, so
the workers themselves read no Kubernetes object (no Namespace, WorkerPool or Secret RBAC):

- Namespaces' labels and egress annotations (`cronwell_namespace_policies`);
- WorkerPools' namespaces, selector and handlers (`cronwell_pool_policies`);
- the values of Secret-backed headers, encrypted (`cronwell_job_secrets`): resolved when a
  ScheduledJob is reconciled and again every pass, so a rotated Secret reaches the next
  attempt within `tenancy_sync_seconds`.

A periodic pass rather than watches: one list of Namespaces and WorkerPools and one GET per
distinct referenced Secret each pass (jobs sharing a Secret share the GET), and no
cluster-wide watch on Secrets (which would need `list` and `watch` on every Secret of the
cluster).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping

from cronwell import tenancy
from cronwell.egress import ALLOW_ANNOTATION, DENY_ANNOTATION
from cronwell.errors import CronwellError
from cronwell.models import ScheduledJobSpec
from cronwell.secretbox import SecretBox, SecretsKeyError
from cronwell.store import job_secrets, policies
from cronwell.store.db import Database
from cronwell_operator.kube import Kube, KubeError, KubeNotFound
from cronwell_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


class SecretUnresolved(CronwellError):
    """A referenced Secret (or key) is missing, or there is no key to store it with."""


async def resolve_secrets(
    db: Database,
    kube: Kube,
    box: SecretBox | None,
    *,
    job_id: uuid.UUID | str,
    namespace: str,
    spec: ScheduledJobSpec,
    cache: dict[tuple[str, str], dict[str, str] | KubeError] | None = None,
) -> bool:
    """Read the job's Secret-backed header values (its own namespace only) and store them
    encrypted; True when the stored values changed. Never logs a value. `cache` shares one
    GET per Secret between the jobs of one pass."""
    http = spec.target.http
    refs = http.secret_headers if http is not None else []
    jid = uuid.UUID(str(job_id))
    if not refs:
        await job_secrets.delete(db, job_id=jid)
        return False
    if box is None:
        raise SecretUnresolved(
            "spec.target.http.headers uses valueFrom but the operator has no secrets key: "
            "set CRONWELL_SECRETS_KEY (the chart creates one in its secrets Secret)"
        )
    values: dict[str, str] = {}
    for h in refs:
        assert h.value_from is not None
        ref = h.value_from.secret_key_ref
        try:
            data = (cache or {}).get((namespace, ref.name))
            if data is None:
                try:
                    data = await kube.read_secret(namespace, ref.name)
                except KubeError as e:
                    data = e
                if cache is not None:
                    cache[(namespace, ref.name)] = data
            if isinstance(data, KubeError):
                raise data
            values[h.name] = kube.secret_key(data, namespace, ref.name, ref.key)
        except KubeNotFound as e:
            raise SecretUnresolved(
                f"header {h.name!r}: {e}: create the Secret {ref.name} with key {ref.key} in "
                f"namespace {namespace} (the ScheduledJob's own)"
            ) from None
        except KubeError as e:
            raise SecretUnresolved(
                f"header {h.name!r}: cannot read Secret {namespace}/{ref.name}: {e}: grant the "
                "operator `get` on it (chart value operator.secretAccess)"
            ) from None
    return await job_secrets.upsert(
        db, job_id=jid, ciphertext=box.encrypt(values), digest=box.digest(values)
    )


class TenancySync:
    def __init__(self, db: Database, kube: Kube, settings: OperatorSettings, box: SecretBox | None):
        self.db, self.kube, self.settings, self.box = db, kube, settings, box

    async def run(self) -> None:
        """Sync every `tenancy_sync_seconds` until cancelled; a failed pass is logged and
        retried at the next one (the workers keep the last synced state meanwhile)."""
        while True:
            try:
                await self.sync_once()
            except (CronwellError, SecretsKeyError) as e:
                log.warning(
                    "tenancy sync failed", extra={"action": "tenancy_sync", "error": str(e)}
                )
            except Exception:
                log.exception("tenancy sync failed", extra={"action": "tenancy_sync"})
            await asyncio.sleep(self.settings.tenancy.sync_seconds)

    async def sync_once(self) -> None:
        await self.sync_namespaces()
        await self.sync_pools()
        await self.resolve_all()

    async def sync_namespaces(self) -> None:
        listed = await self.kube.list_namespaces(self.settings.namespaces)
        seen = set()
        for ns in listed:
            ann: Mapping[str, str] = ns["annotations"]
            seen.add(ns["name"])
            await policies.upsert_namespace(
                self.db,
                namespace=ns["name"],
                labels=ns["labels"],
                egress_allow=ann.get(ALLOW_ANNOTATION),
                egress_deny=ann.get(DENY_ANNOTATION),
            )
        for row in await policies.list_namespaces(self.db):
            if row.namespace not in seen:
                await policies.delete_namespace(self.db, namespace=row.namespace)

    async def sync_pools(self) -> None:
        try:
            objs = await self.kube.list_workerpools()
        except KubeNotFound:
            objs = []  # no WorkerPool CRD: no WorkerPool policies
        seen: set[tuple[str, str]] = set()
        for obj in objs:
            p = tenancy.from_workerpool(obj)
            if p is None or p.owner_namespace is None:
                continue
            seen.add((p.pool, p.owner_namespace))
            await policies.upsert_pool(
                self.db,
                pool=p.pool,
                owner_namespace=p.owner_namespace,
                namespaces=p.namespaces,
                namespace_selector=p.selector or None,
                handlers=p.handlers,
            )
        for key in await policies.list_pool_keys(self.db):
            if (key.pool, key.owner_namespace) not in seen:
                await policies.delete_pool(
                    self.db, pool=key.pool, owner_namespace=key.owner_namespace
                )

    async def resolve_all(self) -> None:
        served = set(self.settings.namespaces)
        cache: dict[tuple[str, str], dict[str, str] | KubeError] = {}
        for row in await job_secrets.jobs_with_refs(self.db):
            if served and row.namespace not in served:
                continue
            try:
                spec = ScheduledJobSpec.model_validate(row.spec)
                changed = await resolve_secrets(
                    self.db, self.kube, self.box, job_id=row.id,
                    namespace=row.namespace, spec=spec, cache=cache,
                )  # fmt: skip
            except (CronwellError, ValueError) as e:
                log.warning(
                    "Secret-backed headers not resolved",
                    extra={"action": "secret_unresolved", "job": f"{row.namespace}/"
                           f"{row.name}", "error": str(e)},
                )  # fmt: skip
                continue
            if changed:
                log.info(
                    "Secret-backed headers updated",
                    extra={"action": "secret_rotated", "job": f"{row.namespace}/{row.name}"},
                )


def box_from_env() -> SecretBox | None:
    from cronwell.settings import SecretsSettings

    s = SecretsSettings()
    return SecretBox.from_settings(s.secrets_key, s.secrets_key_file)


__all__ = ["SecretUnresolved", "TenancySync", "box_from_env", "resolve_secrets"]
