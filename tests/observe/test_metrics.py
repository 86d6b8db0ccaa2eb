"""Prometheus metrics (SPEC §10) after a known workload, read back from the exposition
text with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the server extra is not installed")
from prometheus_client.parser import text_string_to_metric_families

import interlock
from interlock import START, Workflow
from interlock.support import Metrics


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_after_a_known_workload() -> None:
    tries = {"n": 0}

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        ctx.record_tokens(7)
        tries["n"] += 1
        if tries["n"] == 1:
            raise ConnectionError("again")
        return {"ok": True}

    done = Workflow("paid").node("flaky", flaky, retry={"attempts": 2})
    done.edge(START, "flaky")
    gated = Workflow("gated").node("a", lambda s: {"a": 1}).approval("gate", show=["a"])
    gated.edge(START, "a").edge("a", "gate")
    metrics = Metrics()

    async def main() -> bytes:
        async with interlock.open_store("memory://") as store:
            assert (await done.run(store=store, listener=metrics.observe)).ok
            for _ in range(2):
                waiting = await gated.run(store=store, listener=metrics.observe)
                assert waiting.status == "WAITING_APPROVAL"
            await metrics.refresh(store)
            return metrics.text()

    got = samples(asyncio.run(main()))
    assert got[("interlock_runs", (("status", "COMPLETED"), ("workflow", "paid")))] == 1
    assert got[("interlock_runs", (("status", "WAITING_APPROVAL"), ("workflow", "gated")))] == 2
    assert got[("interlock_approvals_pending", (("workflow", "gated"),))] == 2
    assert got[("interlock_approvals_pending", (("workflow", "paid"),))] == 0
    assert got[("interlock_approval_oldest_age_seconds", (("workflow", "gated"),))] >= 0
    flaky_labels = (("node", "flaky"), ("workflow", "paid"))
    assert got[("interlock_node_attempts_total",
                (("node", "flaky"), ("outcome", "retrying"), ("workflow", "paid")))] == 1
    assert got[("interlock_node_attempts_total",
                (("node", "flaky"), ("outcome", "completed"), ("workflow", "paid")))] == 1
    assert got[("interlock_tokens_total", flaky_labels)] == 14
    assert got[("interlock_node_duration_seconds_count", flaky_labels)] == 2
    assert got[("interlock_node_duration_seconds_count",
                (("node", "a"), ("workflow", "gated")))] == 2
