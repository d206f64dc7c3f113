#!/usr/bin/env bash
# CloudNativePG for the node test (tests/node/test_cnpg.py), built without Docker and
# without pulling an image, at the version pinned in hack/envtest-versions.env.
#
#   bash hack/cnpg.sh               # reuse or build; the last stdout line is the directory
#   bash hack/cnpg.sh --print-path  # only print the directory (never builds)
#
# Into ${CRONWELL_CACHE:-$HOME/.cache/cronwell}/cnpg/<version>/ (outside the repo):
#   manager          the operator and the instance manager, one static binary
#                    (CGO_ENABLED=0) built from the Go module's cmd/manager
#   cnpg.yaml        the module's own release manifest (releases/cnpg-<version>.yaml: CRDs,
#                    RBAC, webhooks, the operator's Deployment), as published; the test
#                    points it at the local images
#   operator.tar     docker archive of localhost/cnpg-manager:<version>: the manager as
#                    operator/manager_<arch> and /manager, laid out as upstream's image (the
#                    operator's Pod, and the init container that copies it into every
#                    PostgreSQL Pod)
#   postgresql.tar   docker archive of the operand image, Debian's PostgreSQL on cronwell's
#                    base (hack/build-image.sh --base-only): user postgres with UID/GID 26,
#                    initdb, postgres, pg_ctl, pg_controldata, pg_basebackup, pg_rewind on
#                    PATH; its tag starts with the major version, as CloudNativePG requires
#   postgresql.image that image's name (localhost/cnpg-postgresql:<major>.<minor>)
# Each artifact is rebuilt only when its inputs change. Needs root (buildah) and the Go
# toolchain; the Go module proxy and the Debian mirror are the only sources.
# Progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=envtest-versions.env
source "$here/envtest-versions.env"
: "${CLOUDNATIVE_PG_VERSION:?hack/envtest-versions.env pins no CLOUDNATIVE_PG_VERSION}"

module=github.com/cloudnative-pg/cloudnative-pg
version=${CLOUDNATIVE_PG_VERSION#v}
cache=${CRONWELL_CACHE:-$HOME/.cache/cronwell}
dir=$cache/cnpg/$version
store=$cache/buildah
operator_ref=localhost/cnpg-manager:$version

log() { printf 'cnpg: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
bh() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }

case ${1:-} in
  --print-path) printf '%s\n' "$dir"; exit 0 ;;
  -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
[[ $(id -u) == 0 ]] || die "needs root (buildah); run it with sudo"
mkdir -p "$dir" "$cache/images"
export CONTAINERS_REGISTRIES_CONF=$store/registries.conf BUILDAH_ISOLATION=chroot

# --------------------------------------------------------------------- manager (Go)
manager_ok() {
  [[ -x $1 ]] && "$1" version 2>/dev/null | grep -q "Version:$version "
}

if manager_ok "$dir/manager" && [[ -f $dir/cnpg.yaml ]]; then
  log "manager $version and cnpg.yaml present"
else
  GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [[ -x "$GO" ]] || die "the Go toolchain is needed to build the manager (set GO=/path/to/go)"
  export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOWORK=off
  export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
  work=$(mktemp -d "${TMPDIR:-/tmp}/cronwell-cnpg.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  start=$SECONDS
  (
    cd "$work"
    "$GO" mod init cronwell.local/cnpg >/dev/null 2>&1
    "$GO" mod edit -require="$module@$CLOUDNATIVE_PG_VERSION"
    src=$("$GO" mod download -json "$module@$CLOUDNATIVE_PG_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -f $src/releases/cnpg-$version.yaml ]] ||
      die "$module@$CLOUDNATIVE_PG_VERSION has no releases/cnpg-$version.yaml"
    log "go build $module/cmd/manager ($("$GO" version))"
    # The module's own Makefile stamps the same version (pkg/versions.buildVersion).
    "$GO" build -trimpath -ldflags="-s -w" -o "$work/manager" "$module/cmd/manager"
    manager_ok "$work/manager" || die "the manager built does not report version $version"
    cp "$src/releases/cnpg-$version.yaml" "$work/cnpg.yaml"
  )
  mv -f "$work/cnpg.yaml" "$dir/cnpg.yaml"
  mv -f "$work/manager" "$dir/manager"
  rm -rf "$work"
  trap - EXIT
  log "built manager in $((SECONDS - start)) s"
fi

# ------------------------------------------------------------------------- images
# One build at a time in the shared buildah store (hack/build-image.sh takes it too, so
# the base is asked for before the lock).
base=$(bash "$here/build-image.sh" --base-only | tail -n1)
exec 9>"$cache/images/.lock"
flock 9

# push REF ARCHIVE KEY: write the image REF as a docker archive with its cache key.
push() {
  rm -f "$2.key"
  bh push -q "$1" "docker-archive:$2.tmp:$1" >&2
  mv "$2.tmp" "$2"
  echo "$3" >"$2.key"
}

key=$( { sha256sum "$dir/manager" | cut -d' ' -f1; echo "$operator_ref layout 2"; } |
  sha256sum | cut -c1-64)
if [[ -f $dir/operator.tar && $(cat "$dir/operator.tar.key" 2>/dev/null) == "$key" ]]; then
  log "$operator_ref (cached)"
else
  start=$SECONDS
  # The upstream image's layout: the operator finds the architectures it can hand to
  # PostgreSQL Pods as operator/manager_<arch> (relative to /), /manager links to its own.
  arch=$(dpkg --print-architecture)
  layout=$(mktemp -d "${TMPDIR:-/tmp}/cronwell-cnpg-image.XXXXXX")
  mkdir "$layout/operator"
  install -m 0755 "$dir/manager" "$layout/operator/manager_$arch"
  ln -s "operator/manager_$arch" "$layout/manager"
  tar --numeric-owner --owner=0 --group=0 -C "$layout" -cf "$layout.tar" operator manager
  rm -rf "$layout"
  ctr=$(bh from --pull=never scratch)
  bh add "$ctr" "$layout.tar" / >/dev/null
  rm -f "$layout.tar"
  bh config --entrypoint '["/manager"]' --user 10001:10001 --workingdir / \
    --label org.opencontainers.image.description="CloudNativePG $version manager ($module)" \
    "$ctr"
  bh commit --rm -q "$ctr" "$operator_ref" >/dev/null
  push "$operator_ref" "$dir/operator.tar" "$key"
  log "$operator_ref built in $((SECONDS - start)) s"
fi

# The operand: what CloudNativePG's instance manager runs (postgres-containers' contract).
# Debian's tape group holds GID 26: the postgres user and group take 26 before the
# packages (postgresql-common keeps an existing postgres user); no "main" cluster.
operand_recipe() {
  cat <<'EOF'
set -eu
groupdel tape
groupadd -g 26 postgres
useradd -u 26 -g 26 -r -d /var/lib/postgresql -s /bin/bash postgres
mkdir -p /etc/postgresql-common/createcluster.d
echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/cronwell.conf
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*
major=$(ls /usr/lib/postgresql)
ln -s "/usr/lib/postgresql/$major/bin" /usr/lib/postgresql/bin
chown -R 26:26 /var/lib/postgresql
EOF
}
key=$( { echo "$base"; operand_recipe; } | sha256sum | cut -c1-64)
if [[ -f $dir/postgresql.tar && -f $dir/postgresql.image &&
  $(cat "$dir/postgresql.tar.key" 2>/dev/null) == "$key" ]]; then
  log "$(<"$dir/postgresql.image") (cached)"
else
  start=$SECONDS
  ca=()
  host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
  [[ -f $host_ca ]] && ca=(--volume "$host_ca:/etc/ssl/certs/ca-certificates.crt:ro")
  ctr=$(bh from --pull=never "$base")
  if ! bh run "${ca[@]}" "$ctr" -- sh -c "$(operand_recipe)" >&2; then
    bh rm "$ctr" >/dev/null 2>&1
    die "installing Debian's postgresql in the operand image failed (output above)"
  fi
  full=$(bh run "$ctr" -- /usr/lib/postgresql/bin/postgres -V)   # postgres (PostgreSQL) 15.14 (Debian ...)
  pg=$(sed -n 's/^postgres (PostgreSQL) \([0-9]*\.[0-9]*\).*/\1/p' <<<"$full")
  [[ -n $pg ]] || die "cannot read PostgreSQL's version from: $full"
  ref=localhost/cnpg-postgresql:$pg
  bh config --user 26:26 --workingdir /var/lib/postgresql --cmd /bin/bash \
    --env PATH=/usr/lib/postgresql/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="Debian's PostgreSQL $pg for CloudNativePG" \
    "$ctr"
  bh commit --rm -q "$ctr" "$ref" >/dev/null
  push "$ref" "$dir/postgresql.tar" "$key"
  echo "$ref" >"$dir/postgresql.image"
  log "$ref built in $((SECONDS - start)) s"
fi
bh rmi --prune >/dev/null 2>&1 || true
log "ready: $dir ($(du -sh "$dir" | cut -f1))"
printf '%s\n' "$dir"
