"""The job page's actions in a cluster (`UiConfig.kube`, as `cronwell ui --auth kubernetes`
sets it), against a real API server with the CRD, a real PostgreSQL and the real operator:
trigger sets the cronwell.dev/trigger annotation and suspend/resume patch spec.suspend (the
CR stays the source of truth), and the operator carries each into the store; a suspension
the store holds (Manual) is lifted in the store; a job without a CR is a 404."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from html import unescape
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes.client import AuthenticationV1TokenRequest, CoreV1Api, V1TokenRequestSpec

from cronwell import jobs
from cronwell.models import ScheduledJobSpec
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell.ui.app import CSRF_FIELD, UiConfig, csrf_of, make_app
from cronwell.ui.auth import KubeAuth
from cronwell_operator.testing import OperatorProcess, sql, wait_until
from tests.e2e.test_kubectl_plugin import apply_sj, get_sj, in_store
from tests.helpers.kube import module_operator


@pytest.fixture(scope="module")
def operator(
    kube: Cluster, ns: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    yield from module_operator(kube, ns, store, tmp_path_factory, "op-ui")


@pytest.fixture
async def ui(store: str, kube_api: Any) -> AsyncIterator[tuple[TestClient, Database]]:
    async with Database(store) as db:
        app = make_app(UiConfig(db=db, allow_actions=True, kube=kube_api))
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            yield client, db
        finally:
            await client.close()


def _field(html: str, name: str) -> str:
    return unescape(html.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])


async def _open(
    kube: Cluster, ns: str, store: str, client: TestClient, name: str
) -> tuple[str, str, str]:
    """A new ScheduledJob `name` once the operator stored it: its uid, page and HTML."""
    uid = apply_sj(kube, ns, name)
    in_store(store, uid)
    page = f"/jobs/{ns}/{name}"
    return uid, page, await (await client.get(page)).text()


def _occurrences(store: str, uid: str) -> list[dict[str, Any]]:
    return sql(store, "SELECT * FROM cronwell_occurrences WHERE job_id = %s", (uid,))


async def test_trigger_sets_the_annotation_the_operator_runs_once(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess, ui: tuple[TestClient, Database]
) -> None:
    client, _ = ui
    uid, page, html = await _open(kube, ns, store, client, "ui-trig")
    assert "sets the ScheduledJob's <code>cronwell.dev/trigger</code> annotation" in html
    form = {CSRF_FIELD: _field(html, CSRF_FIELD), "trigger_id": _field(html, "trigger_id")}
    r = await client.post(f"{page}/trigger", data=form, allow_redirects=False)
    assert r.status == 303 and r.headers["Location"] == f"{page}?done=trigger-requested"
    annotations = get_sj(kube, ns, "ui-trig")["metadata"]["annotations"]
    assert annotations["cronwell.dev/trigger"] == form["trigger_id"]
    key = f"{uid}:trigger:{form['trigger_id']}"
    wait_until(
        lambda: [o for o in _occurrences(store, uid) if o["idempotency_key"] == key],
        60,
        "the operator never turned the dashboard's trigger into an occurrence",
    )
    # The same form again: the annotation keeps its value, the key its one occurrence.
    r = await client.post(f"{page}/trigger", data=form, allow_redirects=False)
    assert r.status == 303
    annotations = get_sj(kube, ns, "ui-trig")["metadata"]["annotations"]
    assert annotations["cronwell.dev/trigger"] == form["trigger_id"]
    assert [o["idempotency_key"] for o in _occurrences(store, uid)] == [key]


async def test_suspend_resume_patch_spec_and_the_store_follows(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess, ui: tuple[TestClient, Database]
) -> None:
    client, _ = ui
    uid, page, html = await _open(kube, ns, store, client, "ui-pause")
    assert "patches the ScheduledJob's <code>spec.suspend: true</code>" in html
    token = _field(html, CSRF_FIELD)

    r = await client.post(f"{page}/suspend", data={CSRF_FIELD: token}, allow_redirects=False)
    assert r.headers["Location"] == f"{page}?done=suspend-requested"
    assert get_sj(kube, ns, "ui-pause")["spec"]["suspend"] is True
    wait_until(lambda: in_store(store, uid)["suspended"], 60, "the store never suspended")
    assert in_store(store, uid)["suspended_reason"] is None
    html = unescape(await (await client.get(page)).text())
    assert "yes, by its spec (spec.suspend: true)" in html
    assert "patches the ScheduledJob's <code>spec.suspend: false</code>" in html

    r = await client.post(f"{page}/resume", data={CSRF_FIELD: token}, allow_redirects=False)
    assert r.headers["Location"] == f"{page}?done=resume-requested"
    assert get_sj(kube, ns, "ui-pause")["spec"]["suspend"] is False
    wait_until(lambda: not in_store(store, uid)["suspended"], 60, "the store never resumed")


async def test_a_suspension_the_store_holds_is_lifted_in_the_store(
    kube: Cluster, ns: str, store: str, operator: OperatorProcess, ui: tuple[TestClient, Database]
) -> None:
    client, db = ui
    uid = apply_sj(kube, ns, "ui-manual")
    in_store(store, uid)
    await jobs.set_suspended(db, namespace=ns, name="ui-manual", suspended=True, reason="Manual")
    generation = get_sj(kube, ns, "ui-manual")["metadata"]["generation"]
    page = f"/jobs/{ns}/ui-manual"
    html = unescape(await (await client.get(page)).text())
    assert "yes, in the store by cronwell suspend or this dashboard (Manual)" in html
    assert "clears the store's suspension" in html
    r = await client.post(
        f"{page}/resume", data={CSRF_FIELD: _field(html, CSRF_FIELD)}, allow_redirects=False
    )
    assert r.headers["Location"] == f"{page}?done=resumed"
    assert not in_store(store, uid)["suspended"]
    assert get_sj(kube, ns, "ui-manual")["metadata"]["generation"] == generation  # CR untouched


async def test_a_job_without_its_scheduledjob_is_404(
    ns: str, ui: tuple[TestClient, Database]
) -> None:
    client, db = ui
    spec = ScheduledJobSpec.model_validate(
        {"schedule": "0 3 * * *", "target": {"log": {"message": "x"}}}
    )
    await jobs.apply_job(db, namespace=ns, name="store-only", spec=spec)
    page = f"/jobs/{ns}/store-only"
    token = _field(await (await client.get(page)).text(), CSRF_FIELD)
    r = await client.post(f"{page}/trigger", data={CSRF_FIELD: token, "trigger_id": "t1"})
    assert r.status == 404 and "only in the store" in await r.text()
    r = await client.post(f"{page}/suspend", data={CSRF_FIELD: token})
    assert r.status == 404


def _token_of(kube: Cluster, kube_api: Any, ns: str, sa: str, verbs: str) -> str:
    """A token of a new ServiceAccount `sa` allowed `verbs` on scheduledjobs in `ns`."""
    kube.kubectl("create", "serviceaccount", sa, "-n", ns)
    kube.kubectl(
        "create", "role", sa, "-n", ns, f"--verb={verbs}", "--resource=scheduledjobs.cronwell.dev"
    )
    kube.kubectl(
        "create", "rolebinding", sa, "-n", ns, f"--role={sa}", f"--serviceaccount={ns}:{sa}"
    )
    request = AuthenticationV1TokenRequest(spec=V1TokenRequestSpec(expiration_seconds=3600))
    answer = CoreV1Api(kube_api).create_namespaced_service_account_token(sa, ns, request)
    token: str = answer.status.token
    return token


async def test_with_auth_an_action_needs_update_in_the_namespace(
    kube: Cluster, kube_api: Any, ns: str, store: str, operator: OperatorProcess
) -> None:
    """`--auth kubernetes`: a token whose user may only get/list ScheduledJobs sees the job
    but every action is refused (403, the CR untouched); one that may update acts."""
    uid = apply_sj(kube, ns, "ui-authz")
    in_store(store, uid)
    viewer = _token_of(kube, kube_api, ns, "ui-viewer", "get,list")
    actor = _token_of(kube, kube_api, ns, "ui-actor", "get,list,update")
    auth = KubeAuth(kube_api, ttl_seconds=0.001)
    page = f"/jobs/{ns}/ui-authz"
    async with Database(store) as db:
        app = make_app(UiConfig(db=db, allow_actions=True, auth=auth, kube=kube_api))
        async with TestClient(TestServer(app)) as c:
            as_viewer = {"Authorization": f"Bearer {viewer}"}
            as_actor = {"Authorization": f"Bearer {actor}"}
            html = await (await c.get(page, headers=as_viewer)).text()
            assert "ui-authz" in html and 'method="post"' not in html  # no form to offer
            html = await (await c.get(page, headers=as_actor)).text()
            form = {CSRF_FIELD: _field(html, CSRF_FIELD), "trigger_id": _field(html, "trigger_id")}
            # The viewer's own CSRF token (the actor's form is good only with its bearer).
            mine = form | {CSRF_FIELD: csrf_of(viewer)}
            for action in ("trigger", "suspend", "resume"):
                r = await c.post(f"{page}/{action}", data=mine, headers=as_viewer)
                assert r.status == 403, action
                assert "You may not update ScheduledJobs" in await r.text()
            r = await c.get(f"{page}/backfill?from=2020-01-01&until=now", headers=as_viewer)
            assert r.status == 403
            cr = get_sj(kube, ns, "ui-authz")
            assert "cronwell.dev/trigger" not in (cr["metadata"].get("annotations") or {})
            assert not cr["spec"].get("suspend")

            r = await c.post(f"{page}/trigger", data=form, headers=as_actor, allow_redirects=False)
            assert r.status == 303
            annotations = get_sj(kube, ns, "ui-authz")["metadata"]["annotations"]
            assert annotations["cronwell.dev/trigger"] == form["trigger_id"]
