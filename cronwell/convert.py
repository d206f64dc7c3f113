"""CronJob YAML → ScheduledJob YAML, as plain data (the `cronwell convert` command's core).

Reads what users have: single documents, multi-document streams, `kind: List` (what
`kubectl get cronjobs -A -o yaml` prints) and `CronJobList`. Every field of a CronJob is
either carried, carried with a note, or reported as a warning: none is dropped silently.
The converted object keeps the CronJob's behaviour where cronwell's defaults differ
(concurrency Allow, history 3/1, no retry of a failed Job); docs/migrating-from-cronjob.md
explains each choice. Files and directories are the caller's (the CLI); this module only
sees text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import yaml

from cronwell import loader
from cronwell.errors import SpecError
from cronwell.models import API_VERSION, ConcurrencyPolicy, ScheduledJob

#: CronJob's concurrencyPolicy → cronwell's (Forbid skips the new run, as Skip does).
CONCURRENCY = {
    "Allow": ConcurrencyPolicy.ALLOW,
    "Forbid": ConcurrencyPolicy.SKIP,
    "Replace": ConcurrencyPolicy.REPLACE,
}
#: CronJob's defaults, written out because cronwell's differ (Skip, 100, 100).
CRONJOB_DEFAULTS = {
    "concurrencyPolicy": "Allow",
    "successfulJobsHistoryLimit": 3,
    "failedJobsHistoryLimit": 1,
}
#: cronwell's longest attempt (timeoutSeconds' maximum): a CronJob's Job has no time limit
#: unless its activeDeadlineSeconds sets one.
MAX_TIMEOUT_SECONDS = 7 * 86400
#: Extra time past activeDeadlineSeconds for the Job's Failed condition to arrive.
DEADLINE_MARGIN_SECONDS = 300

#: Set by the API server, not by the user: dropped without a warning.
SERVER_METADATA = {
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_TZ_PREFIX = re.compile(r"^\s*(CRON_TZ|TZ)=(\S+)\s+")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TEMPLATE_PATH = "spec.target.job.jobTemplate"
_KNOWN_SPEC = {
    "schedule",
    "timeZone",
    "concurrencyPolicy",
    "startingDeadlineSeconds",
    "suspend",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "jobTemplate",
}


@dataclass(frozen=True)
class Converted:
    """One ScheduledJob and what the user should know about its conversion."""

    source: str
    """Where the CronJob came from: `<source>#<document>[.items[<i>]]` and its name."""
    document: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def convert_stream(text: str, source: str = "-") -> tuple[list[Converted], list[SpecError]]:
    """Every CronJob in a YAML stream; an error in one document leaves the others converted.
    Documents that are not CronJobs are reported as errors too (left out, never silently)."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        return [], [_one_line(f"{source}: invalid YAML{where}: {problem}", source)]
    except RecursionError:
        return [], [_one_line(f"{source}: invalid YAML: nested too deeply", source)]
    except (ValueError, TypeError, OverflowError) as e:  # a constructor: e.g. 2026-02-30
        return [], [_one_line(f"{source}: invalid YAML value: {e} (quote it)", source)]
    if any(loader._too_big(d) for d in docs):
        return [], [_one_line(f"{source}: expands beyond {loader.MAX_VALUES:,} values", source)]
    done: list[Converted] = []
    errors: list[SpecError] = []
    numbered = len(docs) > 1
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"{source}#{i + 1}" if numbered else source
        for item_where, item in _items(doc, where):
            try:
                done.append(convert_cronjob(item, item_where))
            except SpecError as e:
                errors.append(e)
    return done, errors


def convert_paths(
    paths: Iterable[Path], stdin: str | None = None
) -> tuple[list[Converted], list[SpecError]]:
    """Every CronJob in `paths` (files, or folders walked for *.yaml, *.yml and *.json, as
    `cronwell apply` walks them); `-` is `stdin`'s text."""
    done: list[Converted] = []
    errors: list[SpecError] = []
    for f in loader._files(p for p in paths if str(p) != "-"):
        try:
            text = loader._read(f)
        except SpecError as e:
            errors.append(_one_line(str(e), e.source or str(f)))
            continue
        more, bad = convert_stream(text, str(f))
        done += more
        errors += bad
    if any(str(p) == "-" for p in paths):
        more, bad = convert_stream(stdin or "", "-")
        done += more
        errors += bad
    return done, errors


def _one_line(message: str, source: str) -> SpecError:
    return SpecError(" ".join(message.split()), source=source)


def _items(doc: Any, where: str) -> list[tuple[str, Any]]:
    """A List's items (kubectl's `kind: List`, or `CronJobList`), else the document."""
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
        items = doc.get("items") or []
        if not isinstance(items, list):
            return [(f"{where}.items", items)]  # reported: not a CronJob mapping
        return [(f"{where}.items[{j}]", item) for j, item in enumerate(items)]
    return [(where, doc)]


def convert_cronjob(doc: Any, where: str = "-") -> Converted:
    """One CronJob object → one ScheduledJob object (raises SpecError, one line, on what
    cannot be converted)."""
    if not isinstance(doc, dict):
        raise SpecError(
            f"{where}: expected a CronJob mapping, got {type(doc).__name__}", source=where
        )
    kind, api = doc.get("kind"), doc.get("apiVersion")
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name")
    if kind != "CronJob" or not str(api).startswith("batch/"):
        label = f"{kind or '(no kind)'} {name or ''}".strip()
        raise _one_line(
            f"{where}: {label} is not a CronJob (apiVersion batch/v1): left out of the output",
            where,
        )
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}: CronJob without metadata.name: name it", source=where)
    where = f"{where} (CronJob {name})"
    notes: list[str] = []
    out_meta = _metadata(meta, where, notes)
    spec_in = doc.get("spec")
    if not isinstance(spec_in, dict):
        raise SpecError(f"{where}: spec is missing or not a mapping", source=where)
    try:
        spec = _spec(spec_in, notes)
    except SpecError as e:
        raise SpecError(f"{where}: {e}", source=where) from None
    for key in doc:
        if key not in ("apiVersion", "kind", "metadata", "spec", "status"):
            notes.append(f"{key}: not a CronJob field: not carried")
    document = {
        "apiVersion": API_VERSION,
        "kind": "ScheduledJob",
        "metadata": out_meta,
        "spec": spec,
    }
    try:
        ScheduledJob.model_validate(document)
    except pydantic.ValidationError as e:
        # Paths as the CronJob's author knows them: spec.jobTemplate, not spec.target.job.…
        problem = loader.format_validation_error(e).replace(_TEMPLATE_PATH, "spec.jobTemplate")
        raise SpecError(" ".join(f"{where}: {problem}".splitlines()), source=where) from None
    return Converted(where, document, notes)


def _strings(value: Any, what: str) -> dict[str, str]:
    """Labels and annotations: a mapping of strings (quote numbers and booleans in YAML)."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(f'{what} must map strings to strings (quote numbers and booleans: "42")')
    return dict(value)


def _metadata(meta: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    name = str(meta["name"])
    out: dict[str, Any] = {"name": name}
    if not _DNS_LABEL.match(name):  # CronJob names are DNS subdomains: '.' is allowed there
        new = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")
        if not new or len(new) > 63:
            raise SpecError(
                f"{where}: metadata.name {name!r} cannot be made a DNS-1123 label: rename it",
                source=where,
            )
        out["name"] = new
        notes.append(f"metadata.name: renamed {name!r} to {new!r} (a DNS-1123 label: no dots)")
    for key, value in meta.items():
        if key in ("name",) or key in SERVER_METADATA:
            continue
        if key == "namespace":
            out["namespace"] = value
        elif key == "labels" and value:
            out["labels"] = _strings(value, f"{where}: metadata.labels")
        elif key == "annotations" and value:
            given = _strings(value, f"{where}: metadata.annotations")
            kept = {k: v for k, v in given.items() if k != LAST_APPLIED}
            if len(kept) < len(given):
                notes.append(
                    f"metadata.annotations: {LAST_APPLIED} left out (kubectl writes it anew)"
                )
            if kept:
                out["annotations"] = kept
        elif value not in (None, {}, []):
            notes.append(f"metadata.{key}: not carried (it belongs to the CronJob object)")
    return out


def _spec(src: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The ScheduledJob spec, key by key (unknown keys are reported, not guessed)."""
    spec: dict[str, Any] = {}
    schedule = src.get("schedule")
    zone = src.get("timeZone")
    if isinstance(schedule, str) and (m := _TZ_PREFIX.match(schedule)):
        var, prefix_zone = m.group(1), m.group(2)
        schedule = schedule[m.end() :]
        if zone is not None and zone != prefix_zone:
            raise SpecError(
                f"spec.schedule sets {var}={prefix_zone} and spec.timeZone is {zone!r}: keep "
                "one zone (CronJob refuses both too)"
            )
        zone = prefix_zone
        notes.append(f"spec.schedule: {var}={prefix_zone} moved to spec.timeZone")
    spec["schedule"] = schedule
    if zone is None:
        notes.append(
            "spec.timeZone: not set; a CronJob used kube-controller-manager's local zone, "
            "cronwell uses UTC: set spec.timeZone if the cluster's zone was not UTC"
        )
    else:
        spec["timeZone"] = zone

    policy = src.get("concurrencyPolicy", CRONJOB_DEFAULTS["concurrencyPolicy"])
    if not isinstance(policy, str) or policy not in CONCURRENCY:
        raise SpecError(
            f"spec.concurrencyPolicy {policy!r} is not a CronJob policy (Allow, Forbid, Replace)"
        )
    spec["concurrencyPolicy"] = CONCURRENCY[policy].value

    deadline = src.get("startingDeadlineSeconds")
    if deadline is not None:
        if isinstance(deadline, int) and deadline < 1:
            notes.append(
                f"spec.startingDeadlineSeconds: {deadline} raised to 1 (cronwell's minimum)"
            )
            deadline = 1
        spec["startingDeadlineSeconds"] = deadline
    if src.get("suspend") is not None:
        spec["suspend"] = src["suspend"]
    for limit in ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        spec[limit] = src.get(limit, CRONJOB_DEFAULTS[limit])

    template = src.get("jobTemplate")
    if not isinstance(template, dict):
        raise SpecError("spec.jobTemplate is missing or not a mapping")
    job_spec = template.get("spec")
    # A CronJob never retries a failed Job (the Job's backoffLimit retries its Pods).
    spec["retry"] = {"maxAttempts": 1}
    spec["timeoutSeconds"] = _timeout(job_spec, notes)
    spec["target"] = {"job": {"jobTemplate": _job_template(template, notes)}}

    for key in src:
        if key not in _KNOWN_SPEC:
            notes.append(f"spec.{key}: not a CronJob field cronwell knows: not carried")
    return spec


def _timeout(job_spec: Any, notes: list[str]) -> int:
    """cronwell bounds every attempt; a CronJob's Job only by activeDeadlineSeconds."""
    deadline = job_spec.get("activeDeadlineSeconds") if isinstance(job_spec, dict) else None
    if isinstance(deadline, int) and deadline > 0:
        return min(MAX_TIMEOUT_SECONDS, deadline + DEADLINE_MARGIN_SECONDS)
    notes.append(
        f"spec.timeoutSeconds: {MAX_TIMEOUT_SECONDS} (7 days, cronwell's longest attempt): "
        "the Job has no activeDeadlineSeconds"
    )
    return MAX_TIMEOUT_SECONDS


def _job_template(template: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    meta = template.get("metadata") or {}
    if not isinstance(meta, dict):
        raise SpecError("spec.jobTemplate.metadata must be a mapping (labels, annotations)")
    kept = {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}
    if kept:
        out["metadata"] = kept
    for key, value in meta.items():
        if key in ("labels", "annotations") or (key == "creationTimestamp" and value is None):
            continue
        notes.append(
            f"spec.jobTemplate.metadata.{key}: not carried (a Job's name, namespace and "
            "owner are cronwell's; CronJob ignores it too)"
        )
    for key in template:
        if key not in ("metadata", "spec"):
            notes.append(f"spec.jobTemplate.{key}: not a jobTemplate field: not carried")
    spec = template.get("spec")
    if isinstance(spec, dict):
        spec = dict(spec)
        if "ttlSecondsAfterFinished" in spec:
            ttl = spec.pop("ttlSecondsAfterFinished")
            notes.append(
                f"spec.jobTemplate.spec.ttlSecondsAfterFinished: {ttl} not carried: cronwell "
                "deletes finished Jobs by the history limits once their outcome is recorded "
                "(a TTL could let a later attempt run the instant again)"
            )
        pod_template = spec.get("template")
        if isinstance(pod_template, dict) and isinstance(pod_template.get("metadata"), dict):
            pod_meta = {
                k: v
                for k, v in pod_template["metadata"].items()
                if not (k == "creationTimestamp" and v is None)  # kubectl get -o yaml noise
            }
            pod_template = {**pod_template, "metadata": pod_meta}
            if not pod_meta:
                del pod_template["metadata"]
            spec["template"] = pod_template
    out["spec"] = spec
    return out


def dump(converted: list[Converted]) -> str:
    """The ScheduledJobs as one multi-document YAML stream, in input order."""
    return yaml.safe_dump_all(
        [c.document for c in converted], sort_keys=False, default_flow_style=False
    )
