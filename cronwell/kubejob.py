"""The Kubernetes Job of an occurrence, as plain data: its name, labels, annotations, owner
reference and manifest, and which Job an attempt adopts or creates. No I/O here; the worker
does the API calls (docs/design/job-target.md).

Exactly-once creation rests on object names being unique in a namespace: a Job's name is a
function of the occurrence's idempotency key and the Job's ordinal for that key, so whoever
creates it first wins and everybody else gets AlreadyExists and adopts it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from cronwell.errors import CronwellError
from cronwell.models import API_VERSION, RESERVED_PREFIX, JobTemplate

MAX_NAME = 63
"""A Job's name is also the value of its `batch.kubernetes.io/job-name` label: ≤ 63."""

HASH_CHARS = 10
"""Base32 characters of sha256(key): 50 bits. Two keys of one ScheduledJob share a name only
by a collision, and `owned_by` then tells the Jobs apart (the second one fails loudly)."""

# Labels select (the worker's watch, kubectl get jobs -l, history pruning); annotations carry
# the exact values, which label syntax cannot hold (':' and '+' in keys and instants).
LABEL_SCHEDULEDJOB = f"{RESERVED_PREFIX}scheduledjob"
LABEL_POOL = f"{RESERVED_PREFIX}pool"
LABEL_KEY_HASH = f"{RESERVED_PREFIX}key-hash"
LABEL_SCHEDULED_FOR = f"{RESERVED_PREFIX}scheduled-for"
LABEL_JOB_ATTEMPT = f"{RESERVED_PREFIX}job-attempt"
ANNOTATION_KEY = f"{RESERVED_PREFIX}key"
ANNOTATION_SCHEDULED_FOR = f"{RESERVED_PREFIX}scheduled-for"
ANNOTATION_FENCE = f"{RESERVED_PREFIX}fence"
ANNOTATION_ATTEMPT = f"{RESERVED_PREFIX}attempt"

#: What each container of the Job is told about its occurrence (as the http target's
#: Idempotency-Key and Cronwell-Fence-Token headers): send them downstream.
ENV_KEY = "CRONWELL_IDEMPOTENCY_KEY"
ENV_FENCE = "CRONWELL_FENCE_TOKEN"
ENV_SCHEDULED_FOR = "CRONWELL_SCHEDULED_FOR"

_INVALID = re.compile(r"[^a-z0-9-]+")


class JobNameTaken(CronwellError):
    """A Job with the computed name exists but belongs to another occurrence (a hash collision,
    or an object someone else created): cronwell neither adopts nor replaces it."""


def key_hash(key: str) -> str:
    """The first HASH_CHARS of sha256(key) in lower-case base32 (DNS-1123 safe, no padding)."""
    digest = hashlib.sha256(key.encode()).digest()
    return base64.b32encode(digest).decode().lower()[:HASH_CHARS]


def _prefix(name: str) -> str:
    """The ScheduledJob's name as a DNS-1123 label start: lower-case, invalid runs as '-'."""
    cleaned = _INVALID.sub("-", name.lower()).strip("-")
    return re.sub(r"-{2,}", "-", cleaned) or "job"


def _label_value(name: str) -> str:
    """The ScheduledJob's name as a label value (≤ 63; valid names are already)."""
    return _prefix(name)[:MAX_NAME].rstrip("-") or "job"


def job_name(scheduledjob: str, key: str, job_attempt: int = 1) -> str:
    """`<scheduledjob>-<hash of key>`, then `-<n>` for the n-th Job of the key (n ≥ 2: a retry
    after a failed Job); the readable prefix is cut so the whole stays ≤ 63 characters."""
    if job_attempt < 1:
        raise ValueError(f"job_attempt starts at 1, got {job_attempt}")
    suffix = f"-{key_hash(key)}" + (f"-{job_attempt}" if job_attempt > 1 else "")
    prefix = _prefix(scheduledjob)[: MAX_NAME - len(suffix)].rstrip("-")
    return (prefix or "job")[: MAX_NAME - len(suffix)] + suffix


def label_instant(scheduled_for: datetime) -> str:
    """The nominal instant in label syntax: 20261201T090000Z (UTC)."""
    return scheduled_for.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


@dataclass(frozen=True, kw_only=True)
class Occurrence:
    """What names and labels one occurrence's Jobs (from the claim and the ScheduledJob)."""

    namespace: str
    scheduledjob: str
    scheduledjob_uid: str
    pool: str
    key: str
    scheduled_for: datetime
    attempt: int
    """The claim's attempt (every claim counts, lease takeovers too): an annotation only."""
    fence: int
    max_attempts: int | None = None
    """The occurrence's attempts (retry.maxAttempts): at most this many Jobs. A claim past it
    exists only because a lease expired (LeaseReap), to adopt the Job and record its end."""

    def selector(self) -> str:
        """Label selector of every Job of this occurrence, whatever its job attempt."""
        return (
            f"{LABEL_SCHEDULEDJOB}={_label_value(self.scheduledjob)},"
            f"{LABEL_KEY_HASH}={key_hash(self.key)}"
        )


def pool_selector(pool: str) -> str:
    """Label selector of the Jobs a pool's workers watch (one watch per worker)."""
    return f"{LABEL_POOL}={pool}"


def job_labels(occ: Occurrence, job_attempt: int) -> dict[str, str]:
    return {
        LABEL_SCHEDULEDJOB: _label_value(occ.scheduledjob),
        LABEL_POOL: occ.pool,
        LABEL_KEY_HASH: key_hash(occ.key),
        LABEL_SCHEDULED_FOR: label_instant(occ.scheduled_for),
        LABEL_JOB_ATTEMPT: str(job_attempt),
    }


def job_annotations(occ: Occurrence) -> dict[str, str]:
    return {
        ANNOTATION_KEY: occ.key,
        ANNOTATION_SCHEDULED_FOR: occ.scheduled_for.astimezone(UTC).isoformat(),
        ANNOTATION_FENCE: str(occ.fence),
        ANNOTATION_ATTEMPT: str(occ.attempt),
    }


def owner_reference(occ: Occurrence) -> dict[str, Any]:
    """The ScheduledJob owns its Jobs: deleting it lets the garbage collector delete them.
    blockOwnerDeletion stays off: setting it needs update rights on scheduledjobs/finalizers,
    which workers do not get."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ScheduledJob",
        "name": occ.scheduledjob,
        "uid": occ.scheduledjob_uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def manifest(template: JobTemplate, occ: Occurrence, job_attempt: int) -> dict[str, Any]:
    """The batch/v1 Job to create: the template's spec untouched but for the occurrence's
    environment in each container (CRONWELL_IDEMPOTENCY_KEY, CRONWELL_FENCE_TOKEN,
    CRONWELL_SCHEDULED_FOR: cronwell's values, whatever the template says); cronwell's
    labels and annotations added to the template's (the model refuses reserved keys in a
    template, so none of the template's is overridden)."""
    spec = copy.deepcopy(template.spec)
    env = [
        {"name": ENV_KEY, "value": occ.key},
        {"name": ENV_FENCE, "value": str(occ.fence)},
        {"name": ENV_SCHEDULED_FOR, "value": occ.scheduled_for.astimezone(UTC).isoformat()},
    ]
    ours = {e["name"] for e in env}
    pod = spec["template"]["spec"]
    for group in ("initContainers", "containers"):
        for container in pod.get(group) or []:
            if not isinstance(container, dict):
                continue  # the API server names the mistake when the Job is created
            given = container.get("env") or []
            if isinstance(given, list):  # else left as it is, for the API server to refuse
                own = [e for e in given if not (isinstance(e, dict) and e.get("name") in ours)]
                container["env"] = [*own, *env]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(occ.scheduledjob, occ.key, job_attempt),
            "namespace": occ.namespace,
            "labels": {**template.metadata.labels, **job_labels(occ, job_attempt)},
            "annotations": {**template.metadata.annotations, **job_annotations(occ)},
            "ownerReferences": [owner_reference(occ)],
        },
        "spec": spec,
    }


def scheduledjob_selector(scheduledjob: str) -> str:
    """Label selector of every Job of a ScheduledJob (its history, its running Jobs)."""
    return f"{LABEL_SCHEDULEDJOB}={_label_value(scheduledjob)}"


def owned_by(metadata: dict[str, Any], occ: Occurrence) -> bool:
    """Whether an existing Job (its metadata) is one of this occurrence's."""
    return (metadata.get("annotations") or {}).get(ANNOTATION_KEY) == occ.key


JobState = Literal["Active", "Complete", "Failed"]


def state(job: dict[str, Any]) -> tuple[JobState, str]:
    """A Job's outcome from its conditions (Complete / Failed, with the failure's reason and
    message: BackoffLimitExceeded, DeadlineExceeded, …); Active until one is True."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Complete", ""
        if cond.get("type") == "Failed":
            reason, message = cond.get("reason") or "Failed", cond.get("message") or ""
            return "Failed", f"{reason}: {message}" if message else reason
    return "Active", ""


@dataclass(frozen=True)
class Adopt:
    """Watch this existing Job (running or finished) instead of creating one."""

    name: str


@dataclass(frozen=True)
class Create:
    """Create the occurrence's Job number `job_attempt` (AlreadyExists: adopt it)."""

    job_attempt: int


def next_step(existing: list[dict[str, Any]], occ: Occurrence) -> Adopt | Create:
    """What an attempt does, from the occurrence's existing Jobs (listed by `occ.selector()`).

    A Job that is running or complete is adopted: a worker that took over a lost lease
    watches the Job its predecessor created, it does not start a second one. Only when every
    Job of the key failed does the attempt create the next one, numbered one past the
    highest; racing attempts compute the same number, so the API server lets one through.
    Never more Jobs than `occ.max_attempts`: past it the last failed Job is adopted, so a
    claim that took over an expired lease records that Job's failure instead of running
    the container again.
    """
    highest, last = 0, ""
    for job in existing:
        meta = job.get("metadata") or {}
        if not owned_by(meta, occ):
            raise JobNameTaken(
                f"Job {meta.get('namespace')}/{meta.get('name')} carries the labels of "
                f"{occ.key} but not its {ANNOTATION_KEY} annotation: delete or relabel it"
            )
        n = _job_attempt(meta)
        if adoptable(job):
            return Adopt(str(meta.get("name")))
        if n > highest:
            highest, last = n, str(meta.get("name"))
    if occ.max_attempts is not None and highest >= occ.max_attempts:
        return Adopt(last)
    return Create(highest + 1)


def deleting(job: dict[str, Any]) -> bool:
    """Whether the Job is being deleted (foreground deletion keeps it visible meanwhile)."""
    return bool((job.get("metadata") or {}).get("deletionTimestamp"))


def adoptable(job: dict[str, Any]) -> bool:
    """Running or complete, and not being deleted: a Job being deleted (timed out, replaced)
    will not complete, so an attempt that adopted it would only see it vanish."""
    return state(job)[0] != "Failed" and not deleting(job)


def _job_attempt(meta: dict[str, Any]) -> int:
    try:
        return max(1, int((meta.get("labels") or {}).get(LABEL_JOB_ATTEMPT, "1")))
    except ValueError:
        return 1


#: Occurrence states that are final: the outcome is recorded, nothing adopts its Jobs any
#: more. Any other state (pending, waiting, running, or one added later) keeps its Jobs.
FINAL = frozenset({"succeeded", "dead", "skipped", "missed", "cancelled"})

Propagation = Literal["Foreground", "Background"]


def _age(job: dict[str, Any]) -> tuple[str, int, str]:
    meta = job.get("metadata") or {}
    instant = str((meta.get("annotations") or {}).get(ANNOTATION_SCHEDULED_FOR, ""))
    return instant, _job_attempt(meta), str(meta.get("creationTimestamp", ""))


def to_delete(
    existing: list[dict[str, Any]],
    states: Mapping[str, str | None],
    *,
    owner_uid: str,
    successful_limit: int,
    failed_limit: int,
) -> list[tuple[str, Propagation]]:
    """Which of a ScheduledJob's Jobs to delete, and how (docs/design/job-target.md).

    `existing` are the Jobs listed by `scheduledjob_selector`; `states` maps each Job's key
    to its occurrence's state (None: no such occurrence any more, its history was pruned).
    A Job is deleted only when its occurrence's outcome is recorded (decision 4), never one
    of another ScheduledJob of the same name (owner uid) and never one already being deleted:

    - running Jobs of a `cancelled` occurrence (Replace cancelled it): foreground, so that
      its Pods go before it does, as the CronJob controller replaces a Job;
    - Complete Jobs beyond the newest `successful_limit`, Failed Jobs beyond the newest
      `failed_limit` (counted per Job, as CronJob counts them; a Job whose occurrence is
      still running counts but stays): background.
    """
    out: list[tuple[str, Propagation]] = []
    finished: dict[str, list[dict[str, Any]]] = {"Complete": [], "Failed": []}
    for job in existing:
        meta = job.get("metadata") or {}
        owners = {str(o.get("uid")) for o in meta.get("ownerReferences") or []}
        if owner_uid not in owners or deleting(job):
            continue
        phase = state(job)[0]
        if phase in finished:
            finished[phase].append(job)
            continue
        key = (meta.get("annotations") or {}).get(ANNOTATION_KEY)
        if key is not None and states.get(key, None) == "cancelled":
            out.append((str(meta.get("name")), "Foreground"))
    for phase, limit in (("Complete", successful_limit), ("Failed", failed_limit)):
        jobs = sorted(finished[phase], key=_age, reverse=True)
        for job in jobs[limit:]:
            meta = job.get("metadata") or {}
            key = (meta.get("annotations") or {}).get(ANNOTATION_KEY)
            if key is not None and (states.get(key) is None or states.get(key) in FINAL):
                out.append((str(meta.get("name")), "Background"))
    return out


def keys_of(existing: list[dict[str, Any]]) -> list[str]:
    """The occurrence keys the Jobs carry (to ask the store for their states)."""
    keys = {(j.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_KEY) for j in existing}
    return sorted(k for k in keys if k)
