"""A real Kubernetes control plane (etcd + kube-apiserver, no kubelet) for e2e tests.

Why: fakes of the API server miss what breaks operators in production (RBAC, the status
subresource, watches, server-side validation and defaulting), and kind needs Docker. So,
like kubebuilder's envtest, this runs the real binaries on loopback ports with throwaway
state. The binaries come from ``KUBEBUILDER_ASSETS`` or from ``hack/envtest.sh``'s cache.

There is no controller-manager: namespaces stay Terminating once deleted, nothing is
garbage-collected, the aggregated ClusterRoles (admin, edit, view) have no rules, and no
default ServiceAccount appears in a namespace (hence the ServiceAccount admission plugin
is off, so Pods and Deployments can still be created).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import fcntl
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVTEST_SCRIPT = REPO_ROOT / "hack" / "envtest.sh"
#: What a control plane needs; helm is only needed by the tests that install the chart.
CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kubectl")
ADMIN_USER = "cronwell-admin"
ADMIN_GROUP = "system:masters"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
DIR_PREFIX = "cronwell-controlplane-"
MISSING_BINARIES_HINT = (
    "run `make envtest` (or `bash hack/envtest.sh`) to build them, set KUBEBUILDER_ASSETS "
    "to a directory that has them, or set E2E_KUBECONFIG to use an existing cluster"
)


class ControlPlaneError(RuntimeError):
    """The control plane could not be provided or did not come up."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; unlike CalledProcessError, the message carries kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_assets(required: Sequence[str] = CONTROL_PLANE_BINARIES) -> Path:
    """The directory holding the binaries: KUBEBUILDER_ASSETS, else envtest.sh's cache.

    Never builds anything (a build takes many minutes): it asks ``hack/envtest.sh
    --print-path`` where the cache is and fails with a hint when it is incomplete.
    """
    candidates: list[Path] = []
    if assets := os.environ.get("KUBEBUILDER_ASSETS"):
        candidates.append(Path(assets))
    if ENVTEST_SCRIPT.is_file():
        out = subprocess.run(
            ["bash", str(ENVTEST_SCRIPT), "--print-path"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip().splitlines()[-1]))
    for directory in candidates:
        if all(_is_executable(directory / name) for name in required):
            return directory
    where = ", ".join(str(c) for c in candidates) or "nowhere (no KUBEBUILDER_ASSETS)"
    raise ControlPlaneError(f"{', '.join(required)} not found in {where}: {MISSING_BINARIES_HINT}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def peak_rss_kib(pid: int) -> int | None:
    """Peak resident memory (VmHWM) of a live process in KiB, None if unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Runs in the child before exec: kill it if the test process dies (even by SIGKILL).

    SIGKILL, not SIGTERM: with etcd gone too, kube-apiserver's graceful shutdown takes
    ~20s, and nobody is left to care about a clean exit.
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a server in its own session (so its whole group can be signalled)."""
    # PDEATHSIG fires when the spawning *thread* exits, so only use it from the main thread.
    in_main = threading.current_thread() is threading.main_thread()
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if in_main else None,
        )


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout``, and reap the leader."""
    if proc.poll() is not None:
        return
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also on KeyboardInterrupt while waiting
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def sweep_stale_dirs() -> None:
    """Remove temp dirs left by control planes whose test process was killed.

    Each live control plane holds an flock on its dir's owner.lock; a lock we can take
    belongs to a dead process. etcd preallocates its WAL, so a leak is ~100 MiB each.
    """
    for lock in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*/owner.lock"):
        if not owned(lock.parent):
            shutil.rmtree(lock.parent, ignore_errors=True)


def owned(directory: Path) -> bool:
    """Whether a live harness owns ``directory`` (it holds the flock on owner.lock)."""
    try:
        with (directory / "owner.lock").open("rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return False


# --------------------------------------------------------------------------------- PKI

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = cronwell-envtest
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {san}
"""


def _openssl(directory: Path, *args: str) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=directory, capture_output=True, check=True)
    except FileNotFoundError as exc:
        raise ControlPlaneError("the openssl CLI is needed to make the test certificates") from exc
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace")
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {err}") from exc


def generate_pki(directory: Path, alt_names: Sequence[str] = ()) -> None:
    """Write a throwaway CA, a serving cert for 127.0.0.1 and a service-account key pair.

    Files: ca.crt, ca.key, server.crt, server.key, sa.key, sa.pub. They live for two
    days, which is plenty for a test session and harmless if leaked. ``alt_names`` adds
    subjectAltNames to the serving cert, e.g. ``IP:10.0.0.1`` or ``DNS:kubernetes``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    san = ", ".join(dict.fromkeys(["IP:127.0.0.1", "DNS:localhost", *alt_names]))
    (directory / "openssl.cnf").write_text(_OPENSSL_CONFIG.format(san=san))
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    serial = f"0x{secrets.token_hex(8)}"
    for command in (
        f"req -x509 -config openssl.cnf -extensions ca_ext {ec} -keyout ca.key -out ca.crt"
        " -days 2 -subj /CN=cronwell-envtest-ca",
        f"req -new -config openssl.cnf {ec} -keyout server.key -out server.csr"
        " -subj /CN=kube-apiserver",
        f"x509 -req -in server.csr -CA ca.crt -CAkey ca.key -set_serial {serial} -days 2"
        " -extfile openssl.cnf -extensions server_ext -out server.crt",
        "genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key",
        "pkey -in sa.key -pubout -out sa.pub",
    ):
        _openssl(directory, *command.split())


def write_kubeconfig(
    path: Path, server: str, token: str, ca_pem: bytes, name: str = "cronwell-envtest"
) -> None:
    """A self-contained kubeconfig (CA inlined) with a bearer token, mode 0600."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": ADMIN_USER, "namespace": "default"}}
        ],
        "current-context": name,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(config, out, sort_keys=False)


# ----------------------------------------------------------------------------- clusters


class Cluster:
    """What e2e tests need from any cluster: a kubeconfig and a kubectl bound to it."""

    def __init__(self, kubeconfig: Path, kubectl_binary: Path | str) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_binary = kubectl_binary
        self._kubectl_env: dict[str, str] = {}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; with ``check``, a failure raises KubectlError."""
        argv = [str(self.kubectl_binary), f"--kubeconfig={self.kubeconfig}", *args]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self._kubectl_env}
        proc = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=env
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def apply(self, manifest: str) -> subprocess.CompletedProcess[str]:
        """Server-side apply YAML text (no last-applied annotation, so no size limit)."""
        args = "apply --server-side --force-conflicts --field-manager=cronwell-tests -f -"
        return self.kubectl(*args.split(), input=manifest)

    def install_crds(self, paths: Iterable[str | Path], timeout: float = 60) -> list[str]:
        """Apply CRD files (or directories of them) and wait until each is Established.

        Waiting matters: right after creation the new resource is not served yet, and the
        first create of a custom object would fail with "no matches for kind".
        Returns the CRD names.
        """
        files: list[Path] = []
        for entry in map(Path, paths):
            if entry.is_dir():
                files += sorted(
                    p for p in entry.iterdir() if p.suffix in {".yaml", ".yml", ".json"}
                )
            else:
                files.append(entry)
        names: list[str] = []
        for file in files:
            text = file.read_text()
            for doc in yaml.safe_load_all(text):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    names.append(str(doc["metadata"]["name"]))
            self.apply(text)
        if names:
            self.kubectl(
                "wait",
                "--for=condition=Established",
                f"--timeout={int(timeout)}s",
                *(f"customresourcedefinition/{name}" for name in names),
                timeout=timeout + 30,
            )
        return names


class LocalCluster(Cluster):
    """A cluster this process runs (start() and stop(); ``with`` calls them) in a temp dir
    of its own, locked while it lives so that a sweeper leaves it alone."""

    dir: Path | None
    _lock: IO[bytes] | None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _make_dir(self, prefix: str) -> Path:
        """A new temp dir (for ``self.dir``), locked before it gets its final name, so a
        sweeper never sees it unlocked."""
        directory = Path(tempfile.mkdtemp(prefix=prefix))
        self._lock = (directory / ".owner.lock").open("wb")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (directory / ".owner.lock").rename(directory / "owner.lock")
        return directory

    def _remove_dir(self) -> None:
        """Remove the temp dir, then let go of its lock. Idempotent."""
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class ExistingCluster(Cluster):
    """A cluster someone else runs (kind, a CI cluster), reached through its kubeconfig."""

    def __init__(self, kubeconfig: Path | str) -> None:
        kubeconfig = Path(kubeconfig)
        if not kubeconfig.is_file():
            raise ControlPlaneError(f"kubeconfig {kubeconfig} does not exist")
        try:
            kubectl: Path | str = find_assets(("kubectl",)) / "kubectl"
        except ControlPlaneError:
            kubectl = shutil.which("kubectl") or "kubectl"
        super().__init__(kubeconfig, kubectl)


class ControlPlane(LocalCluster):
    """etcd + kube-apiserver on free 127.0.0.1 ports, with a temp dir removed on exit.

    Use as a context manager; both servers are stopped (SIGTERM, then SIGKILL) and the
    temp dir removed however the body ends, including KeyboardInterrupt. Authentication
    is a static bearer token for a user in system:masters, authorization is RBAC, so
    tests of other identities meet the real authorizer.

    ``extra_apiserver_args`` overrides or adds kube-apiserver flags (name without "--").
    ``address`` is where kube-apiserver listens and what it advertises (a node's pods
    need an address other than loopback); ``alt_names`` are extra serving-cert names.
    ``users`` maps more token users to their group (a node's components): their tokens
    are in ``user_tokens``.
    """

    def __init__(
        self,
        assets: Path | str | None = None,
        *,
        start_timeout: float = 90,
        stop_timeout: float = 15,
        extra_apiserver_args: Mapping[str, str] | None = None,
        address: str = "127.0.0.1",
        alt_names: Sequence[str] = (),
        users: Mapping[str, str] | None = None,
    ) -> None:
        self.assets = Path(assets) if assets is not None else find_assets()
        missing = [n for n in CONTROL_PLANE_BINARIES if not _is_executable(self.assets / n)]
        if missing:
            raise ControlPlaneError(f"{', '.join(missing)} missing in {self.assets}")
        super().__init__(Path("/nonexistent"), self.assets / "kubectl")
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_apiserver_args = dict(extra_apiserver_args or {})
        self.token = secrets.token_urlsafe(32)
        self.address = address
        self.alt_names = [f"IP:{address}", *alt_names]
        self.user_groups = {ADMIN_USER: ADMIN_GROUP, **(users or {})}
        self.user_tokens = {user: secrets.token_urlsafe(32) for user in self.user_groups}
        self.user_tokens[ADMIN_USER] = self.token
        self.server = ""
        self.etcd_url = ""
        self.dir: Path | None = None
        self.startup_seconds: float | None = None
        #: VmHWM of each server in KiB, recorded as it is stopped.
        self.peak_rss: dict[str, int] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._lock: IO[bytes] | None = None

    # -- lifecycle

    @property
    def ca_file(self) -> Path:
        """PEM of the CA that signed the API server's serving certificate."""
        if self.dir is None:
            raise ControlPlaneError("the control plane is not running")
        return self.dir / "pki" / "ca.crt"

    def pids(self) -> dict[str, int]:
        """Process ids of the servers, e.g. to check that they are gone after stop()."""
        return {name: proc.pid for name, proc in self.processes.items()}

    def start(self) -> None:
        """Start etcd and kube-apiserver and return once /readyz says ok."""
        if self.processes:
            raise ControlPlaneError("already started")
        atexit.register(self.stop)  # last resort if the caller never stops us
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        sweep_stale_dirs()
        self.dir = self._make_dir(DIR_PREFIX)
        pki = self.dir / "pki"
        generate_pki(pki, self.alt_names)
        (self.dir / "tokens.csv").write_text(
            "".join(
                f'{self.user_tokens[user]},{user},{user},"{group}"\n'
                for user, group in self.user_groups.items()
            )
        )
        self._kubectl_env = {"KUBECACHEDIR": str(self.dir / "kubectl-cache")}

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.server = f"https://{self.address}:{api_port}"
        self.kubeconfig = self.dir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server, self.token, (pki / "ca.crt").read_bytes())

        started = time.monotonic()
        self.processes["etcd"] = _spawn(
            [
                str(self.assets / "etcd"),
                "--name=cronwell",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=cronwell={peer_url}",
                "--initial-cluster-state=new",
                # Test data is throwaway: skipping fsync makes every write much cheaper.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            self.dir / "etcd.log",
        )
        args = {
            "etcd-servers": self.etcd_url,
            "bind-address": self.address,
            "advertise-address": self.address,
            "secure-port": str(api_port),
            "cert-dir": str(self.dir / "apiserver-certs"),
            "tls-cert-file": str(pki / "server.crt"),
            "tls-private-key-file": str(pki / "server.key"),
            "token-auth-file": str(self.dir / "tokens.csv"),
            "authorization-mode": "RBAC",
            "service-cluster-ip-range": SERVICE_CLUSTER_IP_RANGE,
            "service-account-issuer": SERVICE_ACCOUNT_ISSUER,
            "service-account-key-file": str(pki / "sa.pub"),
            "service-account-signing-key-file": str(pki / "sa.key"),
            # No controller-manager creates the "default" ServiceAccount, which this
            # plugin would demand of every Pod; the rest of the default set stays on.
            "disable-admission-plugins": "ServiceAccount",
            "allow-privileged": "true",
            "profiling": "false",
        }
        args.update(self.extra_apiserver_args)
        self.processes["kube-apiserver"] = _spawn(
            [str(self.assets / "kube-apiserver"), *(f"--{k}={v}" for k, v in args.items())],
            self.dir / "kube-apiserver.log",
        )
        self._wait_ready()
        self.startup_seconds = time.monotonic() - started

    def _wait_ready(self) -> None:
        assert self.dir is not None
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode} while starting:\n"
                        + _tail(self.dir / f"{name}.log")
                    )
            try:
                with urllib.request.urlopen(request, timeout=2, context=context) as resp:
                    if resp.status == 200 and resp.read().strip() == b"ok":
                        return
            except OSError:  # refused, TLS not up yet, HTTP 500 while hooks run
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"kube-apiserver not ready after {self.start_timeout}s:\n"
                    + _tail(self.dir / "kube-apiserver.log")
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the API server, then etcd, and remove the temp dir. Idempotent."""
        atexit.unregister(self.stop)
        try:
            for name in ("kube-apiserver", "etcd"):
                proc = self.processes.get(name)
                if proc is None:
                    continue
                if (rss := peak_rss_kib(proc.pid)) is not None and proc.poll() is None:
                    self.peak_rss[name] = rss
                _stop(proc, self.stop_timeout)
        finally:
            # Never leave a server behind, even if stopping the first one was interrupted.
            for proc in self.processes.values():
                _stop(proc, 0)
            self.processes.clear()
            self._remove_dir()
