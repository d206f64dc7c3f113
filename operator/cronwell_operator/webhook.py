"""The validating admission webhook: what the CRD schema and CEL cannot check.

The API server checks types, enums, bounds, lengths and the cross-field rules (CEL) itself.
This webhook adds the rules that need cronwell's code: the cron expression parses, the
time zone exists, the handler payload is not too large, and every pydantic validator of
`cronwell.models` holds. Its message names the field and the fix, as `cronwell apply` does
(it is the same `format_validation_error`).

Served by kopf's WebhookServer (HTTPS). For local runs a self-signed certificate is made
with the `openssl` CLI; in a cluster, mount one (cert-manager) into `webhook_cert_dir`.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kopf
import pydantic

from cronwell.loader import format_validation_error
from cronwell.models import ScheduledJob
from cronwell_operator.settings import OperatorSettings

_HINTS = {
    "spec.schedule": "use 5 fields (minute hour day-of-month month day-of-week), 6 with "
    "seconds first, or a macro such as @hourly; e.g. '*/5 * * * *'",
}


def problems(
    body: dict[str, Any], old: dict[str, Any] | None, *, settings: OperatorSettings
) -> str | None:
    """Why `body` must be refused, or None. `old` is the object before an UPDATE."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None  # never block a deletion (finalizer removal) on a spec stored earlier
    if old is not None and old.get("spec") == body.get("spec"):
        return None  # metadata-only change (labels, the trigger annotation, finalizers)
    name = meta.get("name", "?")
    try:
        job = ScheduledJob.model_validate(body)
    except pydantic.ValidationError as e:
        lines = []
        for line in format_validation_error(e).split("; "):
            field = line.split(":", 1)[0]
            hint = _HINTS.get(field)
            lines.append(f"{line} ({hint})" if hint and hint not in line else line)
        return f"ScheduledJob {name}: " + "; ".join(lines)
    handler = job.spec.target.handler
    if handler is not None:
        size = len(json.dumps(handler.payload, separators=(",", ":")).encode())
        limit = settings.webhook_payload_max_bytes
        if size > limit:
            return (
                f"ScheduledJob {name}: spec.target.handler.payload: {size} bytes is over the "
                f"{limit}-byte limit: keep large data elsewhere (a ConfigMap, object storage) "
                "and pass a reference to it"
            )
    return None


def self_signed_cert(directory: Path, host: str) -> tuple[Path, Path]:
    """tls.crt + tls.key for `host` (an IP or a DNS name), made once; for local runs."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "tls.crt", directory / "tls.key"
    if crt.is_file() and key.is_file():
        return crt, key
    san = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    cmd = [
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "365",
        "-subj", "/CN=cronwell-operator-webhook",
        "-addext", f"subjectAltName={san},DNS:localhost",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
        "-addext", "extendedKeyUsage=serverAuth",
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        raise RuntimeError(
            f"could not make a self-signed webhook certificate with openssl: {e} "
            f"{err.decode(errors='replace')}"
        ) from e
    key.chmod(0o600)
    return crt, key


def server(cfg: OperatorSettings) -> kopf.WebhookServer:
    """kopf's HTTPS webhook server for these settings."""
    directory = (
        Path(cfg.webhook_cert_dir)
        if cfg.webhook_cert_dir is not None
        else Path(tempfile.gettempdir()) / f"cronwell-webhook-{cfg.webhook_port}"
    )
    certfile, pkeyfile = self_signed_cert(directory, cfg.webhook_host or "127.0.0.1")
    ca = directory / "ca.crt"
    cafile = ca if ca.is_file() else None
    return kopf.WebhookServer(
        addr=cfg.webhook_addr,
        port=cfg.webhook_port,
        host=cfg.webhook_host,
        certfile=certfile,
        pkeyfile=pkeyfile,
        cafile=cafile,
    )
