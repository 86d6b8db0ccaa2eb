"""The bundled examples, walked branch by branch.

Every test asserts on the run's trace -- which nodes started, which edges were taken
or skipped, with what value and what they read -- not only on the final state:
triage (resolved / fixed on attempt 2 / exhausted after 3 retries), incident (each
row of the router policy table, reject, the confidence knob, the guarded fix) and
audit (LOW and HIGH risk with approve / reject / modify, the bounded review loop,
the hybrid retrieval). Then `validate` and `graph` on each, and examples/demo.sh.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import interlock
from interlock.cli import cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CHECKS = {"kafka", "kubernetes", "observability", "elasticsearch", "docker"}


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # call targets (examples.triage.nodes:...) resolve from the working directory
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples run offline: opening a network connection fails the test (or the run)."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"an example tried to use the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/runs.db"


def load(name: str) -> interlock.Workflow:
    return interlock.load(EXAMPLES / name / "workflow.yaml")


def data(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EXAMPLES / path).read_text())
    return loaded


def trace(run_id: str, store: str) -> list[dict[str, Any]]:
    return asyncio.run(interlock.trace(run_id, store=store))


def visits(records: list[dict[str, Any]]) -> list[str]:
    """Nodes in the order their visits started (a confirmed node's visit counts once)."""
    seen: list[tuple[str, int]] = []
    for r in records:
        if r["type"] == "node.started" and (r["node"], r["visit"]) not in seen:
            seen.append((r["node"], r["visit"]))
    return [node for node, _ in seen]


def decisions(records: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The edge decisions out of ``source``, in order: taken?, target(s), expr, value, reads."""
    return [{"taken": r["type"] == "edge.taken", "to": r.get("to"), "expr": r.get("expr"),
             "value": r.get("value"), "reads": r.get("reads"),
             **({"reason": r["reason"]} if "reason" in r else {})}
            for r in records if r["type"] in ("edge.taken", "edge.skipped")
            and r.get("from") == source]


def types(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["type"] for r in records)


# ---- triage ----------------------------------------------------------------------------

def test_triage_all_green_is_resolved_without_remediation(store: str) -> None:
    result = load("triage").run_sync({"scenario": "all-green"}, store=store)
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    seq = visits(records)
    assert set(seq[:5]) == CHECKS  # the fan-out
    assert seq[5:] == ["summarizer", "journal", "final_report"]
    [join] = [r for r in records if r["type"] == "edge.taken" and r.get("to") == ["summarizer"]]
    assert join["seq"] > max(r["seq"] for r in records
                             if r["type"] == "node.completed" and r["node"] in CHECKS)
    assert decisions(records, "journal") == [
        {"taken": True, "to": ["final_report"], "expr": 'severity == "healthy"', "value": True,
         "reads": {"severity": "healthy"}},
        {"taken": False, "to": None, "expr": "otherwise", "value": False, "reads": None}]
    assert result.state["report"] == "severity: healthy"


def test_triage_disk_full_is_fixed_on_attempt_2(store: str) -> None:
    result = load("triage").run_sync({"scenario": "disk-full"}, store=store)
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    assert visits(records)[5:] == ["summarizer", "journal", "remediate", "verify",
                                   "remediate", "verify", "summary", "final_report"]
    journal = decisions(records, "journal")
    assert [(d["taken"], d["value"]) for d in journal] == [(False, False), (True, True)]
    assert journal[0]["reads"] == {"severity": "critical"}
    verify = decisions(records, "verify")
    assert [(d["taken"], d["to"], d["reads"]) for d in verify] == [
        (True, ["remediate"], {"verified": False}), (False, None, None),
        (False, None, {"verified": True}), (True, ["summary"], None)]
    assert types(records)["effect.recorded"] == 2  # paged once per remediation visit
    assert result.state["remediation"] == "fixed after 2 attempt(s)"


def test_triage_gives_up_after_3_retries(store: str) -> None:
    result = load("triage").run_sync({"scenario": "broker-down"}, store=store,
                                     config={"fix_after_attempts": 9})
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    retry = [d for d in decisions(records, "verify") if d["expr"] == "!verified"]
    assert [d["taken"] for d in retry] == [True, True, True, False]  # max: 3, then false
    assert all(d["reads"] == {"verified": False} and d["value"] is True for d in retry)
    assert retry[-1]["reason"] == "max 3 reached"
    assert Counter(visits(records))["remediate"] == 4
    assert visits(records)[-2:] == ["summary", "final_report"]
    assert result.state["remediation"] == "gave up after 4 attempt(s)"


# ---- incident --------------------------------------------------------------------------

POLICY_EDGE = ("approval.decision == \"approved\" && rca != null && "
               "rca.confidence >= config.code_fix_min_confidence && rca.severity != \"low\"")


def _incident_prefix_ok(seq: list[str]) -> bool:
    return (seq[0] == "intake" and set(seq[1:3]) == {"retrieval", "rag"}
            and seq[3:6] == ["rca", "recommend", "approval"])


def _incident(store: str, event: str, tmp_path: Path, **config: Any) -> tuple[
        interlock.Workflow, interlock.RunResult]:
    wf = load("incident")
    first = wf.run_sync(data(f"incident/events/{event}.json"), store=store,
                        config={"fix_dir": str(tmp_path / "fixes"), **config})
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["node"] == "approval"
    assert set(first.waiting["show"]) == {"incident", "rca", "recommended_action"}
    return wf, first


def test_incident_fan_out_and_join(store: str, tmp_path: Path) -> None:
    _, first = _incident(store, "checkout-500", tmp_path)
    records = trace(first.run_id, store)
    assert _incident_prefix_ok(visits(records))
    [fan_out] = decisions(records, "intake")
    assert fan_out["to"] == ["retrieval", "rag"]
    [join] = [r for r in records if r["type"] == "edge.taken" and r.get("to") == ["rca"]]
    done = {r["node"]: r["seq"] for r in records if r["type"] == "node.completed"}
    assert join["seq"] > done["retrieval"] and join["seq"] > done["rag"]
    # both branches appended to the shared field (its reducer), in whichever order
    events = [e.split(":")[0] for e in first.state["events"]]
    assert events[0] == "intake" and set(events[1:3]) == {"retrieval", "rag"}
    assert events[3:] == ["rca"]


@pytest.mark.parametrize(("event", "rca_row"), [
    ("checkout-500", {"severity": "high", "confidence": 0.85}),  # otherwise: eligible
    ("payment-timeout", {"severity": "high", "confidence": 0.45}),  # confidence < 0.5
    ("logo-404", {"severity": "low", "confidence": 0.95}),  # severity == low
    ("printer-crash", None),  # no RCA
])
def test_incident_policy_table(store: str, tmp_path: Path, event: str,
                               rca_row: dict[str, Any] | None) -> None:
    wf, first = _incident(store, event, tmp_path)
    if rca_row is None:
        assert first.state["rca"] is None
    else:
        assert {k: first.state["rca"][k] for k in rca_row} == rca_row
    result = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    records = trace(first.run_id, store)
    policy, otherwise = decisions(records, "approval")
    assert policy["expr"] == POLICY_EDGE
    reads = policy["reads"]
    assert reads["approval.decision"] == "approved"
    assert reads["config.code_fix_min_confidence"] == 0.5
    eligible = event == "checkout-500"
    assert (policy["taken"], policy["value"]) == (eligible, eligible)
    assert (otherwise["taken"], otherwise["expr"]) == (not eligible, "otherwise")
    if rca_row is None:
        assert reads["rca"] is None
    else:
        assert reads["rca.confidence"] == rca_row["confidence"]
        assert reads["rca.severity"] == rca_row["severity"]
    if not eligible:
        assert result.status == "COMPLETED"
        assert "code_fix" not in visits(records)
        assert not (tmp_path / "fixes").exists()
        return
    # eligible: the guarded node asks before its body runs
    assert result.status == "WAITING_APPROVAL"
    assert result.waiting["node"] == "code_fix"
    assert types(records)["effect.recorded"] == 0
    done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED"
    records = trace(first.run_id, store)
    assert visits(records)[6:] == ["code_fix"]
    assert [r["node"] for r in records if r["type"] == "approval.decided"] == [
        "approval", "code_fix"]
    assert types(records)["effect.recorded"] == 1  # the PR, journaled with ctx.once
    patch = Path(done.state["code_fix"]["path"])
    assert patch.parent == tmp_path / "fixes"
    assert "tax_rate or Decimal" in patch.read_text()
    assert list((tmp_path / "fixes").iterdir()) == [patch]


def test_incident_rejected_ends_rejected(store: str, tmp_path: Path) -> None:
    wf, first = _incident(store, "checkout-500", tmp_path)
    result = wf.resume_sync(first.run_id, interlock.reject(by="bob", comment="not this"),
                            store=store)
    assert result.status == "REJECTED"
    records = trace(first.run_id, store)
    # after a rejection only edges reading approval.decision are followed: the otherwise
    # edge to END does not apply, so the run ends REJECTED
    policy, otherwise = decisions(records, "approval")
    assert (policy["taken"], policy["value"]) == (False, False)
    assert (otherwise["taken"], otherwise.get("reason")) == (False, "rejected")
    assert policy["reads"]["approval.decision"] == "rejected"
    assert "code_fix" not in visits(records)
    assert types(records)["run.rejected"] == 1


def test_incident_confidence_threshold_is_a_config_knob(store: str, tmp_path: Path) -> None:
    wf, first = _incident(store, "checkout-500", tmp_path, code_fix_min_confidence=0.9)
    result = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert result.status == "COMPLETED"
    records = trace(first.run_id, store)
    policy, otherwise = decisions(records, "approval")
    assert not policy["taken"] and otherwise["taken"]
    assert policy["reads"]["config.code_fix_min_confidence"] == 0.9
    assert policy["reads"]["rca.confidence"] == 0.85
    # ... and the other way: a lower bar lets the 0.45 timeout RCA through
    wf, first = _incident(store, "payment-timeout", tmp_path, code_fix_min_confidence=0.4)
    waiting = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert waiting.waiting["node"] == "code_fix"


def test_incident_fix_is_not_repeated_when_code_fix_runs_again(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.incident import nodes

    opened: list[str] = []
    bodies: list[str] = []
    real_open, real_fix = nodes._open_pull_request, nodes.code_fix

    def counting_open(fix_dir: str, name: str, body: str) -> dict[str, str]:
        opened.append(name)
        return real_open(fix_dir, name, body)

    async def crash_once_after_the_pr(state: dict[str, Any], ctx: interlock.Context) -> Any:
        bodies.append(ctx.node)
        update = await real_fix(state, ctx)
        if len(bodies) == 1:
            raise RuntimeError("process died after opening the PR")
        return update

    monkeypatch.setattr(nodes, "_open_pull_request", counting_open)
    monkeypatch.setattr(nodes, "code_fix", crash_once_after_the_pr)
    wf, first = _incident(store, "checkout-500", tmp_path)
    wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    failed = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert failed.status == "FAILED" and opened == [f"{first.run_id}-evt-1042"]
    # a resume re-runs the failed node (without asking again); ctx.once returns the
    # recorded PR instead of opening a second one
    done = wf.resume_sync(first.run_id, store=store)
    assert done.status == "COMPLETED"
    assert len(bodies) == 2 and len(opened) == 1
    records = trace(first.run_id, store)
    assert types(records)["effect.recorded"] == 1
    assert [r["node"] for r in records if r["type"] == "node.failed"] == ["code_fix"]
    assert [r["node"] for r in records if r["type"] == "approval.decided"] == [
        "approval", "code_fix"]
    assert len(list((tmp_path / "fixes").iterdir())) == 1


def test_incident_guarded_fix_rejected_never_runs(store: str, tmp_path: Path) -> None:
    wf, first = _incident(store, "checkout-500", tmp_path)
    wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    result = wf.resume_sync(first.run_id, interlock.reject(by="carol"), store=store)
    assert result.status == "REJECTED"
    records = trace(first.run_id, store)
    assert types(records)["effect.recorded"] == 0
    assert not any(r["type"] == "node.completed" and r["node"] == "code_fix" for r in records)
    assert not (tmp_path / "fixes").exists()


# ---- audit -----------------------------------------------------------------------------

AUDIT_HEAD = ["planner", "knowledge", "risk"]


def _audit(store: str, engagement: str, **config: Any) -> tuple[
        interlock.Workflow, interlock.RunResult]:
    wf = load("audit")
    return wf, wf.run_sync(data(f"audit/engagements/{engagement}.json"), store=store,
                           config=config or None)


def _switch(records: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [(d["value"], d["to"]) for d in decisions(records, "risk")]


def _check_grounded(state: dict[str, Any]) -> None:
    retrieved = {k["area"]: [h["doc"] for h in k["hits"]] for k in state["knowledge"]}
    for item in state["evidence"]["items"]:
        assert item["citations"], item
        assert set(item["citations"]) <= set(retrieved[item["area"]])


def test_audit_low_risk_skips_the_gate(store: str) -> None:
    _, result = _audit(store, "contoso")
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "evidence", "reviewer", "evidence", "reviewer",
                               "report"]
    assert _switch(records) == [("LOW", ["evidence"])]
    assert decisions(records, "risk")[0]["reads"] == {"risk.level": "LOW"}
    assert "approval" not in result.state
    # hybrid retrieval: every area got fused hits, each from the keyword side, the vector
    # side or both; the evidence cites only what was retrieved
    for area in result.state["knowledge"]:
        assert len(area["hits"]) == 3
        for hit in area["hits"]:
            assert hit["bm25_rank"] is not None or hit["vector_rank"] is not None
    _check_grounded(result.state)
    assert result.state["knowledge"][0]["hits"][0]["doc"] == "IFRS-15"  # revenue
    assert "review: accepted in round 2" in result.state["report"]


def test_audit_high_risk_waits_then_approve(store: str) -> None:
    wf, first = _audit(store, "northwind")
    assert first.status == "WAITING_APPROVAL"
    assert first.waiting["node"] == "approval"
    assert first.waiting["decisions"] == ["approve", "reject", "modify"]
    assert first.waiting["show"]["risk"]["level"] == "HIGH"
    result = wf.resume_sync(first.run_id, interlock.approve(by="partner"), store=store)
    assert result.status == "COMPLETED"
    records = trace(first.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "approval", "evidence", "reviewer", "evidence",
                               "reviewer", "report"]
    assert _switch(records) == [("HIGH", ["approval"])]
    assert [(d["taken"], d["to"], d["reads"]) for d in decisions(records, "approval")] == [
        (True, ["evidence"], {"approval.decision": "approved"}),
        (False, None, {"approval.decision": "approved"})]
    # the retrieved prior finding for this client is one of the risk factors
    assert any("F-2024-07" in f for f in result.state["risk"]["factors"])
    _check_grounded(result.state)
    assert "approval: approved by partner" in result.state["report"]


def test_audit_high_risk_reject_routes_to_the_handler(store: str) -> None:
    wf, first = _audit(store, "northwind")
    result = wf.resume_sync(first.run_id, interlock.reject(by="partner", comment="decline"),
                            store=store)
    assert result.status == "COMPLETED"
    records = trace(first.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "approval", "escalate"]
    assert [(d["taken"], d["to"]) for d in decisions(records, "approval")] == [
        (False, None), (True, ["escalate"])]
    assert decisions(records, "approval")[1]["reads"] == {"approval.decision": "rejected"}
    assert result.state["escalation"]["rejected_by"] == "partner"
    assert "evidence" not in result.state


def test_audit_high_risk_modify_reenters_at_risk(store: str) -> None:
    wf, first = _audit(store, "northwind")
    patch = {"corrections": {"new_erp_system": False, "prior_findings": 0}}
    result = wf.resume_sync(first.run_id, interlock.modify(patch, by="partner"), store=store)
    assert result.status == "COMPLETED"
    records = trace(first.run_id, store)
    # re-entry at risk: planner and knowledge are not run again
    assert visits(records) == [*AUDIT_HEAD, "approval", "risk", "evidence", "reviewer",
                               "evidence", "reviewer", "report"]
    assert _switch(records) == [("HIGH", ["approval"]), ("MEDIUM", ["evidence"])]
    assert decisions(records, "approval") == []  # a modify re-enters; it routes nothing
    [patched] = [r for r in records if r["type"] == "state.patched"]
    assert patched["patch"] == patch
    assert result.state["risk"]["level"] == "MEDIUM"
    assert result.state["approval"]["decision"] == "modified"


def test_audit_modify_still_high_pauses_again(store: str) -> None:
    wf, first = _audit(store, "northwind")
    again = wf.resume_sync(first.run_id, interlock.modify(
        {"corrections": {"new_erp_system": False}}, by="partner"), store=store)
    assert again.status == "WAITING_APPROVAL"
    assert again.waiting["node"] == "approval"
    records = trace(first.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "approval", "risk", "approval"]
    assert _switch(records) == [("HIGH", ["approval"]), ("HIGH", ["approval"])]


def test_audit_reviewer_accepts_first_time(store: str) -> None:
    _, result = _audit(store, "contoso", min_citations=1)
    records = trace(result.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "evidence", "reviewer", "report"]
    assert [(d["taken"], d["value"]) for d in decisions(records, "reviewer")] == [
        (False, False), (True, True)]
    assert "review: accepted in round 1" in result.state["report"]


def test_audit_reviewer_sends_back_at_most_twice(store: str) -> None:
    _, result = _audit(store, "contoso", min_citations=4)  # more than top_k: never enough
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    back = [d for d in decisions(records, "reviewer") if d["expr"] == 'review.verdict == "revise"']
    assert [d["taken"] for d in back] == [True, True, False]  # max: 2, then false
    assert all(d["reads"] == {"review.verdict": "revise"} and d["value"] is True for d in back)
    assert back[-1]["reason"] == "max 2 reached"
    assert Counter(visits(records))["evidence"] == 3
    assert visits(records)[-1] == "report"
    assert result.state["review"]["verdict"] == "revise"
    assert "NOT accepted after 3 round(s)" in result.state["report"]


def test_audit_hybrid_search_fuses_keyword_and_vector_rankings() -> None:
    from examples.audit import retrieval

    index = retrieval.index()
    # the model ships inside an installed package, not in a download cache
    assert "site-packages" in str(retrieval.embedding_model_dir())
    query = "who is allowed to log in to the accounting software"
    keyword = index.keyword_ranking(query, 5)
    vector = index.vector_ranking(query, 5)
    assert keyword[0] != "CTL-UAR" and "CTL-UAR" in keyword  # few shared words
    assert vector[0] == "CTL-UAR"  # close in meaning
    hits = index.search(query, top_k=3, candidates=5)
    assert hits[0].doc == "CTL-UAR"
    expected = retrieval.rrf([keyword, vector])
    assert [h.rrf for h in hits] == sorted((expected[h.doc] for h in hits), reverse=True)
    assert hits[0].rrf == pytest.approx(1 / (60 + hits[0].bm25_rank) + 1 / (60 + 1))


# ---- validate, graph, demo ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["triage", "incident", "audit"])
def test_examples_validate_without_warnings_and_render(name: str) -> None:
    path = f"examples/{name}/workflow.yaml"
    checked = CliRunner().invoke(cli, ["validate", path])
    assert checked.exit_code == 0, checked.output
    assert "warning" not in checked.output.lower() and checked.output.startswith("ok:")
    nodes = load(name).compile().spec.nodes
    for fmt in ("mermaid", "dot"):
        drawn = CliRunner().invoke(cli, ["graph", path, "--format", fmt])
        assert drawn.exit_code == 0, drawn.output
        assert all(node in drawn.output for node in nodes)


def test_demo_script_runs_end_to_end(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", ".interlock"))
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_STORE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "examples/demo.sh"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout and "chain and fold verified" in done.stdout
    assert (tmp_path / ".interlock" / "runs.db").exists()
    [patch] = (tmp_path / ".interlock" / "fixes").iterdir()
    assert patch.name.startswith("demo-") and "tax_rate" in patch.read_text()
