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
from cronwell.models import ScheduledJob

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
    return "; ".join(lines)


def parse_document(doc: Any, source: str) -> ScheduledJob:
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a mapping (a Kubernetes object)", source=source)
    try:
        return ScheduledJob.model_validate(doc)
    except pydantic.ValidationError as e:
        name = (
            (doc.get("metadata") or {}).get("name", "?")
            if isinstance(doc.get("metadata"), dict)
            else "?"
        )
        raise SpecError(
            f"{source} (ScheduledJob {name}): {format_validation_error(e)}", source=source
        ) from None


def _files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix in _SUFFIXES and f.is_file())
        else:
            out.append(p)
    return out


def load(paths: Iterable[Path]) -> tuple[list[Loaded], list[SpecError]]:
    """Every ScheduledJob in `paths` (files or folders); other kinds are ignored."""
    loaded: list[Loaded] = []
    errors: list[SpecError] = []
    for f in _files(paths):
        try:
            docs = list(yaml.safe_load_all(f.read_text()))
        except FileNotFoundError:
            errors.append(SpecError(f"{f}: no such file", source=str(f)))
            continue
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e)
            errors.append(SpecError(f"{f}: invalid YAML{where}: {problem}", source=str(f)))
            continue
        for i, doc in enumerate(docs):
            if doc is None:
                continue
            source = f"{f}" if len(docs) == 1 else f"{f}#{i + 1}"
            if isinstance(doc, dict) and doc.get("kind") not in (None, "ScheduledJob"):
                continue
            try:
                loaded.append(Loaded(source, parse_document(doc, source)))
            except SpecError as e:
                errors.append(e)
    return loaded, errors
