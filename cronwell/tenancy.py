"""Which namespaces may use a pool and which handlers it serves (WorkerPool `namespaces`,
`namespaceSelector`, `handlers`; static pools from settings). Evaluated by the admission
webhook and again by the worker before each attempt, so a job that reached the store some
other way (`cronwell apply` straight to the database) still does not run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronwell.store.policies import PoolPolicyRow

ANY = "*"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against labels; an
    absent selector matches nothing (it is an addition to the explicit list)."""
    if not selector:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


@dataclass(frozen=True)
class PoolPolicy:
    """One WorkerPool's (or a static pool's) rules."""

    pool: str
    owner_namespace: str | None  # None: a static pool (settings)
    namespaces: tuple[str, ...] = (ANY,)
    selector: Mapping[str, Any] | None = None
    handlers: tuple[str, ...] | None = None  # None: any handler

    @classmethod
    def from_row(cls, r: PoolPolicyRow) -> PoolPolicy:
        return cls(
            r.pool,
            r.owner_namespace,
            tuple(r.namespaces or ()),
            r.namespace_selector,
            tuple(r.handlers) if r.handlers is not None else None,
        )

    def allows_namespace(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (
            ANY in self.namespaces
            or namespace == self.owner_namespace
            or namespace in self.namespaces
            or selector_matches(self.selector, labels)
        )

    def describe(self) -> str:
        who = [*([self.owner_namespace] if self.owner_namespace else []), *self.namespaces]
        if self.selector:
            who.append(f"namespaces matching {dict(self.selector)}")
        return ", ".join(who) or "none"


@dataclass(frozen=True)
class Refusal:
    reason: str  # PoolNotAllowed | HandlerNotAllowed
    message: str


def check(
    policies: Iterable[PoolPolicy],
    *,
    pool: str,
    namespace: str,
    labels: Mapping[str, str],
    handler: str | None,
) -> Refusal | None:
    """Why a job of `namespace` (running `handler`, if a handler target) may not use
    `pool`, or None. No policy at all for the pool: nothing to enforce here."""
    policies = list(policies)
    if not policies:
        return None
    usable = [p for p in policies if p.allows_namespace(namespace, labels)]
    if not usable:
        allowed = "; ".join(p.describe() for p in policies)
        owner = next((p.owner_namespace for p in policies if p.owner_namespace), None)
        fix = (
            f"add {namespace} to spec.namespaces (or a matching namespaceSelector) of the "
            f"WorkerPool {pool} in namespace {owner}"
            if owner
            else f"add {namespace} to the pool's namespaces in the chart's worker.pools"
        )
        return Refusal(
            "PoolNotAllowed",
            f"spec.pool: namespace {namespace} may not use pool {pool!r} (allowed: {allowed}): "
            f"use a pool of your namespace, or ask its owner to {fix}",
        )
    if handler is not None and all(p.handlers is not None for p in usable):
        served = sorted({h for p in usable for h in (p.handlers or ())})
        if handler not in served:
            return Refusal(
                "HandlerNotAllowed",
                f"spec.target.handler.name: pool {pool!r} does not serve handler {handler!r} "
                f"(it serves: {', '.join(served) or 'none'}): use a pool that serves it, or "
                "ask the pool's owner to add it to the pool's handlers",
            )
    return None


def from_workerpool(obj: Mapping[str, Any]) -> PoolPolicy | None:
    """A WorkerPool object's policy (None when it does not validate: it serves nobody)."""
    import pydantic

    from cronwell.workerpool import WorkerPool

    try:
        wp = WorkerPool.model_validate(obj)
    except pydantic.ValidationError:
        return None
    sel = wp.spec.namespace_selector
    return PoolPolicy(
        wp.pool,
        wp.metadata.namespace,
        tuple(wp.spec.namespaces or ()),
        sel.model_dump(by_alias=True) if sel is not None else None,
        tuple(wp.spec.handlers) if wp.spec.handlers is not None else None,
    )


def static(pool: str, namespaces: str | None, handlers: str | None) -> PoolPolicy:
    """A static pool's policy from comma-separated settings (namespaces None: any)."""

    def split(v: str) -> tuple[str, ...]:
        return tuple(p for p in v.replace(",", " ").split() if p)

    return PoolPolicy(
        pool,
        None,
        split(namespaces) if namespaces is not None else (ANY,),
        None,
        split(handlers) if handlers is not None else None,
    )
