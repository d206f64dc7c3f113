"""Helpers shared by the test suites, each written once: waiting (`wait`), cronwell
processes (`procs`), Kubernetes namespaces, databases, helm and the operator (`kube`).
Fixtures stay in the conftest.py files; these are the plain functions behind them."""
