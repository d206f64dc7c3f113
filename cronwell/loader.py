"""Reads ScheduledJob YAML from files and folders (the standalone `kubectl apply -f`).
A bad file is reported with its path, the field and the fix; the other files still load."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from cronwell.errors import SpecError
from cronwell.models import API_VERSION, GROUP, ScheduledJob

_SUFFIXES = {".yaml", ".yml"}


@dataclass(frozen=True)
class Loaded:
    source: str
    job: ScheduledJob


def format_validation_error(e: pydantic.ValidationError) -> str:
    """One line per problem: `spec.schedule: <what is wrong and how to fix it>`."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"]
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, SpecError):
            msg = str(ctx_err)
        elif msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field {loc.rsplit('.', 1)[-1]!r} (check spelling and nesting)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{loc or '(document)'}: {msg}")
    return _one_line("; ".join(lines))  # a key may hold a line break: answers stay one line


CONVERT_HINT = (
    "convert it with `cronwell convert -f FILE` (its container becomes a job target, run as "
    "a Kubernetes Job in a cluster), or rewrite its work as an http, handler or log target: "
    "see docs/migrating-from-cronjob.md"
)
MAX_FILE_BYTES = 16 * 1024 * 1024
"""Largest file read (a bulk apply of thousands of jobs is a few MiB)."""
MAX_VALUES = 1_000_000
"""Most values one document may expand to (YAML aliases can make a small file huge)."""


def _one_line(message: str) -> str:
    return " ".join(message.splitlines())


def _too_big(doc: Any) -> bool:
    """Whether `doc` expands (aliases counted each time they are used) beyond MAX_VALUES."""
    budget = MAX_VALUES
    stack = [doc]
    while stack:
        x = stack.pop()
        budget -= 1
        if budget < 0:
            return True
        if isinstance(x, dict):
            stack += x.keys()
            stack += x.values()
        elif isinstance(x, list):
            stack += x
    return False


def _kind_error(doc: dict[Any, Any], source: str) -> SpecError | None:
    """Documents that are not a ScheduledJob of a version cronwell reads: a one-line error
    for the ones a user surely meant to apply (a CronJob, another cronwell kind or
    version); None for ScheduledJobs and other projects' kinds (skipped, so a GitOps
    folder with a Namespace or a kustomization still applies)."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if kind in (None, "ScheduledJob"):
        if api not in (None, API_VERSION):
            return SpecError(
                f"{source}: apiVersion {api!r} of kind ScheduledJob is not served: "
                f"use apiVersion: {API_VERSION}",
                source=source,
            )
        return None
    if kind == "CronJob" or (isinstance(api, str) and api.startswith("batch/")):
        return SpecError(
            f"{source}: kind {kind} is not a ScheduledJob: {CONVERT_HINT}", source=source
        )
    if isinstance(api, str) and api.split("/", 1)[0] == GROUP and kind != "WorkerPool":
        return SpecError(
            f"{source}: kind {kind!r} is not a cronwell.dev kind: use kind: ScheduledJob "
            "(or WorkerPool, applied with kubectl)",
            source=source,
        )
    return None


def parse_document(doc: Any, source: str) -> ScheduledJob:
    if not isinstance(doc, dict):
        raise SpecError(
            f"{source}: expected a mapping (a Kubernetes object with apiVersion, kind, "
            f"metadata and spec), got {type(doc).__name__}",
            source=source,
        )
    try:
        return ScheduledJob.model_validate(doc)
    except pydantic.ValidationError as e:
        meta = doc.get("metadata")
        name = meta.get("name", "?") if isinstance(meta, dict) else "?"
        raise SpecError(
            _one_line(f"{source} (ScheduledJob {name}): {format_validation_error(e)}"),
            source=source,
        ) from None
    except RecursionError:
        raise SpecError(
            f"{source}: nested too deeply to be a ScheduledJob: flatten the document",
            source=source,
        ) from None


def _files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix in _SUFFIXES and f.is_file())
        else:
            out.append(p)
    return out


def _read(f: Path) -> str:
    try:
        size = f.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(
                f"{f}: {size:,} bytes is over the {MAX_FILE_BYTES:,}-byte limit: split it "
                "into several files",
                source=str(f),
            )
        data = f.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{f}: no such file", source=str(f)) from None
    except OSError as e:
        raise SpecError(f"{f}: cannot read it: {e.strerror}", source=str(f)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{f}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): save it "
            "as UTF-8 YAML, or check that this is the file you meant",
            source=str(f),
        ) from None


def _documents(f: Path) -> list[Any]:
    text = _read(f)
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(
            _one_line(f"{f}: invalid YAML{where}: {problem} (fix the YAML syntax there)"),
            source=str(f),
        ) from None
    except RecursionError:
        raise SpecError(
            f"{f}: invalid YAML: nested too deeply (flatten the document)", source=str(f)
        ) from None
    except (ValueError, TypeError, OverflowError) as e:  # a constructor: e.g. 2026-02-30
        raise SpecError(
            _one_line(f"{f}: invalid YAML value: {e} (quote it if it is meant as a string)"),
            source=str(f),
        ) from None


def load(paths: Iterable[Path]) -> tuple[list[Loaded], list[SpecError]]:
    """Every ScheduledJob in `paths` (files or folders). Other projects' kinds are skipped
    (a GitOps folder holds Namespaces too); a CronJob, another cronwell kind or version,
    a file that is not UTF-8 YAML are errors. Never raises on bad input."""
    loaded: list[Loaded] = []
    errors: list[SpecError] = []
    for f in _files(paths):
        try:
            docs = _documents(f)
        except SpecError as e:
            errors.append(SpecError(_one_line(str(e)), source=e.source))
            continue
        for i, doc in enumerate(docs):
            if doc is None:
                continue
            source = f"{f}" if len(docs) == 1 else f"{f}#{i + 1}"
            try:
                if _too_big(doc):
                    raise SpecError(
                        f"{source}: the document expands to over {MAX_VALUES:,} values "
                        "(YAML aliases?): write it out plainly, or split it",
                        source=source,
                    )
                if isinstance(doc, dict):
                    kind_error = _kind_error(doc, source)
                    if kind_error is not None:
                        raise kind_error
                    if doc.get("kind") not in (None, "ScheduledJob"):
                        continue
                loaded.append(Loaded(source, parse_document(doc, source)))
            except SpecError as e:
                errors.append(SpecError(_one_line(str(e)), source=e.source))
    return loaded, errors
