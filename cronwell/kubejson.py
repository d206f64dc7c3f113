"""Plain JSON requests to the Kubernetes API through a `kubernetes` ApiClient (its
connection, auth and TLS), for the worker's Jobs, the webhook's dry-run of them and the
dashboard's CR patches; and the client itself (`api_client`), shared by the operator and
the dashboard.

Not the client's typed methods: those validate a body against the client's own copy of
the object's schema before sending it (pydantic `validate_call`), which would refuse or
drop a field that the cluster's Kubernetes knows and the client's does not. Sync: callers
run it in a thread."""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In a Pod: its ServiceAccount; elsewhere: KUBECONFIG (or ~/.kube/config)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig
    )
    return api


REQUEST_TIMEOUT_SECONDS = 10.0
"""What every call through `request` waits for the API server (connect and read): a silent
API server is then an error (a 503 page, a retryable target error, a webhook refusal), not a
request, a thread and whatever lock its caller holds, held forever."""


def request(
    api: client.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: dict[str, Any] | None = None,
    content_type: str = "application/json",
    timeout: float | None = None,
) -> dict[str, Any]:
    """The decoded answer; ApiException (with the body, for `api_message`) on non-2xx.
    `content_type`: of the body (a PATCH says which kind, e.g. merge-patch+json).
    `timeout`: seconds to connect and to read (urllib3's error past it); None:
    REQUEST_TIMEOUT_SECONDS (read at the call)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    params = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    bound = REQUEST_TIMEOUT_SECONDS if timeout is None else timeout
    response = api.call_api(*params, _request_timeout=bound)
    response.read()  # type: ignore[no-untyped-call]
    text = response.data.decode() if response.data else ""
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=response.reason, body=text)
    data: dict[str, Any] = json.loads(text) if text else {}
    return data


def api_message(e: ApiException) -> str:
    """The API server's own message in an error answer ("" when it has none)."""
    body = e.body.decode() if isinstance(e.body, bytes) else str(e.body or "")
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return ""


def jobs_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"{path}/{name}" if name else path
