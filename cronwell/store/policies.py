"""Namespace and pool policies: the operator writes what it sees in the cluster, workers read
it (they read no Namespace or WorkerPool themselves: least privilege)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cronwell.store.db import Database, row_class


@row_class
class NamespacePolicy:
    """A Namespace's labels and egress annotations, as written (None: no annotation)."""

    namespace: str
    labels: dict[str, str]
    egress_allow: str | None
    egress_deny: str | None


@row_class
class PoolPolicyRow:
    """One WorkerPool's rules as stored (cronwell.tenancy.PoolPolicy is what workers check)."""

    pool: str
    owner_namespace: str
    namespaces: list[str]
    namespace_selector: dict[str, Any] | None
    handlers: list[str] | None


@row_class
class PoolKey:
    """Which WorkerPool a policy row is of."""

    pool: str
    owner_namespace: str


async def upsert_namespace(
    db: Database,
    *,
    namespace: str,
    labels: Mapping[str, str],
    egress_allow: str | None,
    egress_deny: str | None,
) -> None:
    """Record a Namespace's labels and egress annotations (no write when unchanged)."""
    await db.execute(
        "NamespacePolicyUpsert",
        {
            "namespace": namespace,
            "labels": json.dumps(labels, sort_keys=True),
            "egress_allow": egress_allow,
            "egress_deny": egress_deny,
        },
    )


async def delete_namespace(db: Database, *, namespace: str) -> None:
    """Forget a Namespace that is gone."""
    await db.execute("NamespacePolicyDelete", {"namespace": namespace})


async def list_namespaces(db: Database) -> list[NamespacePolicy]:
    """Every Namespace's labels and egress annotations."""
    return await db.rows(NamespacePolicy, "NamespacePolicyList")


async def upsert_pool(
    db: Database,
    *,
    pool: str,
    owner_namespace: str,
    namespaces: Sequence[str],
    namespace_selector: Mapping[str, Any] | None,
    handlers: Sequence[str] | None,
) -> None:
    """Record a WorkerPool's namespaces, namespace selector and handlers (None: any)."""
    await db.execute(
        "PoolPolicyUpsert",
        {
            "pool": pool,
            "owner_namespace": owner_namespace,
            "namespaces": list(namespaces),
            "namespace_selector": (
                json.dumps(namespace_selector) if namespace_selector is not None else None
            ),
            "handlers": list(handlers) if handlers is not None else None,
        },
    )


async def delete_pool(db: Database, *, pool: str, owner_namespace: str) -> None:
    """Forget a WorkerPool that is gone."""
    await db.execute("PoolPolicyDelete", {"pool": pool, "owner_namespace": owner_namespace})


async def list_pool(db: Database, *, pool: str) -> list[PoolPolicyRow]:
    """The policies of `pool`, one per WorkerPool of that name."""
    return await db.rows(PoolPolicyRow, "PoolPolicyList", {"pool": pool})


async def list_pool_keys(db: Database) -> list[PoolKey]:
    """Every WorkerPool that has a policy row."""
    return await db.rows(PoolKey, "PoolPolicyListAll")
