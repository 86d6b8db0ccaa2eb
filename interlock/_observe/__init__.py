"""Seeing runs from outside: OpenTelemetry spans made from a run's records, Prometheus
metrics for a server's /metrics, branch coverage across a workflow's stored runs.
Layers 1 and 8 (tests/test_layers.py).
"""
