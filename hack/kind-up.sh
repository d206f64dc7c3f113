#!/usr/bin/env bash
# Create (or reuse) a kind cluster named "cronwell" for the e2e tests, then print how to
# point them at it. For users with Docker (or podman via KIND_EXPERIMENTAL_PROVIDER) and
# kind on PATH. NOT usable on the project's dev and CI machines: they have no container
# engine, so there the e2e tests run against the local control plane (make envtest) and the
# chart on a one-node cluster (make e2e-node, with the image from make image).
set -euo pipefail

name=${KIND_CLUSTER_NAME:-cronwell}
kubeconfig=${KIND_KUBECONFIG:-$HOME/.kube/kind-$name.yaml}

command -v kind >/dev/null || { echo "kind-up: kind is not on PATH" >&2; exit 1; }
docker info >/dev/null 2>&1 || [[ -n ${KIND_EXPERIMENTAL_PROVIDER:-} ]] || {
  echo "kind-up: no Docker engine reachable; use 'make e2e-node' (or 'make test') instead" >&2
  exit 1
}

if ! kind get clusters 2>/dev/null | grep -qx "$name"; then
  kind create cluster --name "$name" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
mkdir -p "$(dirname "$kubeconfig")"
kind get kubeconfig --name "$name" >"$kubeconfig"
chmod 600 "$kubeconfig"

cat <<MSG
kind cluster "$name" is up. Deploy cronwell into it with:
  make docker-build && kind load docker-image cronwell:<tag> --name $name && make deploy
(README, "Try it on a real cluster"). Run the e2e tests against it with:
  export E2E_KUBECONFIG=$kubeconfig
  .venv/bin/pytest tests/e2e
Delete it with: kind delete cluster --name $name
MSG
