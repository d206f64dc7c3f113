"""Secret-backed header values, encrypted (never plaintext in the store): the operator
resolves and writes them, a worker reads them for each attempt so a rotation lands."""

from __future__ import annotations

import uuid
from typing import Any

from cronwell.store.db import Database, row_class


@row_class
class SecretJob:
    """A live job whose spec has Secret-backed headers."""

    id: uuid.UUID
    namespace: str
    name: str
    spec: dict[str, Any]


async def upsert(db: Database, *, job_id: uuid.UUID, ciphertext: str, digest: str) -> bool:
    """Store a job's encrypted values; True when they changed (`digest` differs) or are new."""
    changed = await db.scalar(
        "JobSecretUpsert", {"job_id": job_id, "ciphertext": ciphertext, "digest": digest}
    )
    return changed is not None


async def ciphertext(db: Database, *, job_id: uuid.UUID) -> str | None:
    """A job's encrypted values (None: none stored)."""
    token: str | None = await db.scalar("JobSecretGet", {"job_id": job_id})
    return token


async def delete(db: Database, *, job_id: uuid.UUID) -> None:
    """Drop a job's values (its spec has no Secret-backed headers any more)."""
    await db.execute("JobSecretDelete", {"job_id": job_id})


async def jobs_with_refs(db: Database) -> list[SecretJob]:
    """Live jobs whose spec has Secret-backed headers (the operator re-resolves them)."""
    return await db.rows(SecretJob, "JobSecretRefList")
