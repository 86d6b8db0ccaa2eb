"""Deterministic, offline stand-ins for the triage agents (rule-based, no LLM).

Each health check reads the bundled scenario named by the run's input; the
summarizer maps findings to a severity; the remediation "actor" succeeds on
attempt ``config.fix_after_attempts`` (set it above 4 to watch the loop give up).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import interlock

SCENARIOS = json.loads((Path(__file__).parent / "scenarios.json").read_text())
CRITICAL_SYSTEMS = {"kafka", "kubernetes"}


def _problem(state: dict[str, Any], system: str) -> str | None:
    scenario = SCENARIOS.get(state["scenario"])
    if scenario is None:
        raise ValueError(f"unknown scenario {state['scenario']!r}; "
                         f"known: {', '.join(sorted(SCENARIOS))}")
    return scenario.get(system)


async def _check(state: dict[str, Any], system: str, latency: float) -> dict[str, Any]:
    await asyncio.sleep(latency)  # stands for the real probe's network round trip
    problem = _problem(state, system)
    return {"checks": {system: {"ok": problem is None, "detail": problem or "healthy"}}}


LATENCY = {"kafka": 0.30, "kubernetes": 0.20, "observability": 0.25, "elasticsearch": 0.15,
           "docker": 0.10}  # seconds: stands for each probe's network round trip


async def check(state: dict[str, Any]) -> dict[str, Any]:
    """The health check of one service (``state["service"]``: an item of the map)."""
    service = state["service"]
    return await _check(state, service, LATENCY.get(service, 0.1))


def summarize(state: dict[str, Any]) -> dict[str, Any]:
    failing = {k: v["detail"] for k, v in state["checks"].items() if not v["ok"]}
    if not failing:
        severity = "healthy"
    elif CRITICAL_SYSTEMS & failing.keys():
        severity = "critical" if len(failing) > 1 else "degraded"
    else:
        severity = "degraded"
    return {"severity": severity, "findings": failing}


def write_journal(state: dict[str, Any]) -> dict[str, Any]:
    return {"journal": f"triage: {state['severity']} ({len(state['findings'])} finding(s))"}


async def remediate(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    attempt = state.get("attempts", 0) + 1
    # a journaled side effect: a resumed or retried visit does not page twice
    ticket = await ctx.once("page-oncall", _page_oncall, ctx.idempotency_key)
    return {"attempts": 1, "journal": f"remediation attempt {attempt} ({ticket})"}


async def _page_oncall(key: str) -> str:
    return "ticket-" + hashlib.sha256(key.encode()).hexdigest()[:6]


def verify(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    fixed = state["attempts"] >= int(ctx.config["fix_after_attempts"])
    return {"verified": fixed,
            "journal": f"verify after attempt {state['attempts']}: "
                       f"{'fixed' if fixed else 'still failing'}"}


def remediation_summary(state: dict[str, Any]) -> dict[str, Any]:
    outcome = "fixed" if state["verified"] else "gave up"
    return {"remediation": f"{outcome} after {state['attempts']} attempt(s)"}


def final_report(state: dict[str, Any]) -> dict[str, Any]:
    lines = [f"severity: {state['severity']}"]
    for system, detail in sorted(state.get("findings", {}).items()):
        lines.append(f"- {system}: {detail}")
    if "remediation" in state:
        lines.append(f"remediation: {state['remediation']}")
    return {"report": "\n".join(lines)}


def journal_assessment(state: dict[str, Any]) -> dict[str, Any]:
    """``journal`` in the agent variants (workflow.agents.yaml, workflow.openai.yaml).

    An ``agent:`` node writes its whole structured reply to ONE state field (its
    ``output_key``), so the summarizer agent writes ``assessment: {severity,
    findings}``; this node lifts the two fields to the top level, where the rule-based
    ``summarize`` puts them, so the edges (``severity == "healthy"``) and every later
    node are the same as in workflow.yaml.
    """
    assessment = state["assessment"]
    lifted = {"severity": assessment["severity"], "findings": assessment["findings"]}
    return {**lifted, **write_journal(lifted)}
