"""Prometheus metrics of a store and of the runs a process executes, for a
server's ``GET /metrics`` (the `server` extra has ``prometheus-client``).

Two sources, one registry:

- read from the store when scraped (`Metrics.refresh`): ``interlock_runs`` (gauge) by
  workflow and status, ``interlock_approvals_pending`` (gauge) by workflow and
  ``interlock_approval_oldest_age_seconds`` (gauge) by workflow -- whoever executed
  the runs (a CLI, a worker, another server);
- observed as this process executes runs (`Metrics.observe`, a listener of their
  journals): ``interlock_node_duration_seconds`` (histogram) by workflow and node,
  ``interlock_node_attempts_total`` (counter) by workflow, node and outcome, and
  ``interlock_tokens_total`` (counter) by workflow and node.
"""

from __future__ import annotations

import time
from collections import Counter

from .. import _log as L
from .._engine._fold import RunView
from .._store import ALL_RUNS, Store

# seconds: from a trivial node's milliseconds to an agent's minutes
BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    """A registry with interlock's metrics (see the module's text)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.runs = Gauge("interlock_runs", "Runs in the store, by workflow and status.",
                          ["workflow", "status"], registry=self.registry)
        self.pending = Gauge("interlock_approvals_pending",
                             "Runs waiting for a human decision, by workflow.", ["workflow"],
                             registry=self.registry)
        self.oldest = Gauge("interlock_approval_oldest_age_seconds",
                            "How long the oldest pending approval has waited, by workflow.",
                            ["workflow"], registry=self.registry)
        self.duration = Histogram("interlock_node_duration_seconds",
                                  "Node attempts' durations (runs this process executed).",
                                  ["workflow", "node"], buckets=BUCKETS,
                                  registry=self.registry)
        self.attempts = Counter("interlock_node_attempts",
                                "Node attempts by outcome (runs this process executed).",
                                ["workflow", "node", "outcome"], registry=self.registry)
        self.tokens = Counter("interlock_tokens", "Tokens recorded by nodes (runs this "
                              "process executed).", ["workflow", "node"],
                              registry=self.registry)

    def observe(self, rec: L.Record, view: RunView) -> None:
        """A journal listener: count a node attempt as its record is sealed."""
        rtype = rec["type"]
        if rtype not in (L.NODE_COMPLETED, L.NODE_FAILED, L.NODE_RETRYING, L.NODE_VISITED):
            return
        if rtype == L.NODE_COMPLETED and rec.get("items") is not None:
            return  # a mapped node's visit: its items are the attempts
        workflow, node = view.plan.spec.workflow, str(rec.get("node"))
        error = rec.get("error") or {}
        outcome = {L.NODE_COMPLETED: "completed", L.NODE_RETRYING: "retrying",
                   L.NODE_VISITED: "completed"}.get(
            rtype, "cancelled" if error.get("type") == "cancelled" else "failed")
        if rec.get("caught"):
            outcome = "caught"
        self.attempts.labels(workflow, node, outcome).inc()
        if rec.get("duration_ms") is not None:
            self.duration.labels(workflow, node).observe(float(rec["duration_ms"]) / 1000)
        if rec.get("tokens"):
            self.tokens.labels(workflow, node).inc(int(rec["tokens"]))

    async def refresh(self, store: Store) -> None:
        """Read the store's runs into the gauges (call before each scrape)."""
        counts: Counter[tuple[str, str]] = Counter()
        pending: Counter[str] = Counter()
        oldest: dict[str, float] = {}
        now = time.time()
        for row in await store.list_runs(limit=ALL_RUNS):
            status = row.summary.status
            counts[(row.workflow, status)] += 1
            if status == "WAITING_APPROVAL":
                pending[row.workflow] += 1
                since = (row.summary.waiting or {}).get("requested_at") or row.summary.updated_at
                oldest[row.workflow] = max(oldest.get(row.workflow, 0.0), now - float(since))
        self.runs.clear()
        for (workflow, status), n in counts.items():
            self.runs.labels(workflow, status).set(n)
        self.pending.clear()
        self.oldest.clear()
        for workflow in {w for w, _ in counts}:
            self.pending.labels(workflow).set(pending[workflow])
            if workflow in oldest:
                self.oldest.labels(workflow).set(round(oldest[workflow], 3))

    def text(self) -> bytes:
        """The registry in Prometheus's text format."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

__all__ = ["BUCKETS", "CONTENT_TYPE", "Metrics"]
