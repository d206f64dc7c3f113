"""The `job` target's Kubernetes side: create an occurrence's Job at most once, and learn how
it ended from one watch per worker (per namespace) instead of a poll loop per Job.

`KubeJobs` is what a worker runs a `job` target with (targets.run → KubeJobs.run →
run_job): one JobClient and one JobWatcher per worker, made on the first job attempt, so a
worker whose pool runs no job targets never needs the Kubernetes API.

The `kubernetes` client is synchronous: calls run in threads, each watch in its own thread
that hands events to the event loop. Errors become TargetError at this boundary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from cronwell import kubejob, kubejson
from cronwell.dispatch import Claimed
from cronwell.errors import DatabaseError
from cronwell.models import ConcurrencyPolicy, JobTarget, JobTemplate, ScheduledJobSpec
from cronwell.store import kube_jobs
from cronwell.store.db import Database
from cronwell_worker.targets import TargetError

log = logging.getLogger("cronwell.kubejob")


@dataclass(frozen=True)
class JobOutcome:
    """How a Job ended: Complete, or Failed with its condition's reason and message."""

    name: str
    succeeded: bool
    message: str = ""


def _error(e: Exception, what: str) -> TargetError:
    """An API error as a TargetError. `sent=False`: nothing ran that a retry would repeat,
    because a retry finds and adopts a Job this call may have created after all."""
    if isinstance(e, ApiException):
        status = e.status or 0
        detail = kubejson.api_message(e) or f"HTTP {status} {e.reason}"
        if status == 403:
            return TargetError(
                f"{what}: forbidden ({detail}): the worker's service account needs create, "
                "get, list, watch and delete on jobs in this namespace (chart value "
                "jobTarget.namespaces)",
                retryable=False,
                sent=False,
                reason="Forbidden",
            )
        if status in (400, 422):
            return TargetError(
                f"{what}: the API server refused the Job: {detail}",
                retryable=False,
                sent=False,
                reason="InvalidTarget",
            )
        return TargetError(f"{what}: {detail}", sent=False, reason=f"HTTP{status}")
    return TargetError(f"{what}: {type(e).__name__}: {e}", sent=False, reason="ApiUnavailable")


class JobClient:
    """The Job calls of one worker: list, create (AlreadyExists → adopt), get, delete.

    Plain JSON requests (cronwell.kubejson says why), shared with the webhook's dry-run."""

    def __init__(self, api: client.ApiClient, *, threads: int = 8):
        self.api = api
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kubejob")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def request(  # sync: called in a thread
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return kubejson.request(self.api, method, path, query, body)

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        call = functools.partial(self.request, method, path, query, body)
        try:
            return await loop.run_in_executor(self._pool, call)
        except (ApiException, HTTPError, OSError) as e:
            raise _error(e, what) from e

    async def list(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        data = await self._call(
            f"list Jobs {selector} in {namespace}",
            "GET",
            kubejson.jobs_path(namespace),
            [("labelSelector", selector)],
        )
        return list(data.get("items") or [])

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call(
            f"get Job {namespace}/{name}", "GET", kubejson.jobs_path(namespace, name)
        )

    async def create(self, job: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any] | None:
        """Create `job` (unknown fields are an error, never dropped) and return it as stored;
        None when a Job of that name exists already (the caller adopts). `dry_run`: the API
        server validates it (schema, its own rules, admission) and stores nothing."""
        meta = job["metadata"]
        query = [("fieldValidation", "Strict")] + ([("dryRun", "All")] if dry_run else [])
        try:
            return await self._call(
                f"create Job {meta['namespace']}/{meta['name']}",
                "POST",
                kubejson.jobs_path(meta["namespace"]),
                query,
                job,
            )
        except TargetError as e:
            if e.reason == "HTTP409":
                return None
            raise

    async def delete(
        self, namespace: str, name: str, propagation: kubejob.Propagation = "Foreground"
    ) -> None:
        """Delete a Job: foreground (its Pods go first; the Job stays visible, with a
        deletionTimestamp, until they are gone) for a Job that must stop, background for a
        finished one (history)."""
        try:
            await self._call(
                f"delete Job {namespace}/{name}",
                "DELETE",
                kubejson.jobs_path(namespace, name),
                body={"propagationPolicy": propagation},
            )
        except TargetError as e:
            if e.reason != "HTTP404":
                raise


@dataclass(frozen=True)
class JobRef:
    """One Job object: a name can be reused after a deletion, a uid never."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, job: dict[str, Any]) -> JobRef:
        meta = job["metadata"]
        return cls(meta["namespace"], meta["name"], meta["uid"])


async def ensure_job(jobs: JobClient, template: JobTemplate, occ: kubejob.Occurrence) -> JobRef:
    """The occurrence's Job to watch: an existing one adopted, or one created.

    Workers racing for one occurrence (a stale attempt and the one that took its lease
    over) compute the same name, and the API server lets one create through; the others
    see AlreadyExists and adopt it, after checking that it carries this occurrence's key."""
    while True:
        existing = await jobs.list(occ.namespace, occ.selector())
        step = kubejob.next_step(existing, occ)
        if isinstance(step, kubejob.Adopt):
            return next(JobRef.of(j) for j in existing if j["metadata"]["name"] == step.name)
        manifest = kubejob.manifest(template, occ, step.job_attempt)
        name = str(manifest["metadata"]["name"])
        created = await jobs.create(manifest)
        if created is not None:
            log.info(
                "created Job %s/%s",
                occ.namespace,
                name,
                extra={
                    "action": "job_created",
                    "job": f"{occ.namespace}/{occ.scheduledjob}",
                    "key": occ.key,
                    "attempt": occ.attempt,
                    "fence": occ.fence,
                },
            )
            return JobRef.of(created)
        other = await jobs.get(occ.namespace, name)
        if not kubejob.owned_by(other.get("metadata") or {}, occ):
            raise TargetError(
                f"Job {occ.namespace}/{name} exists but is not {occ.key}'s (no matching "
                f"{kubejob.ANNOTATION_KEY} annotation): delete or rename it",
                retryable=False,
                sent=False,
                reason="JobNameTaken",
            )
        if kubejob.adoptable(other):
            return JobRef.of(other)
        # It failed (or is being deleted) since our list: the next one is one past it.


async def run_job(
    jobs: JobClient,
    watcher: JobWatcher,
    template: JobTemplate,
    occ: kubejob.Occurrence,
    timeout_seconds: float,
    on_job: Callable[[JobRef], Awaitable[None]] | None = None,
) -> JobOutcome:
    """One attempt of a `job` target: the occurrence's Job, created or adopted, until it
    ends. Complete returns; Failed raises a retryable TargetError carrying the Job's reason
    and message (`sent=True`: a retry is a new Job, so AtMostOnce dead-letters instead).
    `on_job` is told which Job runs (the worker records it for status.active).

    Past `timeout_seconds` the attempt, still holding its lease, deletes the Job (foreground:
    its Pods first) so that a retry does not adopt a Job that overran. A cancellation (the
    lease was lost, the worker stops) leaves the Job alone: the next owner adopts it."""
    ref = await ensure_job(jobs, template, occ)
    if on_job is not None:
        await on_job(ref)
    try:
        async with asyncio.timeout(timeout_seconds):
            await watcher.watch(ref.namespace)  # after ensure_job: its list tells a 403 first
            outcome = await watcher.wait(ref)
    except TimeoutError:
        await jobs.delete(ref.namespace, ref.name)
        raise TargetError(
            f"Job {ref.namespace}/{ref.name} ran past timeoutSeconds ({timeout_seconds:g}s): "
            "deleted",
            reason="Timeout",
        ) from None
    if not outcome.succeeded:
        raise TargetError(
            f"Job {ref.namespace}/{ref.name} failed: {outcome.message}", reason="JobFailed"
        )
    return outcome


MAX_ENDED = 10_000
"""Outcomes remembered for Jobs that ended (finished or deleted), for waiters that come
after the event (a successor attempt adopting a finished Job)."""


class JobWatcher:
    """One watch per namespace over the pool's Jobs (label `cronwell.dev/pool`), feeding
    every waiter. Outcomes are kept by uid, so a Job deleted after it finished (its
    ttlSecondsAfterFinished) still reports how it ended, and a new Job that reuses a
    deleted one's name is never answered with the old one's outcome."""

    def __init__(
        self,
        jobs: JobClient,
        *,
        pool: str,
        namespaces: Iterable[str],
        timeout_seconds: int = 60,
        max_ended: int = MAX_ENDED,
    ):
        self.jobs = jobs
        self.max_ended = max_ended
        self.batch = client.BatchV1Api(jobs.api)
        self.selector = kubejob.pool_selector(pool)
        self.namespaces = sorted(set(namespaces))
        self.timeout_seconds = timeout_seconds
        self._live: dict[tuple[str, str], dict[str, Any]] = {}
        self._ended: OrderedDict[str, JobOutcome] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[JobOutcome]]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced: dict[str, asyncio.Event] = {}

    async def __aenter__(self) -> JobWatcher:
        await asyncio.gather(*(self.watch(ns) for ns in self.namespaces))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        for t in self._threads:
            await asyncio.to_thread(t.join, self.timeout_seconds + 5)

    def stop(self) -> None:
        """Stop watching and cancel the waiters; the watch threads end by their next event
        or their watch's timeout (daemon threads: nothing waits for them)."""
        self._stop.set()
        for waiters in self._waiters.values():
            for fut in waiters:
                fut.cancel()

    async def watch(self, namespace: str) -> None:
        """Watch `namespace` from now on (once: later calls wait for its first list)."""
        synced = self._synced.get(namespace)
        if synced is None:
            self._loop = asyncio.get_running_loop()
            synced = self._synced[namespace] = asyncio.Event()
            if namespace not in self.namespaces:
                self.namespaces.append(namespace)
            t = threading.Thread(
                target=self._run, args=(namespace,), name=f"watch-{namespace}", daemon=True
            )
            t.start()
            self._threads.append(t)
        await synced.wait()

    async def wait(self, job: JobRef) -> JobOutcome:
        """Until the Job is Complete or Failed (deleted before it finished: a failure)."""
        if job.namespace not in self._synced:
            raise TargetError(
                f"namespace {job.namespace} is not watched by this worker (its job-target "
                "namespaces: " + ", ".join(self.namespaces) + ")",
                retryable=False,
                sent=False,
                reason="Forbidden",
            )
        if (ended := self._ended.get(job.uid)) is not None:
            return ended
        assert self._loop is not None
        fut: asyncio.Future[JobOutcome] = self._loop.create_future()
        self._waiters.setdefault(job.uid, []).append(fut)
        try:
            return await fut
        finally:
            waiters = self._waiters.get(job.uid, [])
            if fut in waiters:
                waiters.remove(fut)
            if not waiters:
                self._waiters.pop(job.uid, None)

    # -- on the event loop

    def _seen(self, namespace: str, job: dict[str, Any], deleted: bool) -> None:
        meta = job["metadata"]
        name, uid = meta["name"], meta["uid"]
        state, message = kubejob.state(job)
        if deleted:
            if self._live.get((namespace, name), {}).get("metadata", {}).get("uid") == uid:
                del self._live[(namespace, name)]
            if state == "Active":
                state, message = "Failed", "Job was deleted before it finished"
        else:
            self._live[(namespace, name)] = job
        if state == "Active" or uid in self._ended:
            return
        outcome = JobOutcome(name, state == "Complete", message)
        self._ended[uid] = outcome
        while len(self._ended) > self.max_ended:
            self._ended.popitem(last=False)
        for fut in self._waiters.get(uid, []):
            if not fut.done():
                fut.set_result(outcome)

    def _replace_all(self, namespace: str, items: list[dict[str, Any]]) -> None:
        """After a (re)list: Jobs gone from the list were deleted while we were not watching
        (they end as they were last seen)."""
        listed = {(namespace, i["metadata"]["name"]): i for i in items}
        for key, job in list(self._live.items()):
            if key[0] == namespace and key not in listed:
                self._seen(namespace, job, deleted=True)
        for item in items:
            self._seen(namespace, item, deleted=False)
        self._synced[namespace].set()

    # -- in the watch thread

    def _post(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: we are shutting down
            self._stop.set()

    def _run(self, namespace: str) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    data = self.jobs.request(
                        "GET", kubejson.jobs_path(namespace), [("labelSelector", self.selector)]
                    )
                    version = data["metadata"]["resourceVersion"]
                    self._post(self._replace_all, namespace, data.get("items") or [])
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self.batch.list_namespaced_job,
                    namespace,
                    label_selector=self.selector,
                    resource_version=version,
                    timeout_seconds=self.timeout_seconds,
                    allow_watch_bookmarks=True,
                ):
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        break
                    obj = event["object"]
                    if not isinstance(obj, dict):
                        obj = self.batch.api_client.sanitize_for_serialization(obj)
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        obj["metadata"].setdefault("namespace", namespace)
                        self._post(self._seen, namespace, obj, event["type"] == "DELETED")
            except ApiException as e:
                if e.status == 410:  # our resourceVersion is too old: list again
                    version = None
                    continue
                log.warning("watch of Jobs in %s: HTTP %s; retrying", namespace, e.status)
                version = None
                self._stop.wait(1.0)
            except (HTTPError, OSError, ValueError) as e:
                log.warning("watch of Jobs in %s: %s; retrying", namespace, e)
                version = None
                self._stop.wait(1.0)


def load_api() -> client.ApiClient:
    """An API client from the in-cluster service account, else from the kubeconfig
    (KUBECONFIG or ~/.kube/config); a TargetError saying so when there is neither."""
    try:
        conf = client.Configuration()
        config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        return client.ApiClient(conf)
    except ConfigException:
        pass
    try:
        api: client.ApiClient = config.new_client_from_config()  # type: ignore[no-untyped-call]
        return api
    except (ConfigException, OSError) as e:
        raise TargetError(
            "a job target needs the Kubernetes API, and this worker has neither an in-cluster "
            f"service account nor a kubeconfig ({e}): run it in the cluster (the chart's "
            "worker) or set KUBECONFIG",
            sent=False,
            reason="KubernetesUnavailable",
        ) from None


class KubeJobs:
    """How one worker runs `job` targets: one JobClient and one JobWatcher over the pool's
    Jobs, made on the first job attempt (a worker that never meets a job target never
    needs the Kubernetes API); a namespace is watched from its first Job on.

    With the store (`db`), it also records which Job each attempt runs (status.active) and
    deletes the Jobs a ScheduledJob no longer needs (`tidy`: Replace, history limits)."""

    def __init__(
        self,
        pool: str,
        *,
        db: Database | None = None,
        api: Any = load_api,
        watch_timeout_seconds: int = 60,
    ):
        self.pool = pool
        self.db = db
        self._make_api = api
        self._watch_timeout = watch_timeout_seconds
        self._api: client.ApiClient | None = None
        self._jobs: JobClient | None = None
        self._watcher: JobWatcher | None = None
        self._tidying: dict[str, asyncio.Task[None]] = {}  # by ScheduledJob uid
        self._again: dict[str, tuple[Claimed, ScheduledJobSpec]] = {}

    def _started(self) -> tuple[JobClient, JobWatcher]:
        if self._jobs is None or self._watcher is None:
            self._api = self._make_api()
            self._jobs = JobClient(self._api)
            self._watcher = JobWatcher(
                self._jobs, pool=self.pool, namespaces=(), timeout_seconds=self._watch_timeout
            )
        return self._jobs, self._watcher

    async def run(
        self, c: Claimed, spec: ScheduledJobSpec, target: JobTarget, timeout_seconds: float
    ) -> None:
        """One attempt of `c`, whose target is `target`: run_job with this worker's client
        and watcher. Under Replace, the Jobs of the occurrences this one replaced are
        deleted first (the claim cancelled them in the store before handing it out)."""
        jobs, watcher = self._started()
        occ = kubejob.Occurrence(
            namespace=c.namespace,
            scheduledjob=c.name,
            scheduledjob_uid=str(c.job_id),
            pool=self.pool,
            key=c.key,
            scheduled_for=c.scheduled_for,
            attempt=c.attempt,
            fence=c.fence,
            max_attempts=c.max_attempts,
        )
        if spec.concurrency_policy == ConcurrencyPolicy.REPLACE:
            await self._tidy_logged(c, spec)

        async def on_job(ref: JobRef) -> None:
            await self._record(occ, ref)

        await run_job(jobs, watcher, target.job_template, occ, timeout_seconds, on_job)

    async def _record(self, occ: kubejob.Occurrence, ref: JobRef) -> None:
        """Record the attempt's Job in the store (fenced). A stale attempt records nothing;
        if Replace cancelled its occurrence meanwhile, the Job it just made (after the
        replacing attempt looked) is deleted here, so one of the two always sees it."""
        if self.db is None:
            return
        try:
            if await kube_jobs.record(self.db, key=occ.key, fence=occ.fence, job_name=ref.name):
                return
            state = (await kube_jobs.states(self.db, [occ.key])).get(occ.key)
        except DatabaseError as e:  # status.active only: the run goes on
            log.warning(
                "could not record the attempt's Job",
                extra={"action": "job_record_failed", "key": occ.key, "error": str(e)},
            )
            return
        if state == "cancelled" and self._jobs is not None:
            await self._jobs.delete(ref.namespace, ref.name)
            log.info(
                "deleted Job %s/%s: its occurrence was replaced",
                ref.namespace,
                ref.name,
                extra={"action": "job_deleted", "key": occ.key, "why": "replaced"},
            )

    async def tidy(self, c: Claimed, spec: ScheduledJobSpec) -> list[tuple[str, str]]:
        """Delete the ScheduledJob's Jobs it no longer needs (kubejob.to_delete): those of
        occurrences Replace cancelled (foreground) and finished ones beyond the history
        limits (background), only where the occurrence's outcome is recorded. Returns what
        was deleted, (name, propagation) each."""
        if self.db is None:
            return []
        jobs, _ = self._started()
        existing = await jobs.list(c.namespace, kubejob.scheduledjob_selector(c.name))
        keys = kubejob.keys_of(existing)
        states = await kube_jobs.states(self.db, keys) if keys else {}
        plan = kubejob.to_delete(
            existing,
            states,
            owner_uid=str(c.job_id),
            successful_limit=spec.successful_jobs_history_limit,
            failed_limit=spec.failed_jobs_history_limit,
        )
        for name, propagation in plan:
            await jobs.delete(c.namespace, name, propagation)
            log.info(
                "deleted Job %s/%s (%s)",
                c.namespace,
                name,
                "replaced" if propagation == "Foreground" else "history limit",
                extra={"action": "job_deleted", "job": f"{c.namespace}/{c.name}"},
            )
        return list(plan)

    async def _tidy_logged(self, c: Claimed, spec: ScheduledJobSpec) -> None:
        try:
            await self.tidy(c, spec)
        except (TargetError, DatabaseError) as e:
            # Not the attempt's failure: the next pass (after any outcome) tries again.
            log.warning(
                "could not delete Jobs of %s/%s: %s",
                c.namespace,
                c.name,
                e,
                extra={"action": "job_tidy_failed", "job": f"{c.namespace}/{c.name}"},
            )

    def recorded(self, c: Claimed, spec: ScheduledJobSpec) -> None:
        """An attempt of a job target ended and its outcome is recorded: tidy its
        ScheduledJob's Jobs in the background, one pass at a time per ScheduledJob (a pass
        asked for meanwhile runs once after it, with the newest spec)."""
        uid = str(c.job_id)
        if uid in self._tidying:
            self._again[uid] = (c, spec)
            return
        self._tidying[uid] = asyncio.create_task(self._tidy_passes(uid, c, spec))

    async def _tidy_passes(self, uid: str, c: Claimed, spec: ScheduledJobSpec) -> None:
        try:
            while True:
                await self._tidy_logged(c, spec)
                again = self._again.pop(uid, None)
                if again is None:
                    return
                c, spec = again
        finally:
            self._tidying.pop(uid, None)

    async def idle(self) -> None:
        """Until no tidy pass runs (tests; a stopping worker)."""
        while self._tidying:
            await asyncio.gather(*self._tidying.values(), return_exceptions=True)

    def close(self) -> None:
        for task in self._tidying.values():
            task.cancel()
        if self._watcher is not None:
            self._watcher.stop()
        if self._jobs is not None:
            self._jobs.close()
        if self._api is not None:
            self._api.close()  # type: ignore[no-untyped-call]
