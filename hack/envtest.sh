#!/usr/bin/env bash
# Provide etcd, kube-apiserver, kubectl and helm for the local control plane used by
# the e2e tests, at the versions pinned in hack/envtest-versions.env.
#
#   bash hack/envtest.sh               # reuse or build; last stdout line is the directory
#   bash hack/envtest.sh --print-path  # only print the directory (never builds)
#   bash hack/envtest.sh --node        # also kubelet, kube-controller-manager, kube-proxy,
#                                      # kube-scheduler and the pause image (make e2e-node)
#
# The binaries are built from their Go modules (nothing but the Go module proxy is
# needed) into ${ENVTEST_CACHE:-$HOME/.cache/cronwell/envtest}/<kubernetes-version>/,
# outside the repo. A binary is reused when it runs and reports the pinned version, so
# the script is idempotent and a version bump rebuilds only what changed. Each binary is
# built into a staging dir and moved into place only after it passed its version check,
# so an interrupted build never leaves a complete-looking cache.
# If KUBEBUILDER_ASSETS names a directory holding all the binaries, that one is used.
# --node adds the node's binaries and pause.tar, an OCI archive of Kubernetes' own
# build/pause/linux/pause.c (static gcc, cronwell/testing/oci.py) that the node harness
# imports into containerd.
# Progress goes to stderr; stdout carries only the directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=envtest-versions.env
source "$here/envtest-versions.env"

tools=(etcd kube-apiserver kubectl helm)
node_tools=(kubelet kube-controller-manager kube-scheduler kube-proxy)
cache_dir="${ENVTEST_CACHE:-$HOME/.cache/cronwell/envtest}/${KUBERNETES_VERSION#v}"

log() { printf 'envtest: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# has_all DIR: all the tools are files in DIR (executable, but for pause.tar).
has_all() {
  local t
  for t in "${tools[@]}"; do
    [[ -f "$1/$t" && ( $t == *.tar || -x "$1/$t" ) ]] || return 1
  done
}

# version_ok TOOL DIR: DIR/TOOL runs and reports the pinned version.
version_ok() {
  local tool=$1 dir=$2 out
  [[ $tool == *.tar || -x "$dir/$tool" ]] || return 1
  case $tool in
    etcd)
      out=$("$dir/etcd" --version 2>/dev/null) || return 1
      grep -qx "etcd Version: ${ETCD_VERSION#v}" <<<"$out" ;;
    kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kube-proxy)
      out=$("$dir/$tool" --version 2>/dev/null) || return 1
      [[ $out == "Kubernetes $KUBERNETES_VERSION" ]] ;;
    pause.tar)
      # pause.version names the Kubernetes release whose pause.c it was built from.
      [[ -f $dir/pause.tar && $(cat "$dir/pause.version" 2>/dev/null) == "$KUBERNETES_VERSION" ]] ;;
    kubectl)
      out=$("$dir/kubectl" version --client 2>/dev/null) || return 1
      grep -qx "Client Version: $KUBERNETES_VERSION" <<<"$out" ;;
    helm)
      out=$("$dir/helm" version --short 2>/dev/null) || return 1
      [[ $out == "$HELM_VERSION"* ]] ;;
    *) return 1 ;;
  esac
}

print_only=false
for arg in "$@"; do
  case $arg in
    --print-path) print_only=true ;;
    --node) tools+=("${node_tools[@]}" pause.tar) ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

# Assets supplied by the caller win (e.g. a CI image that ships them).
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_all "$KUBEBUILDER_ASSETS"; then
    $print_only || log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks one of ${tools[*]}; using $cache_dir"
fi

if $print_only; then
  printf '%s\n' "$cache_dir"
  exit 0
fi

missing=()
for t in "${tools[@]}"; do
  version_ok "$t" "$cache_dir" || missing+=("$t")
done
if ((${#missing[@]} == 0)); then
  log "all binaries present in $cache_dir"
  printf '%s\n' "$cache_dir"
  exit 0
fi

# ---------------------------------------------------------------------------- build
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x "$GO" ]] || die "the Go toolchain is needed to build ${missing[*]} (set GO=/path/to/go)"
log "building ${missing[*]} with $("$GO" version)"

# Static binaries, no toolchain download, go.mod/go.sum of the scratch modules updated
# as needed. GOPATH/GOMODCACHE/GOCACHE stay at their defaults so repeated runs reuse them.
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOWORK=off
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"

mkdir -p "$cache_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/cronwell-envtest.XXXXXX")
staging=$(mktemp -d "$cache_dir/.staging.XXXXXX")   # same filesystem: mv is atomic
build_pid=""
trap 'rm -rf "$work" "$staging"' EXIT
# Builds run in the background so that INT/TERM are handled at once (bash defers traps
# while a foreground child runs): stop the build, then the EXIT trap cleans up.
trap '[[ -n $build_pid ]] && kill "$build_pid" 2>/dev/null; exit 130' INT
trap '[[ -n $build_pid ]] && kill "$build_pid" 2>/dev/null; exit 143' TERM

want() { [[ " ${missing[*]} " == *" $1 "* ]]; }

# new_module NAME: a scratch module in $work/NAME; the caller cds into it.
new_module() {
  mkdir -p "$work/$1"
  (cd "$work/$1" && "$GO" mod init "cronwell.local/envtest/$1" >/dev/null 2>&1)
}

# mod_time MODULE@VERSION: the release's commit time, a reproducible build date.
mod_time() {
  "$GO" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$1"
}

# go_build OUT PKG LDFLAGS: build PKG into $staging/OUT.
go_build() {
  local start=$SECONDS
  log "go build $2"
  "$GO" build -trimpath -ldflags="-s -w $3" -o "$staging/$1" "$2" &
  build_pid=$!
  wait "$build_pid"
  build_pid=""
  log "built $1 in $((SECONDS - start))s"
}

if want kube-apiserver || want kubectl || want kubelet || want kube-controller-manager \
  || want kube-scheduler || want kube-proxy || want pause.tar; then
  new_module kubernetes
  cd "$work/kubernetes"
  kmod=$("$GO" list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$KUBERNETES_VERSION")
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
  # ./staging/src/...; replaces of a dependency are ignored, so point each staging
  # module at its published release (v0.<minor>.<patch>), read from that go.mod.
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  edits=(-require="k8s.io/kubernetes@$KUBERNETES_VERSION")
  while read -r m; do
    edits+=(-replace="$m=$m@$staging_version")
  done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$kmod")
  # Keep Kubernetes' own GODEBUG defaults (e.g. godebug default=go1.24).
  while read -r d; do
    edits+=(-godebug="$d")
  done < <(awk '/^godebug \($/ { b = 1; next } b && /^\)/ { b = 0 }
                b && NF { print $1 } /^godebug [^(]/ { print $2 }' "$kmod")
  ((${#edits[@]} > 1)) || die "no staging replaces found in $kmod"
  "$GO" mod edit "${edits[@]}"
  log "k8s.io/kubernetes@$KUBERNETES_VERSION: $((${#edits[@]} - 1)) go.mod edits"
  kdate=$(mod_time "k8s.io/kubernetes@$KUBERNETES_VERSION")
  kminor=${KUBERNETES_VERSION#v1.}
  kminor=${kminor%%.*}
  kflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1"
    kflags+=" -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean"
    kflags+=" -X $pkg.buildDate=${kdate:-1970-01-01T00:00:00Z}"
  done
  if want kube-apiserver; then
    go_build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kflags"
  fi
  for t in kubectl "${node_tools[@]}"; do
    if want "$t"; then
      go_build "$t" "k8s.io/kubernetes/cmd/$t" "$kflags"
    fi
  done
  if want pause.tar; then
    start=$SECONDS
    kdir=$("$GO" list -m -f '{{.Dir}}' "k8s.io/kubernetes@$KUBERNETES_VERSION")
    python3 "$here/../cronwell/testing/oci.py" pause "$kdir/build/pause" "$staging/pause.tar" >&2
    printf '%s\n' "$KUBERNETES_VERSION" >"$staging/pause.version"
    log "built pause.tar in $((SECONDS - start))s"
  fi
fi

if want etcd; then
  new_module etcd
  cd "$work/etcd"
  "$GO" mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go_build etcd go.etcd.io/etcd/server/v3 ""
fi

if want helm; then
  new_module helm
  cd "$work/helm"
  "$GO" mod edit -require="helm.sh/helm/v3@$HELM_VERSION"
  "$GO" mod download helm.sh/helm/v3 >/dev/null
  # Helm's default .Capabilities.KubeVersion comes from the client-go it is built with
  # (as helm's Makefile does); its own version string from the pinned tag.
  cgo=$("$GO" list -m -f '{{.Version}}' k8s.io/client-go)   # v0.<minor>.<patch>
  cminor=${cgo#v0.}
  cminor=${cminor%%.*}
  hflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  hflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    hflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$cminor"
  done
  go_build helm helm.sh/helm/v3/cmd/helm "$hflags"
fi

for t in "${missing[@]}"; do
  version_ok "$t" "$staging" || die "$t was built but does not report the pinned version"
done
for t in "${missing[@]}"; do
  mv -f "$staging/$t" "$cache_dir/$t"
  if [[ $t == pause.tar ]]; then mv -f "$staging/pause.version" "$cache_dir/"; fi
done
for t in "${tools[@]}"; do
  version_ok "$t" "$cache_dir" || die "$cache_dir/$t is not usable"
done
log "ready: $cache_dir ($(du -sh "$cache_dir" | cut -f1))"
printf '%s\n' "$cache_dir"
