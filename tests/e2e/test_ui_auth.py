"""`cronwell ui --auth kubernetes` against a real kube-apiserver: real ServiceAccounts, Roles
and RoleBindings, tokens from the TokenRequest API, the dashboard app over a real store with
jobs and dead letters in two namespaces, and the dashboard's own ServiceAccount holding only
the ClusterRole docs/security.md gives it (create tokenreviews and subjectaccessreviews).

Accounts: `viewer` may get/list scheduledjobs in A, `editor` also update them in A,
`outsider` nothing, `fleet` list them cluster-wide (the status and forecast views).

The route matrices read the app's router, so a route added later (a POST on the job page)
is covered without editing them: every route but the open ones needs a token, and every
non-GET route is refused read-only, without the CSRF token, to a user who may not update in
the namespace it targets, and to a user of another namespace, changing nothing."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application
from kubernetes import client

from cronwell.kubejson import api_client
from cronwell.models import GROUP
from cronwell.store.db import Database
from cronwell.testing.controlplane import Cluster
from cronwell.ui.app import CSRF_FIELD, OPEN_RESOURCES, UiConfig, csrf_of, make_app
from cronwell.ui.auth import RESOURCE, KubeAuth
from cronwell_operator.testing import wait_until
from tests.helpers.kube import fresh_namespace, service_account_kubeconfig, service_account_token
from tests.helpers.store import dead_letter
from tests.integration.helpers import sql

AUDIENCE = "cronwell-ui"
SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def dashboard_rules() -> Any:
    """The rules of the dashboard's own ClusterRole as docs/security.md states them (the
    YAML block of ClusterRole `cronwell-ui`): the test grants exactly what the doc says."""
    for block in SECURITY_DOC.read_text().split("```yaml\n")[1:]:
        doc = yaml.safe_load(block.split("```", 1)[0])
        if doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == "cronwell-ui":
            return doc["rules"]
    raise AssertionError(f"no ClusterRole cronwell-ui in {SECURITY_DOC}")


@dataclass(frozen=True)
class Accounts:
    """The two namespaces, the users' tokens, the dashboard's kubeconfigs (with its
    ClusterRole, and without any grant)."""

    a: str
    b: str
    tokens: dict[str, str]
    audience_token: str  # the editor's, for AUDIENCE
    dashboard: Path
    bare_dashboard: Path


def _object(kind: str, name: str, namespace: str | None, **body: Any) -> str:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    api = "v1" if kind == "ServiceAccount" else "rbac.authorization.k8s.io/v1"
    return yaml.safe_dump({"apiVersion": api, "kind": kind, "metadata": meta, **body})


def _grant(kind: str, name: str, namespace: str | None, rules: Any, sa: tuple[str, str]) -> str:
    """A Role (or ClusterRole) `name` and its binding to the ServiceAccount `sa`."""
    binding = {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "namespace": sa[0], "name": sa[1]}],
    }
    return "---\n".join(
        [
            _object(kind, name, namespace, rules=rules),
            _object(kind + "Binding", name, namespace, **binding),
        ]
    )


def _jobs_rule(*verbs: str) -> list[dict[str, list[str]]]:
    return [{"apiGroups": [GROUP], "resources": [RESOURCE], "verbs": list(verbs)}]


def _allowed(admin: Any, user: str, verb: str, namespace: str | None, group: str, res: str) -> bool:
    review = client.AuthorizationV1Api(admin).create_subject_access_review(
        client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                resource_attributes=client.V1ResourceAttributes(
                    group=group, resource=res, verb=verb, namespace=namespace
                ),
            )
        )
    )
    assert review.status is not None
    return bool(review.status.allowed)


@pytest.fixture(scope="module")
def accounts(
    kube: Cluster, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Accounts]:
    """Namespaces A and B (and one for the accounts), the ServiceAccounts, their grants
    (in effect before it yields), their tokens and the dashboard's kubeconfigs."""
    namespaces = [fresh_namespace(kube, kube_api, p) for p in ("ui-a", "ui-b", "ui-accounts")]
    a, b, home = (next(n) for n in namespaces)
    suffix = uuid.uuid4().hex[:8]
    docs = [
        _object("ServiceAccount", sa, home)
        for sa in ("viewer", "editor", "outsider", "fleet", "dashboard", "bare")
    ]
    docs += [
        _grant("Role", "sj-viewer", a, _jobs_rule("get", "list"), (home, "viewer")),
        _grant("Role", "sj-editor", a, _jobs_rule("get", "list", "update"), (home, "editor")),
        _grant("ClusterRole", f"sj-fleet-{suffix}", None, _jobs_rule("list"), (home, "fleet")),
        _grant(
            "ClusterRole",
            f"cronwell-ui-{suffix}",
            None,
            dashboard_rules(),
            (home, "dashboard"),
        ),
    ]
    kube.apply("---\n".join(docs))
    sa = f"system:serviceaccount:{home}:"
    # The authorizer sees new bindings through its informers: wait until it does, so the
    # dashboard never caches a denial that was only the bindings arriving late.
    for user, verb, namespace, group, res in [
        ("viewer", "list", a, GROUP, RESOURCE),
        ("editor", "update", a, GROUP, RESOURCE),
        ("fleet", "list", None, GROUP, RESOURCE),
        ("dashboard", "create", None, "authentication.k8s.io", "tokenreviews"),
        ("dashboard", "create", None, "authorization.k8s.io", "subjectaccessreviews"),
    ]:
        wait_until(
            partial(_allowed, kube_api, sa + user, verb, namespace, group, res),
            30,
            f"RBAC of {user} in effect",
        )
    tmp = tmp_path_factory.mktemp("ui-auth")
    tokens = {
        name: service_account_token(kube_api, home, name)
        for name in ("viewer", "editor", "outsider", "fleet")
    }
    yield Accounts(
        a,
        b,
        tokens,
        service_account_token(kube_api, home, "editor", (AUDIENCE,)),
        service_account_kubeconfig(kube, kube_api, home, "dashboard", tmp / "dashboard"),
        service_account_kubeconfig(kube, kube_api, home, "bare", tmp / "bare"),
    )
    for n in namespaces:
        next(n, None)
    kube.kubectl("delete", "clusterrole,clusterrolebinding", f"sj-fleet-{suffix}",
                 f"cronwell-ui-{suffix}", check=False)  # fmt: skip


@dataclass(frozen=True)
class Letters:
    """Dead letters (so jobs and runs too) in A and B."""

    a1: str
    a2: str
    b1: str


@pytest.fixture
async def letters(db: Database, accounts: Accounts) -> Letters:
    return Letters(
        await dead_letter(db, accounts.a, "job-a"),
        await dead_letter(db, accounts.a, "job-a2"),
        await dead_letter(db, accounts.b, "job-b"),
    )


@asynccontextmanager
async def dashboard(
    db: Database,
    kubeconfig: Path,
    *,
    allow_actions: bool = True,
    audience: str | None = None,
) -> AsyncIterator[TestClient[Any, Any]]:
    """The app as `cronwell ui --auth kubernetes` serves it, its reviews made with the
    credentials of `kubeconfig`."""
    auth = KubeAuth(api_client(str(kubeconfig)), audience=audience)
    c = TestClient(TestServer(make_app(UiConfig(db=db, allow_actions=allow_actions, auth=auth))))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()
        auth.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def routes(app: Application) -> list[tuple[str, str, bool]]:
    """(method, path template, open) of every route: a static directory as one file of it."""
    found = []
    for route in app.router.routes():
        resource = route.resource
        assert resource is not None
        info = resource.get_info()
        path = info.get("path") or info.get("formatter") or f"{info['prefix']}/app.js"
        found.append((route.method, path, resource.canonical in OPEN_RESOURCES))
    return found


def url(template: str, namespace: str, name: str) -> str:
    """A route's path for one job: {namespace} and {name} filled, any other part 'x'."""
    path = template.replace("{namespace}", namespace).replace("{name}", name)
    while "{" in path:
        start = path.index("{")
        path = path[:start] + "x" + path[path.index("}", start) + 1 :]
    return path


async def snapshot(db: Database) -> list[dict[str, Any]]:
    """What an action could change: every job's state and every occurrence's."""
    jobs = await sql(db, "SELECT namespace, name, suspended, next_run_at, deleted_at, spec "
                         "FROM cronwell_jobs ORDER BY namespace, name")  # fmt: skip
    runs = await sql(db, "SELECT idempotency_key, state, attempt, run_at "
                         "FROM cronwell_occurrences ORDER BY idempotency_key")  # fmt: skip
    return jobs + runs


async def test_every_route_but_the_open_ones_needs_a_valid_token(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    async with dashboard(db, accounts.dashboard) as c:
        table = routes(c.app)
        assert {p for _, p, is_open in table if is_open} >= {"/healthz", "/static/app.js"}
        for method, template, is_open in table:
            path = url(template, accounts.a, "job-a")
            r = await c.request(method, path, allow_redirects=False)
            if is_open:
                assert r.status in (200, 301), (method, path)
                continue
            assert r.status == 401, (method, path)
            assert r.headers["WWW-Authenticate"] == 'Bearer realm="cronwell"'
            assert "Traceback" not in await r.text()
            r = await c.request(method, path, headers=bearer("not-a-token"))
            assert r.status == 401, (method, path)
            assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
        r = await c.get("/", headers={"Authorization": f"Basic {accounts.tokens['viewer']}"})
        assert r.status == 401


async def test_every_action_is_refused_without_update_in_its_namespace(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    """Each non-GET route, with a form and path naming a job and dead letter of a namespace:
    read-only, without CSRF, to the viewer of A (no update) and to A's editor aimed at B,
    it is refused and the store is unchanged."""
    editor, viewer = bearer(accounts.tokens["editor"]), bearer(accounts.tokens["viewer"])
    before = await snapshot(db)
    async with (
        dashboard(db, accounts.dashboard, allow_actions=False) as read_only,
        dashboard(db, accounts.dashboard) as c,
    ):
        token = csrf_of(accounts.tokens["editor"])  # each user's own: refused by RBAC
        actions = [(m, p) for m, p, _ in routes(c.app) if m not in ("GET", "HEAD")]
        assert ("POST", "/dead/replay") in actions and len(actions) >= 4

        def form(namespace: str, key: str, name: str) -> dict[str, str]:
            return {CSRF_FIELD: token, "key": key, "namespace": namespace, "job": name,
                    "expect": "1"}  # fmt: skip

        in_a, in_b = form(accounts.a, letters.a1, "job-a"), form(accounts.b, letters.b1, "job-b")
        for method, template in actions:
            path_a, path_b = url(template, accounts.a, "job-a"), url(template, accounts.b, "job-b")
            where = (method, template)
            r = await read_only.request(method, path_a, data=in_a, headers=editor)
            assert r.status == 403 and "Read-only" in await r.text(), where
            r = await c.request(method, path_a, data=in_a | {CSRF_FIELD: ""}, headers=editor)
            assert r.status == 403 and "CSRF" in await r.text(), where
            r = await c.request(method, path_a, data=in_a, allow_redirects=False)
            assert r.status == 401, where
            as_viewer = in_a | {CSRF_FIELD: csrf_of(accounts.tokens["viewer"])}
            r = await c.request(method, path_a, data=as_viewer, headers=viewer,
                                allow_redirects=False)  # fmt: skip
            assert r.status == 403 and "You may not update" in await r.text(), where
            r = await c.request(method, path_b, data=in_b, headers=editor, allow_redirects=False)
            assert r.status in (403, 404), where
            assert await snapshot(db) == before, where


async def test_the_viewer_sees_namespace_a_only(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    viewer, fleet = bearer(accounts.tokens["viewer"]), bearer(accounts.tokens["fleet"])
    async with dashboard(db, accounts.dashboard) as c:
        for path in ("/", "/runs", "/runs/fragment", "/dead", f"/?namespace={accounts.b}"):
            r = await c.get(path, headers=viewer)
            assert r.status == 200, path
            html = await r.text()
            assert "job-b" not in html and letters.b1 not in html, path
            if "namespace" not in path:
                assert f"{accounts.a}/job-a" in html or ">job-a<" in html, path
        html = await (await c.get("/dead", headers=viewer)).text()
        assert letters.a1 in html and letters.a2 in html
        assert 'action="/dead/replay"' not in html  # no button the viewer may not use
        html = await (await c.get("/dead", params={"namespace": accounts.a}, headers=viewer)).text()
        assert letters.a1 in html and "/dead/confirm" not in html
        assert "system:serviceaccount:" in html and ":viewer" in html  # who is signed in
        r = await c.get(f"/jobs/{accounts.a}/job-a", headers=viewer)
        assert r.status == 200 and "Start lag" in await r.text()
        r = await c.get(f"/jobs/{accounts.b}/job-b", headers=viewer)
        assert r.status == 403 and f"namespace {accounts.b}" in await r.text()
        # Fleet-wide views add up every namespace: a cluster-wide grant only.
        for path in ("/status", "/forecast", "/forecast.json"):
            r = await c.get(path, headers=viewer)
            assert r.status == 403 and "cluster-wide" in await r.text(), path
            assert (await c.get(path, headers=fleet)).status == 200, path


async def test_the_outsider_sees_nothing(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    outsider = bearer(accounts.tokens["outsider"])
    async with dashboard(db, accounts.dashboard) as c:
        for path in ("/", "/runs", "/runs/fragment", "/dead"):
            r = await c.get(path, headers=outsider)
            assert r.status == 200, path
            html = await r.text()
            assert "job-a" not in html and "job-b" not in html, path
        assert (await c.get(f"/jobs/{accounts.a}/job-a", headers=outsider)).status == 403
        assert (await c.get("/status", headers=outsider)).status == 403


async def test_the_viewer_may_not_act_and_the_editor_may_in_a_only(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    viewer, editor = bearer(accounts.tokens["viewer"]), bearer(accounts.tokens["editor"])
    async with dashboard(db, accounts.dashboard) as c:
        token = csrf_of(accounts.tokens["editor"])
        before = await snapshot(db)
        for path in ("/dead/replay", "/dead/discard"):
            mine = {CSRF_FIELD: csrf_of(accounts.tokens["viewer"]), "key": letters.a1}
            r = await c.post(path, data=mine, headers=viewer)
            assert (
                r.status == 403
                and f"may not update ScheduledJobs in namespace {accounts.a}" in (await r.text())
            )
        confirm = {"action": "replay", "namespace": accounts.a}
        assert (await c.get("/dead/confirm", params=confirm, headers=viewer)).status == 403
        assert await snapshot(db) == before

        # The editor: one key of A replayed, one discarded; B's keys are not found.
        r = await c.post("/dead/replay", data={CSRF_FIELD: token, "key": letters.a1},
                         headers=editor, allow_redirects=False)  # fmt: skip
        assert r.status == 303 and r.headers["Location"] == "/dead?replayed=1"
        (row,) = await sql(db, "SELECT state FROM cronwell_occurrences WHERE idempotency_key = %s",
                           letters.a1)  # fmt: skip
        assert row["state"] == "pending"
        r = await c.post("/dead/discard", data={CSRF_FIELD: token, "key": letters.b1},
                         headers=editor)  # fmt: skip
        assert r.status == 404

        # Bulk: a namespace filter is required, and update in it.
        html = await (await c.get("/dead", headers=editor)).text()
        assert html.count('action="/dead/replay"') == 1  # a2; b1 is not shown
        assert "Filter by namespace to replay or discard" in html and "/dead/confirm" not in html
        html = await (await c.get("/dead", params={"namespace": accounts.a}, headers=editor)).text()
        assert "/dead/confirm" in html
        r = await c.get("/dead/confirm", params={"action": "discard"}, headers=editor)
        assert r.status == 400 and "filter by namespace" in await r.text()
        r = await c.get("/dead/confirm", params=confirm | {"action": "discard"}, headers=editor)
        assert r.status == 200 and 'name="expect" value="1"' in await r.text()
        r = await c.post("/dead/discard-all", data={CSRF_FIELD: token, "expect": "1"},
                         headers=editor)  # fmt: skip
        assert r.status == 400
        bulk = {CSRF_FIELD: token, "expect": "1"}
        r = await c.post("/dead/discard-all", data=bulk | {"namespace": accounts.b},
                         headers=editor, allow_redirects=False)  # fmt: skip
        assert r.status == 403
        r = await c.post("/dead/discard-all", data=bulk | {"namespace": accounts.a},
                         headers=editor, allow_redirects=False)  # fmt: skip
        assert r.status == 303, await r.text()
        keys = await sql(db, "SELECT idempotency_key, state FROM cronwell_occurrences "
                             "ORDER BY idempotency_key")  # fmt: skip
        assert {(k["idempotency_key"], k["state"]) for k in keys} == {
            (letters.a1, "pending"),
            (letters.b1, "dead"),
        }


async def test_a_form_from_one_replica_posts_to_another_and_only_for_its_user(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    """Two dashboard processes (replicas behind one Service): the editor's form rendered by
    one is accepted by the other (a random token per process refused it), and the token of
    the editor's form is refused with the viewer's bearer token: a form is good only for
    the user it was rendered for."""
    editor, viewer = bearer(accounts.tokens["editor"]), bearer(accounts.tokens["viewer"])
    async with dashboard(db, accounts.dashboard) as one, dashboard(db, accounts.dashboard) as two:
        page = await (
            await one.get("/dead", params={"namespace": accounts.a}, headers=editor)
        ).text()
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token, "no form on the editor's dead-letter page"
        form = {CSRF_FIELD: token.group(1), "key": letters.a1}
        r = await two.post("/dead/replay", data=form, headers=viewer, allow_redirects=False)
        assert r.status == 403 and "CSRF" in await r.text()
        r = await two.post("/dead/replay", data=form, headers=editor, allow_redirects=False)
        assert r.status == 303, await r.text()


async def test_a_token_for_another_audience_is_refused(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    """With --auth-audience, only tokens made for the dashboard; without, only the API
    server's own."""
    for_api, for_ui = bearer(accounts.tokens["editor"]), bearer(accounts.audience_token)
    async with dashboard(db, accounts.dashboard, audience=AUDIENCE) as c:
        assert (await c.get("/", headers=for_api)).status == 401
        assert (await c.get("/", headers=for_ui)).status == 200
    async with dashboard(db, accounts.dashboard) as c:
        assert (await c.get("/", headers=for_api)).status == 200
        assert (await c.get("/", headers=for_ui)).status == 401


async def test_without_its_cluster_role_the_dashboard_answers_503(
    db: Database, accounts: Accounts, letters: Letters
) -> None:
    """The dashboard's ServiceAccount needs the documented ClusterRole: without it no review
    can be made, and a request is a 503 page, not a 401 blamed on the user."""
    async with dashboard(db, accounts.bare_dashboard) as c:
        r = await c.get("/", headers=bearer(accounts.tokens["viewer"]))
        assert r.status == 503
        text = await r.text()
        assert "cannot check access now" in text and "Traceback" not in text
        assert (await c.get("/healthz")).status == 200
