"""Drift repair at start-up, before reconciling: store rows whose CR is gone are tombstoned.

The other direction (a CR without a row) is kopf's resume handler: every CR is reconciled
when the operator starts, and apply_job creates what is missing.

Order matters: the store's live jobs are read *before* the CRs are listed, so a job
created while the list runs is never mistaken for an orphan (its row is not in the first
read). A CR deleted meanwhile is tombstoned by its finalizer handler anyway.
"""

from __future__ import annotations

import logging
import uuid

from cronwell import jobs
from cronwell.store import jobs as store_jobs
from cronwell.store.db import Database
from cronwell_operator.kube import Kube

log = logging.getLogger(__name__)


async def tombstone_orphans(db: Database, kube: Kube, namespaces: list[str]) -> list[uuid.UUID]:
    """Tombstone live jobs (of the served namespaces) that have no ScheduledJob CR."""
    rows = await store_jobs.list_live_refs(db, namespaces=namespaces)
    if not rows:
        return []
    crs = {ref.uid for ref in await kube.list_scheduledjobs(namespaces)}
    orphans = [r for r in rows if str(r.id) not in crs]
    for r in orphans:
        await jobs.delete_job_by_uid(db, r.id)
        log.warning(
            "tombstoned a job whose ScheduledJob is gone",
            extra={
                "action": "drift_tombstone",
                "job": str(r.id),
                "job_name": f"{r.namespace}/{r.name}",
            },
        )
    log.info(
        "drift repair done",
        extra={
            "action": "drift_repair",
            "jobs": len(rows),
            "crs": len(crs),
            "orphans": len(orphans),
        },
    )
    return [r.id for r in orphans]
