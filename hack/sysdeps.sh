#!/usr/bin/env bash
# Install the Debian packages the tests use, if any is missing (idempotent; `make sysdeps`).
#   faketime, openssl        chaos clock skew, the test PKI
#   containerd runc          the container runtime of the e2e node (make e2e-node)
#   containernetworking-plugins iptables iproute2   the node's CNI bridge and its netns
#   gcc libc6-dev            the static pause binary (cronwell/testing/oci.py)
#   busybox-static           the node tests' own tiny image
#   chromium chromium-driver the dashboard's browser test (tests/integration/test_ui_browser.py)
set -euo pipefail

# command-or-file : package
need=(
  faketime:faketime openssl:openssl containerd:containerd runc:runc
  /usr/lib/cni/bridge:containernetworking-plugins iptables:iptables ip:iproute2
  nsenter:util-linux gcc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev
  /bin/busybox:busybox-static /usr/bin/chromium:chromium /usr/bin/chromedriver:chromium-driver
)
missing=()
for entry in "${need[@]}"; do
  what=${entry%%:*} pkg=${entry#*:}
  if [[ $what == /* ]]; then [[ -e $what ]] && continue
  else command -v "$what" >/dev/null && continue; fi
  missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "warning: install these Debian packages: ${missing[*]}" >&2
  exit 0
fi
echo "sysdeps: apt-get install ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
  --no-install-recommends "${missing[@]}" >/dev/null
