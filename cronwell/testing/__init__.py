"""Test support shipped with cronwell: a real local Kubernetes control plane for e2e tests."""
