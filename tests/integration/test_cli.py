"""The CLI as users run it: real processes, real PostgreSQL, clear errors."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO


def cli(
    *args: str, url: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    pre = ["--database-url", url] if url else []
    try:
        return subprocess.run(
            [sys.executable, "-m", "cronwell", *pre, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        # The end of its output says where it hung (pytest's repr would elide it).
        def tail(b: bytes | str | None) -> str:
            text = b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
            return "\n".join(text.splitlines()[-40:])

        pytest.fail(
            f"cronwell {' '.join(args)} still running after {timeout:g}s\n"
            f"--- stdout (end)\n{tail(e.stdout)}\n--- stderr (end)\n{tail(e.stderr)}"
        )


def test_apply_reports_bad_files_and_applies_nothing(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: good}\n"
        "spec: {schedule: '*/5 * * * *', target: {log: {message: hi}}}\n"
    )
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: bad}\n"
        "spec: {schedule: '*/5 * * *', timeZone: Mars/Base, target: {log: {}}}\n"
    )
    # One file, two documents, the second bad: the first is not applied either.
    (tmp_path / "multi.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: first}\n"
        "spec: {schedule: '@hourly', target: {log: {}}}\n---\n"
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: legacy}\nspec: {}\n"
    )
    r = cli("apply", "-f", str(tmp_path), url=db_url)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert (
        f"{tmp_path / 'bad.yaml'} (ScheduledJob bad): spec.schedule: cron '*/5 * * *' "
        "has 4 fields: use 5" in r.stderr
    )
    assert "spec.timeZone: unknown time zone 'Mars/Base'" in r.stderr
    assert f"{tmp_path / 'multi.yaml'}#2: kind CronJob is not a ScheduledJob" in r.stderr
    assert "2 invalid document(s); nothing applied: fix them and apply again" in r.stderr
    assert "created" not in r.stdout
    listed = cli("jobs", url=db_url)
    assert "default/good" not in listed.stdout and "default/first" not in listed.stdout
    (tmp_path / "bad.yaml").unlink()
    (tmp_path / "multi.yaml").unlink()
    again = cli("apply", "-f", str(tmp_path), url=db_url)
    assert again.returncode == 0 and "good created" in again.stdout
    listed = cli("jobs", url=db_url)
    assert "default/good" in listed.stdout and "*/5 * * * *" in listed.stdout


def test_apply_refuses_a_cron_that_never_fires_in_one_line(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "feb30.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: feb30}\n"
        "spec: {schedule: '0 0 30 2 *', target: {log: {}}}\n"
    )
    r = cli("apply", "-f", str(tmp_path), url=db_url)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "croniter" not in r.stderr.lower()
    assert (
        f"{tmp_path / 'feb30.yaml'} (ScheduledJob feb30): spec.schedule: cron '0 0 30 2 *' "
        "never fires: February has no 30th: use a day every chosen month has" in r.stderr
    )
    assert "default/feb30" not in cli("jobs", url=db_url).stdout


def test_standalone_refuses_a_job_target(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "report.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: report}\n"
        "spec: {schedule: '@hourly', target: {job: {jobTemplate: {spec: {template: {spec: "
        "{restartPolicy: Never, containers: [{name: main, image: report:1}]}}}}}}}\n"
    )
    r = cli("apply", "-f", str(tmp_path), url=db_url)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (
        f"{tmp_path / 'report.yaml'} (ScheduledJob report): spec.target.job runs a Kubernetes "
        "Job, and standalone mode has no cluster: kubectl apply it to a cluster running "
        "cronwell's operator" in r.stderr
    )
    assert "default/report" not in cli("jobs", url=db_url).stdout


def test_unreachable_database_is_one_clear_line() -> None:
    r = cli("jobs", url="postgresql://nobody:secret@127.0.0.1:1/nothing")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "cannot connect to PostgreSQL at postgresql://nobody:***@127.0.0.1:1/nothing" in r.stderr
    assert "secret" not in r.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("scheduler", "--retention", "0"), "invalid setting retention_seconds: "),
        (("worker", "--concurrency", "0"), "invalid setting concurrency: "),
    ],
)
def test_a_bad_setting_is_one_clear_line(args: tuple[str, ...], line: str) -> None:
    # Checked before the database is opened (this URL would fail differently).
    r = cli(*args, url="postgresql://nobody@127.0.0.1:1/nothing")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    [msg] = r.stderr.strip().splitlines()
    assert line in msg and "should be greater than" in msg


def test_unknown_job_is_a_clear_error(db_url: str) -> None:
    r = cli("trigger", "nope", url=db_url)
    assert r.returncode == 1 and "no ScheduledJob default/nope" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_dev_runs_examples_and_runs_lists_them(db_url: str) -> None:
    """`cronwell dev` applies examples/jobs, executes occurrences and prints a summary."""
    r = cli("dev", "--jobs", "examples/jobs", "--duration", "20", url=db_url, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "default/hello: created" in r.stdout
    lines = [
        ln for ln in r.stdout.splitlines() if ln.startswith("default/hello") and "succeeded" in ln
    ]
    assert len(lines) >= 1, r.stdout  # every 15 s: at least one in 20 s
    # outcomes in name order; an occurrence claimed ahead and not yet due at the stop is
    # "released" (handed back, not an attempt), so succeeded need not come first
    assert re.search(r"^summary: (\w+=\d+, )*succeeded=[1-9]", r.stdout, re.M), r.stdout
    runs = cli("runs", "--job", "hello", "--json", url=db_url)
    rows = [json.loads(x) for x in runs.stdout.splitlines()]
    done = [x for x in rows if x["state"] == "succeeded"]
    assert done and all(x["attempt"] == 1 and x["idempotency_key"].endswith("Z") for x in done)
    status = cli("status", url=db_url)
    assert "partitions (16)" in status.stdout and "succeeded=" in status.stdout
    # What a failover can lose (the test server streams to no standby), and the fences'.
    assert "commits: asynchronous (standbys: none visible to this role)" in status.stdout
    assert "fences: generation 0, timeline 1" in status.stdout
    bumped = cli("db", "new-generation", url=db_url)
    assert bumped.stdout.strip() == "fence generation is now 1"
    assert "fences: generation 1, timeline 1" in cli("status", url=db_url).stdout


def test_version_and_help() -> None:
    assert cli("version").stdout.startswith("cronwell ")
    out = cli("--help").stdout
    for cmd in ("apply", "delete", "dev", "migrate", "runs", "scheduler", "trigger", "worker"):
        assert cmd in out


def test_database_url_from_a_file(db_url: str, tmp_path: Path) -> None:
    """In Kubernetes the URL comes from a mounted Secret (CRONWELL_DATABASE_URL_FILE)."""
    f = tmp_path / "url"
    f.write_text(db_url + "\n")
    env = {k: v for k, v in os.environ.items() if k != "CRONWELL_DATABASE_URL"}
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    ok = run(
        [sys.executable, "-m", "cronwell", "jobs"], env=env | {"CRONWELL_DATABASE_URL_FILE": str(f)}
    )
    assert ok.returncode == 0 and "NAME" in ok.stdout, ok.stderr
    both = run(
        [sys.executable, "-m", "cronwell", "jobs"],
        env=env | {"CRONWELL_DATABASE_URL_FILE": str(f), "CRONWELL_DATABASE_URL": db_url},
    )
    assert both.returncode == 1 and "not both" in both.stderr
    (tmp_path / "empty").write_text("  \n")
    empty = run(
        [sys.executable, "-m", "cronwell", "jobs"],
        env=env | {"CRONWELL_DATABASE_URL_FILE": str(tmp_path / "empty")},
    )
    assert empty.returncode == 1 and "is empty" in empty.stderr
    assert "Traceback" not in both.stderr + empty.stderr


def test_read_url_from_a_file_and_its_errors(db_url: str, tmp_path: Path) -> None:
    """The read replica's URL comes the same ways as the primary's, with the same clear
    lines; a server that is not in recovery (here the primary itself) serves reads."""
    f = tmp_path / "read-url"
    f.write_text(db_url + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWELL_DATABASE_READ")}
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    base = [sys.executable, "-m", "cronwell", "--database-url", db_url]
    ok = run([*base, "jobs"], env=env | {"CRONWELL_DATABASE_READ_URL_FILE": str(f)})
    assert ok.returncode == 0 and "NAME" in ok.stdout, ok.stderr
    assert "reads moved" not in ok.stderr
    flag = run([*base, "--database-read-url", db_url, "runs"], env=env)
    assert flag.returncode == 0, flag.stderr
    both = run(
        [*base, "jobs"],
        env=env | {"CRONWELL_DATABASE_READ_URL_FILE": str(f), "CRONWELL_DATABASE_READ_URL": db_url},
    )
    assert both.returncode == 1 and "not both" in both.stderr
    missing = run(
        [*base, "runs"], env=env | {"CRONWELL_DATABASE_READ_URL_FILE": str(tmp_path / "nope")}
    )
    assert missing.returncode == 1
    assert f"cannot read CRONWELL_DATABASE_READ_URL_FILE {tmp_path / 'nope'}" in missing.stderr
    # A replica that is down: the primary answers, and one line says so (not the pool's).
    down = "postgresql://ro:secret@127.0.0.1:1/x"
    dead = run([*base, "--database-read-url", down, "runs"], env=env)
    assert dead.returncode == 0, dead.stderr
    [line] = [ln for ln in dead.stderr.splitlines() if "warning" in ln]
    assert (
        "reads moved to the primary: the read replica at postgresql://ro:***@127.0.0.1:1/x "
        "is unreachable" in line
    )
    for lag in ("0", "301"):
        bad = run([*base, "status"], env=env | {"CRONWELL_DATABASE_READ_MAX_LAG_SECONDS": lag})
        assert bad.returncode == 1 and "database_read_max_lag_seconds" in bad.stderr
        assert "Traceback" not in bad.stderr
    assert "Traceback" not in both.stderr + missing.stderr + bad.stderr + dead.stderr


def test_pause_and_resume_selectors(db_url: str, tmp_path: Path) -> None:
    """`pause` is the incident button: one job, a namespace (--all) or everything (-A), the
    mass forms behind --yes; `resume --all` undoes only what `pause` did."""
    docs = [("a", "ops", False), ("b", "ops", False), ("c", "ops", True), ("d", "web", False)]
    (tmp_path / "jobs.yaml").write_text(
        "---\n".join(
            "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\n"
            f"metadata: {{name: {n}, namespace: {ns}}}\n"
            f"spec: {{schedule: '@hourly', suspend: {str(s).lower()}, "
            "target: {log: {message: hi}}}\n"
            for n, ns, s in docs
        )
    )
    assert cli("apply", "-f", str(tmp_path), url=db_url).returncode == 0

    def suspended() -> dict[str, str]:
        out = cli("jobs", url=db_url).stdout.splitlines()[1:]
        return {ln.split()[0]: ln.split()[3] for ln in out}

    unconfirmed = cli("pause", "--all", "-n", "ops", url=db_url)
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    assert "exactly one of NAME" in cli("pause", "a", "--all", url=db_url).stderr
    assert "--all needs -n" in cli("pause", "--all", "--yes", url=db_url).stderr
    assert suspended() == {"ops/a": "no", "ops/b": "no", "ops/c": "yes", "web/d": "no"}

    one = cli("pause", "d", "-n", "web", url=db_url)
    assert one.returncode == 0 and "web/d paused" in one.stdout, one.stderr
    ops = cli("pause", "--all", "-n", "ops", "--yes", url=db_url)
    assert ops.returncode == 0, ops.stderr
    assert "ops/a paused" in ops.stdout and "ops/b paused" in ops.stdout
    assert "ops/c already suspended (spec.suspend)" in ops.stdout
    assert suspended() == {"ops/a": "Paused", "ops/b": "Paused", "ops/c": "yes", "web/d": "Paused"}

    back = cli("resume", "--all", "-n", "ops", "--yes", url=db_url)
    assert back.returncode == 0 and "2 job(s) resumed" in back.stdout, back.stderr
    assert "ops/c stays suspended (spec.suspend)" in back.stdout
    assert suspended() == {"ops/a": "no", "ops/b": "no", "ops/c": "yes", "web/d": "Paused"}
    assert "1 job(s) resumed" in cli("resume", "-A", "--yes", url=db_url).stdout
    assert cli("resume", "c", "-n", "ops", url=db_url).returncode == 0  # one job: any reason
    assert set(suspended().values()) == {"no"}
    missing = cli("pause", "nope", url=db_url)
    assert missing.returncode == 1 and "no ScheduledJob default/nope" in missing.stderr
    assert "Traceback" not in missing.stderr + unconfirmed.stderr


def test_partition_count_lives_in_the_store(empty_db_url: str, tmp_path: Path) -> None:
    """`migrate --partitions` sets P of a new store; a migrate (or scheduler) configured
    with another P refuses in one line; `partitions set` changes it and moves the jobs."""
    made = cli("migrate", "--partitions", "4", url=empty_db_url)
    assert made.returncode == 0 and "(4 partitions)" in made.stdout, made.stderr
    (tmp_path / "j.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: j}\n"
        "spec: {schedule: '*/5 * * * *', target: {log: {}}}\n"
    )
    assert cli("apply", "-f", str(tmp_path), url=empty_db_url).returncode == 0
    other = cli("migrate", "--partitions", "8", url=empty_db_url)
    assert other.returncode == 1 and "Traceback" not in other.stderr
    assert "configured with 8 partitions but the store uses 4" in other.stderr
    assert "cronwell partitions set 8" in other.stderr
    changed = cli("partitions", "set", "8", url=empty_db_url)
    assert changed.returncode == 0 and "partitions 4 -> 8" in changed.stdout, changed.stderr
    assert cli("partitions", "get", url=empty_db_url).stdout.strip() == "8"
    status = cli("status", url=empty_db_url)
    assert "partitions (8)" in status.stdout
    bad = cli("partitions", "set", "0", url=empty_db_url)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


FIXTURES = REPO / "tests" / "fixtures" / "cronjobs"


def test_convert_prints_scheduledjobs_that_apply_and_warns_on_stderr(
    tmp_path: Path,
) -> None:
    import yaml

    r = cli("convert", "-f", str(FIXTURES / "hello.yaml"), "-f",
            str(FIXTURES / "kubectl-get-all-namespaces.yaml"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["hello", "report", "cleanup-tmp"]
    assert all(d["kind"] == "ScheduledJob" and "job" in d["spec"]["target"] for d in docs)
    assert "warning:" not in r.stdout and "converted 3 CronJob(s)" in r.stderr
    assert (
        "kubectl-get-all-namespaces.yaml.items[1] (CronJob cleanup.tmp): metadata.name: "
        "renamed 'cleanup.tmp' to 'cleanup-tmp'" in r.stderr
    )
    # What it prints is what the loader reads (stdin works as a source too).
    (tmp_path / "out.yaml").write_text(r.stdout)
    again = subprocess.run(
        [sys.executable, "-m", "cronwell", "convert", "-f", "-"],
        input=(FIXTURES / "hello.yaml").read_text(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and yaml.safe_load(again.stdout) == docs[0]
    from cronwell.loader import load

    loaded, errors = load([tmp_path / "out.yaml"])
    assert errors == [] and len(loaded) == 3


def test_convert_prints_nothing_when_a_document_is_not_a_cronjob(tmp_path: Path) -> None:
    r = cli("convert", "-f", str(FIXTURES))
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert "stream.yaml#3: ConfigMap settings is not a CronJob" in r.stderr
    assert "1 document(s) not converted; nothing printed" in r.stderr
    missing = cli("convert", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and f"{tmp_path / 'nope.yaml'}: no such file" in missing.stderr


@pytest.mark.slow
def test_dev_first_minutes_dashboard_first_one_line_per_run(tmp_path: Path) -> None:
    """What `make run` shows a newcomer: the dashboard's URL first (another port when the
    default is taken), no warning on either stream (a fresh embedded PostgreSQL with no
    XDG_RUNTIME_DIR, as under root or in CI, is what used to warn), and each run once
    (the job's own log line no longer repeats the run's line)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "tick.yaml").write_text(
        "apiVersion: cronwell.dev/v1alpha1\nkind: ScheduledJob\nmetadata: {name: tick}\n"
        "spec: {schedule: '*/2 * * * * *', target: {log: {message: tick-effect}}}\n"
    )
    data = tmp_path / "pg"
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "PYTHONWARNINGS")}
    env = {k: v for k, v in env.items() if not k.startswith("CRONWELL_")}
    env["PYTHONWARNINGS"] = "default"  # every warning shown, as a newcomer's Python would
    base = [sys.executable, "-m", "cronwell", "--data-dir", str(data)]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        proc = subprocess.Popen(
            [*base, "dev", "--jobs", str(jobs), "--duration", "10", "--ui-port", str(taken)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            m = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:(\d+)/)\n", first)
            assert m, first
            assert int(m.group(2)) != taken
            for _ in range(300):
                try:
                    with urllib.request.urlopen(m.group(1) + "status", timeout=5) as r:
                        assert r.status == 200
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                pytest.fail("the dashboard did not answer")
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            subprocess.run([*base, "db", "stop"], capture_output=True, env=env, check=False)
    assert proc.returncode == 0, err
    assert "Warning" not in first + out and "Warning" not in err, (out, err)
    runs = [ln for ln in out.splitlines() if ln.startswith("default/tick ") and " lag " in ln]
    assert len(runs) >= 2, out
    instants = [ln.split("scheduled ", 1)[1][:19] for ln in runs]
    assert len(instants) == len(set(instants)), out
    assert "tick-effect" not in out + err
