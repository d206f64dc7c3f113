"""Job targets: what an attempt runs. Each raises a classified error on failure so the
runtime knows whether a retry can help."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from cronwell import sdk
from cronwell.egress import EgressDenied
from cronwell.errors import LeaseLost
from cronwell.models import HttpTarget, JobTarget, Target
from cronwell.schedule import format_instant
from cronwell.sdk import Context

log = logging.getLogger("cronwell.job")

JobRunner = Callable[[JobTarget, float], Awaitable[None]]
"""How this worker runs a `job` target for the attempt at hand (its Kubernetes Job)."""

JOB_TIMEOUT_GRACE_SECONDS = 30.0
"""How much longer than timeoutSeconds the runtime lets a `job` attempt run: run_job's own
timeout deletes the overrunning Job first; the runtime's would leave it running."""
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


class TargetError(Exception):
    """A failed attempt. `retryable` False means retrying cannot help (HTTP 4xx, bad config);
    `sent` False means the effect certainly did not start (safe even for AtMostOnce)."""

    def __init__(
        self, message: str, *, retryable: bool = True, sent: bool = True, reason: str = "Failed"
    ):
        super().__init__(message)
        self.retryable = retryable
        self.sent = sent
        self.reason = reason


def _expand(value: str) -> str:
    """Header values may name environment variables: `Bearer ${env:API_TOKEN}`; never the
    worker's own configuration (CRONWELL_*: the database URL, the secrets key), which a
    tenant could otherwise send to a server of theirs."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("CRONWELL_"):
            raise TargetError(
                f"header refers to {name}: the worker's own settings are never sent; use "
                "valueFrom: {secretKeyRef: {name, key}} for a credential",
                retryable=False,
                sent=False,
                reason="InvalidTarget",
            )
        if name not in os.environ:
            raise TargetError(
                f"header refers to unset environment variable {name}",
                retryable=False,
                sent=False,
                reason="InvalidTarget",
            )
        return os.environ[name]

    return _ENV_REF.sub(sub, value)


async def run_http(
    target: HttpTarget,
    ctx: Context,
    client: httpx.AsyncClient,
    timeout_seconds: float,
    secrets: Mapping[str, str] | None = None,
) -> None:
    """One call. `secrets` holds the values of the valueFrom headers (decrypted from the
    store for this attempt); never logged, never part of an error message: a server that
    echoes the request in its error answer would otherwise put a credential into the
    store's last_error, `cronwell runs`, `dlq show`, Events and logs."""
    sensitive = [v for v in (secrets or {}).values() if v]
    for h in target.headers:
        if h.value is not None and _ENV_REF.search(h.value):
            sensitive += [v for v in (os.environ.get(n) for n in _ENV_REF.findall(h.value)) if v]
    try:
        await _call_http(target, ctx, client, timeout_seconds, secrets)
    except TargetError as e:
        message = str(e)
        for value in sorted(set(sensitive), key=len, reverse=True):
            message = message.replace(value, "***")
        if message == str(e):
            raise
        raise TargetError(message, retryable=e.retryable, sent=e.sent, reason=e.reason) from None


async def _call_http(
    target: HttpTarget,
    ctx: Context,
    client: httpx.AsyncClient,
    timeout_seconds: float,
    secrets: Mapping[str, str] | None,
) -> None:
    headers: dict[str, str] = {}
    for h in target.headers:
        if h.value is not None:
            headers[h.name] = _expand(h.value)
        elif secrets is None or h.name not in secrets:
            raise TargetError(
                f"header {h.name!r}: its Secret has not been resolved (the operator resolves "
                "valueFrom; check its Events on the ScheduledJob)",
                sent=False,
                reason="SecretUnresolved",
            )
        else:
            headers[h.name] = secrets[h.name]
    headers |= {
        "Idempotency-Key": ctx.key,
        "Cronwell-Fence-Token": str(ctx.fence),
        "Cronwell-Scheduled-For": format_instant(ctx.scheduled_for),
        "Cronwell-Attempt": str(ctx.attempt),
    }
    try:
        resp = await client.request(
            target.method,
            target.url,
            headers=headers,
            content=target.body,
            timeout=httpx.Timeout(timeout_seconds, connect=target.connect_timeout_seconds),
            follow_redirects=target.follow_redirects,
        )
    except EgressDenied as e:
        # Refused before any connection: nothing was sent, and retrying cannot help.
        raise TargetError(str(e), retryable=False, sent=False, reason="EgressDenied") from None
    except httpx.TooManyRedirects as e:
        raise TargetError(
            f"{target.method} {target.url}: {e}", retryable=False, reason="TooManyRedirects"
        ) from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        # No connection, so no request: nothing was sent (safe to retry even AtMostOnce).
        raise TargetError(f"connect to {target.url} failed: {e!r}", sent=False) from e
    except httpx.HTTPError as e:
        raise TargetError(f"{target.method} {target.url}: {type(e).__name__}: {e}") from e
    if 200 <= resp.status_code < 300:
        return
    if resp.is_redirect and not target.follow_redirects:
        raise TargetError(
            f"{target.method} {target.url} answered {resp.status_code} (redirect to "
            f"{resp.headers.get('location', '?')}), not followed: point the url at the final "
            "address, or set followRedirects: true (every hop is checked by the egress policy)",
            retryable=False,
            reason="Redirect",
        )
    retryable = not (400 <= resp.status_code < 500) or resp.status_code in (408, 429)
    raise TargetError(
        f"{target.method} {target.url} answered {resp.status_code}: {resp.text[:200]}",
        retryable=retryable,
        reason=f"HTTP{resp.status_code}",
    )


async def run_handler(name: str, ctx: Context) -> None:
    fn = sdk.get_handler(name)
    if fn is None:
        raise TargetError(
            f"no handler named {name!r} is registered in this worker (registered: "
            f"{', '.join(sdk.registered()) or 'none'}); import the module that "
            "defines it with --import",
            retryable=False,
            sent=False,
            reason="UnknownHandler",
        )
    if asyncio.iscoroutinefunction(fn):
        await fn(ctx)
        return
    await _run_sync(fn, ctx)


async def _run_sync(fn: Any, ctx: Context) -> None:
    """Run a sync handler in a thread; on cancellation set ctx.cancelled and raise LeaseLost
    inside the thread at its next bytecode (the flag alone for code in C calls)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    ident: list[int] = []

    def body() -> None:
        ident.append(threading.get_ident())
        try:
            fn(ctx)
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, done, e)
        else:
            loop.call_soon_threadsafe(_settle, done, None)

    thread = threading.Thread(target=body, name=f"job-{ctx.key}", daemon=True)
    thread.start()
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        ctx.cancel()
        # The thread's ending (the LeaseLost put into it, or its own return) is nobody's
        # to read any more: retrieved when it comes, not logged as "never retrieved" by the
        # future's finaliser whenever the collector gets to it (inside another traceback's
        # formatting, its ast.parse raised SystemError: ast's state is not re-entrant).
        done.add_done_callback(_consume)
        if ident:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(ident[0]), ctypes.py_object(LeaseLost)
            )
        raise


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


async def run(
    target: Target,
    ctx: Context,
    client: httpx.AsyncClient | None,
    timeout_seconds: float,
    secrets: Mapping[str, str] | None = None,
    job: JobRunner | None = None,
) -> None:
    """Run one attempt of `target`. `client`: the egress-checked client an HTTP target
    needs (None for the others); `job` runs a `job` target (None: this worker has no
    cluster, as in standalone mode, and refuses it)."""
    if target.job is not None:
        if job is None:
            raise TargetError(
                "a job target runs a Kubernetes Job: standalone mode (no cluster) cannot run "
                "it; apply the ScheduledJob to a cluster with cronwell's operator and workers",
                retryable=False,
                sent=False,
                reason="InvalidTarget",
            )
        await job(target.job, timeout_seconds)
    elif target.http is not None:
        if client is None:
            raise TypeError("an HTTP target needs a client")
        await run_http(target.http, ctx, client, timeout_seconds, secrets)
    elif target.handler is not None:
        ctx.payload = dict(target.handler.payload)
        await run_handler(target.handler.name, ctx)
    elif target.log is not None:
        log.info(
            "%s",
            target.log.message,
            extra={
                "action": "log_target",
                "job": f"{ctx.namespace}/{ctx.name}",
                "key": ctx.key,
                "attempt": ctx.attempt,
                "fence": ctx.fence,
            },
        )
