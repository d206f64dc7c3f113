#!/usr/bin/env bash
# Build the cronwell image from the project's Dockerfile on a machine with no Docker engine
# and no container registry, and write it as an archive that `ctr -n k8s.io images import`
# (or `docker load`) accepts. The last line on stdout is the archive's path.
#
#   hack/build-image.sh [--tag TAG] [--repo NAME]     (defaults: pyproject's version, cronwell)
#   hack/build-image.sh --base-only    # only step 1; prints the base's name (hack/cnpg.sh)
#
# 1. base: a minimal Debian bookworm from debootstrap (Debian's python3 is 3.11, as the
#    Dockerfile's default python:3.11-slim-bookworm), imported as localhost/cronwell-base:<key>;
#    <key> hashes make_base itself, so the base is rebuilt only when its recipe changes.
# 2. image: `buildah bud` of the Dockerfile with BASE_IMAGE set to that base, chroot isolation,
#    vfs storage, --pull=never (buildah never contacts a registry; pip reaches PyPI).
#    Rebuilt only when the build context (the files .dockerignore lets in), the Dockerfile
#    or the base changes; a second tag of the same sources is the same image, retagged.
# Everything lives under $CRONWELL_CACHE (default ~/.cache/cronwell): buildah/ and images/.
# A tag keeps its image until retagged (vfs: a full copy each); rm -rf buildah/ reclaims all.
# Needs root (debootstrap, chroot); installs debootstrap and buildah with apt-get if absent.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=cronwell
tag=""
base_only=false
while (($#)); do
  case $1 in
    --base-only) base_only=true; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --repo) repo=${2:?--repo needs a value}; shift 2 ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ -n $tag ]] || tag=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] ||
  { echo "build-image: '$tag' is not a valid image tag" >&2; exit 2; }
[[ $repo =~ ^[a-z0-9]+([._/-][a-z0-9]+)*$ ]] ||
  { echo "build-image: '$repo' is not a valid image repository (lower case, no port)" >&2; exit 2; }

cache=${CRONWELL_CACHE:-$HOME/.cache/cronwell}
store=$cache/buildah
images=$cache/images
archive=$images/${repo##*/}-$tag.tar
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The CA bundle pip's RUN steps trust: the host's (see the bud below).
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
# What the Dockerfile's stages need: python3 + venv (ensurepip), useradd (passwd), and the
# system trust store for PGSSLROOTCERT=system (ca-certificates), tzdata for time zones.
base_packages=(python3 python3-venv passwd ca-certificates tzdata)

log() { echo "build-image: $*" >&2; }
die() { log "$*"; exit 1; }
bh() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }

[[ $(id -u) == 0 ]] || die "needs root (debootstrap and buildah's chroot isolation); run it with sudo"
mkdir -p "$store" "$images"
# No registry is ever consulted: short names do not resolve and nothing is searched.
export CONTAINERS_REGISTRIES_CONF=$store/registries.conf
printf 'unqualified-search-registries = []\nshort-name-mode = "enforcing"\n' >"$CONTAINERS_REGISTRIES_CONF"
export BUILDAH_ISOLATION=chroot

ensure_tools() {
  local missing=()
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v buildah >/dev/null || missing+=(buildah)
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >&2; } ||
    die "could not install ${missing[*]}: apt-get install ${missing[*]}"
}

# debootstrap mounts /proc and /sys in the target: unmount before removing, never rm through them.
unmount_under() { findmnt -rn -o TARGET | { grep "^$1/" || true; } | sort -r | xargs -r umount -l; }

# Bootstrap $1 (a directory) as the base root filesystem. Its text is the base's cache key.
make_base() {
  local rootfs=$1 include
  include=$(IFS=,; echo "${base_packages[*]}")
  debootstrap --variant=minbase --include="$include" "$suite" "$rootfs" "$mirror" >&2
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
EOF
  # Images built FROM this one get no docs, man pages or translations either.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/01-cronwell-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/01-cronwell-norecommends"
  chroot "$rootfs" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get -qq -y upgrade >&2
  chroot "$rootfs" apt-get clean
  find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  unmount_under "$rootfs"
  # The runtime provides /dev, resolv.conf and hostname; debootstrap copied the host's.
  rm -rf "$rootfs"/usr/share/{man,info,locale,lintian}/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/log/* \
    "$rootfs"/etc/machine-id "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname "$rootfs"/dev/*
}

base_key=$(
  { declare -f make_base; echo "${base_packages[*]} $suite $mirror"; } | sha256sum | cut -c1-16
)
base=localhost/cronwell-base:$suite-$base_key

build_base() {
  work=$(mktemp -d "$cache/base.XXXXXX")
  local rootfs=$work/rootfs
  trap 'unmount_under "$work"; rm -rf "$work"' EXIT
  log "bootstrapping Debian $suite (${base_packages[*]})"
  make_base "$rootfs"
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$work/rootfs.tar" .
  local ctr
  ctr=$(bh from --pull=never scratch)
  bh add "$ctr" "$work/rootfs.tar" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash \
    --label org.opencontainers.image.description="Debian $suite minbase + ${base_packages[*]}" \
    "$ctr"
  bh commit --rm -q "$ctr" "$base" >/dev/null
  rm -rf "$work"
  trap - EXIT
}

# The build's inputs: the base, the Dockerfile and the files of the build context (the
# paths .dockerignore lets in with `!`, tracked or untracked but not git-ignored). Not the tag.
context_key() (
  cd "$root"
  echo "$base"
  mapfile -t allowed < <(sed -n 's:^!\(.*[^/]\)/*$:\1:p' .dockerignore)
  git ls-files -co --exclude-standard -- Dockerfile .dockerignore "${allowed[@]}" |
    grep -v -e '__pycache__/' -e '\.pyc$' | sort |
    while read -r f; do if [[ -f $f ]]; then sha256sum "$f"; fi; done
)

exec 9>"$images/.lock"
flock 9 # one build at a time per cache (the node harness and a test may both ask)
ensure_tools

if bh inspect --type image "$base" >/dev/null 2>&1; then
  log "base $base (cached)"
else
  start=$SECONDS
  build_base
  log "base $base built in $((SECONDS - start)) s"
  # Untag bases of earlier recipes; the prune below frees them once no image uses them.
  bh images --format '{{.Name}}:{{.Tag}}' | { grep '^localhost/cronwell-base:' || true; } |
    { grep -vxF "$base" || true; } | xargs -r buildah --root "$store/root" \
      --runroot "$store/run" --storage-driver vfs rmi >/dev/null 2>&1 || true
fi

if $base_only; then
  echo "$base"
  exit 0
fi

key=$(context_key | sha256sum | cut -c1-64)
ref=localhost/$repo:$tag
if [[ -f $archive && -f $archive.key && $(<"$archive.key") == "$key $ref" ]]; then
  log "$repo:$tag unchanged since the last build (cached)"
  echo "$archive"
  exit 0
fi

start=$SECONDS
# The same inputs under another tag (an upgrade test's second tag): the same image, retagged.
built=$(bh images -q --no-trunc --filter "label=dev.cronwell.build-key=$key" | head -n1)
if [[ -n $built ]]; then
  log "$repo:$tag is the image already built from these sources (${built:7:12}); tagging it"
  bh tag "$built" "$ref"
else
  log "building $repo:$tag from Dockerfile"
  # No --layers: with vfs every cached layer is a full copy of the tree, which costs more
  # than it saves; unchanged sources are caught above instead. RUN steps trust what the host
  # trusts (a TLS-intercepting proxy's CA) through a bind mount that is not committed.
  # A failed build leaves its working containers: remove them (this storage is ours alone,
  # and the lock above excludes a concurrent build).
  ca=()
  [[ -f $host_ca ]] && ca=(--volume "$host_ca:/etc/ssl/certs/ca-certificates.crt:ro")
  bh bud --pull=never --isolation chroot --format docker -q \
    --build-arg BASE_IMAGE="$base" "${ca[@]}" \
    --label dev.cronwell.build-key="$key" \
    -f "$root/Dockerfile" -t "$ref" "$root" >&2 ||
    { bh rm --all >/dev/null 2>&1; die "buildah bud failed (its output is above)"; }
fi
rm -f "$archive.key"
bh push -q "$ref" "docker-archive:$archive.tmp:$repo:$tag" >&2
mv "$archive.tmp" "$archive"
echo "$key $ref" >"$archive.key"
# Images no tag names any more (earlier builds of a tag): vfs keeps each as a full copy.
bh rmi --prune >/dev/null 2>&1 || true
log "$repo:$tag ready in $((SECONDS - start)) s: $(du -h "$archive" | cut -f1) archive"
echo "$archive"
