"""The bundled examples, walked branch by branch.

Every test asserts on the run's trace -- which nodes started, which edges were taken
or skipped, with what value and what they read -- not only on the final state:
triage (resolved / fixed on attempt 2 / exhausted after 3 retries), incident (each
row of the router policy table, reject, the confidence knob, the guarded fix) and
audit (LOW and HIGH risk with approve / reject / modify, the bounded review loop,
the hybrid retrieval). Then `validate` and `graph` on each, and examples/demo.sh.
The incident's agent variants: workflow.agents.yaml (scripted replies, offline) walks
the same path as the rules, and workflow.openai.yaml runs through the OpenAI SDK against
a local OpenAI-compatible server (127.0.0.1 only).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_openai import FakeOpenAI

import interlock
from interlock.cli import cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CHECKS = {"kafka", "kubernetes", "observability", "elasticsearch", "docker"}
_CONNECT, _GETADDRINFO = socket.socket.connect, socket.getaddrinfo


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
def loopback(_offline: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections to 127.0.0.1 are allowed (a server the test starts); anything else fails."""
    def local(host: Any) -> bool:
        return host in ("127.0.0.1", b"127.0.0.1")

    def connect(sock: socket.socket, address: Any) -> Any:
        if not (isinstance(address, tuple) and local(address[0])):
            raise AssertionError(f"an example tried to use the network: {address!r}")
        return _CONNECT(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not local(host):
            raise AssertionError(f"an example tried to resolve {host!r}")
        return _GETADDRINFO(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/runs.db"


def load(name: str) -> interlock.Workflow:
    return interlock.load(EXAMPLES / name / "workflow.yaml")


def data(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EXAMPLES / path).read_text())
    return loaded


def trace(run_id: str, store: str) -> list[dict[str, Any]]:
    """The run's records as format 1 writes them: log format 2's ``implies`` written out
    after the record implying them (with its seq), ``node.visited`` as it is."""
    return [x for r in asyncio.run(interlock.trace(run_id, store=store))
            for x in (r, *r.get("implies", ()))]


def checked(records: list[dict[str, Any]]) -> set[str]:
    """The services the triage map checked: one item each, its update under ``checks``."""
    return {key for r in records if r["type"] == "node.completed" and r["node"] == "check"
            and "item" in r for key in r["update"]["checks"]}


def visits(records: list[dict[str, Any]]) -> list[str]:
    """Nodes in the order their visits started (a confirmed node's visit counts once)."""
    seen: list[tuple[str, int]] = []
    for r in records:
        if r["type"] in ("node.started", "node.visited") and (r["node"], r["visit"]) not in seen:
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
    assert seq[0] == "check" and checked(records) == CHECKS  # the map: a check per service
    assert seq[1:] == ["summarizer", "journal", "final_report"]
    [after] = [r for r in records if r["type"] == "edge.taken" and r.get("to") == ["summarizer"]]
    # (log format 2: implied by the mapped visit's completion, at its seq)
    assert after["seq"] >= max(r["seq"] for r in records
                               if r["type"] == "node.completed" and r["node"] == "check")
    assert decisions(records, "journal") == [
        {"taken": True, "to": ["final_report"], "expr": 'severity == "healthy"', "value": True,
         "reads": {"severity": "healthy"}},
        {"taken": False, "to": None, "expr": "otherwise", "value": False, "reads": None}]
    assert result.state["report"] == "severity: healthy"


def test_triage_disk_full_is_fixed_on_attempt_2(store: str) -> None:
    result = load("triage").run_sync({"scenario": "disk-full"}, store=store)
    assert result.status == "COMPLETED"
    records = trace(result.run_id, store)
    assert visits(records)[1:] == ["summarizer", "journal", "remediate", "verify",
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


# ---- incident with agents: scripted (offline) and a real OpenAI SDK call ------------------

AGENTS = EXAMPLES / "incident" / "workflow.agents.yaml"
OPENAI = EXAMPLES / "incident" / "workflow.openai.yaml"


def _walk_to_the_fix(wf: interlock.Workflow, store: str, tmp_path: Path,
                     **config: Any) -> tuple[interlock.RunResult, interlock.RunResult]:
    """checkout-500 through approve, approve (the guarded fix): (first stop, the end)."""
    first = wf.run_sync(data("incident/events/checkout-500.json"), store=store,
                        config={"fix_dir": str(tmp_path / "fixes"), **config})
    assert first.status == "WAITING_APPROVAL", first.error
    assert first.waiting["node"] == "approval"
    second = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert second.status == "WAITING_APPROVAL" and second.waiting["node"] == "code_fix"
    done = wf.resume_sync(first.run_id, interlock.approve(by="alice"), store=store)
    assert done.status == "COMPLETED", done.error
    return first, done


def _shape(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What must be the same whether rca/recommend are rules or agents."""
    seq = visits(records)
    routed = [{**d, "reads": {k: v for k, v in (d["reads"] or {}).items() if k != "rca"}}
              for d in decisions(records, "approval")]  # the rules' rca also names its rule
    return {"prefix_ok": _incident_prefix_ok(seq), "tail": seq[3:], "approval": routed,
            "decided": [r["node"] for r in records if r["type"] == "approval.decided"],
            "fix_effects": [r["key"] for r in records
                            if r["type"] == "effect.recorded" and r["node"] == "code_fix"]}


def test_incident_agents_scripted_walk_the_approve_path_like_the_rules(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # scripted: no key needed
    ruled_first, ruled = _walk_to_the_fix(load("incident"), store, tmp_path / "rules")
    first, done = _walk_to_the_fix(interlock.load(AGENTS), store, tmp_path / "agents")
    # the scripted replies reproduce the rule-based answers for this event
    assert first.state["rca"] == {k: v for k, v in ruled_first.state["rca"].items()
                                  if k != "rule"}
    assert first.state["recommended_action"] == ruled_first.state["recommended_action"]
    records = trace(first.run_id, store)
    shape = _shape(records)
    assert shape == _shape(trace(ruled_first.run_id, store))
    assert shape["tail"] == ["rca", "recommend", "approval", "code_fix"]
    # the policy edge routed on the agent's structured output
    policy = shape["approval"][0]
    assert policy["expr"] == POLICY_EDGE and policy["taken"]
    assert policy["reads"]["rca.confidence"] == 0.85
    assert policy["reads"]["rca.severity"] == "high"
    # ... and it was an agent: one model call per agent node, charged to the budget
    replies = [r for r in records if r["type"] == "agent.reply"]
    assert [r["node"] for r in replies] == ["rca", "recommend"]
    assert shape["fix_effects"] == ["open-pr"]
    assert done.tokens == 710 + 530 and ruled.tokens == 0
    assert (tmp_path / "agents" / "fixes").exists()
    [patch] = (tmp_path / "agents" / "fixes").iterdir()
    assert "tax_rate or Decimal" in patch.read_text()


MODEL_RCA = {"root_cause": "pricing.line_tax multiplies by a missing tax_rate",
             "severity": "high", "confidence": 0.72,
             "evidence": ["log: catalog item sku=GY-500 (Greek Yogurt 500g) has tax_rate=None"]}
MODEL_FIX = {"title": "Treat a missing tax_rate as 0",
             "steps": ["apply the patch", "deploy"],
             "patch": "--- a/backend/app/pricing.py\n+++ b/backend/app/pricing.py\n"
                      "-    x = tax_rate\n+    x = tax_rate or 0\n"}


@pytest.fixture
def model_server(loopback: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    def answer(body: dict[str, Any]) -> Any:
        name = body["response_format"]["json_schema"]["name"]
        return {"rca": MODEL_RCA, "recommended_action": MODEL_FIX}[name]

    fake = FakeOpenAI(answer)
    # the documented switch: the openai file, and the two OpenAI SDK settings
    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    try:
        yield fake
    finally:
        fake.close()


def test_incident_agents_run_against_an_openai_compatible_server(
        store: str, tmp_path: Path, model_server: FakeOpenAI) -> None:
    first, done = _walk_to_the_fix(interlock.load(OPENAI), store, tmp_path)
    assert first.state["rca"] == MODEL_RCA
    assert first.state["recommended_action"] == MODEL_FIX
    records = trace(first.run_id, store)
    assert visits(records)[3:] == ["rca", "recommend", "approval", "code_fix"]
    policy = decisions(records, "approval")[0]
    assert policy["taken"] and policy["reads"]["rca.confidence"] == 0.72  # the model's
    assert done.tokens == 240
    # two real Chat Completions calls through the OpenAI SDK, with the schema attached
    reqs = model_server.requests
    assert [r["path"] for r in reqs] == ["/v1/chat/completions"] * 2
    assert all(r["auth"] == "Bearer sk-local" for r in reqs)
    assert [r["body"]["model"] for r in reqs] == ["gpt-4o-mini"] * 2
    assert [r["body"]["response_format"]["json_schema"]["name"] for r in reqs] == [
        "rca", "recommended_action"]
    rca_prompt = reqs[0]["body"]["messages"][-1]["content"]
    assert "evt-1042" in rca_prompt and "tax_rate=None" in rca_prompt and "INC-311" in rca_prompt
    assert "0.72" in reqs[1]["body"]["messages"][-1]["content"]  # recommend reads the rca
    [patch] = (tmp_path / "fixes").iterdir()
    assert "tax_rate or 0" in patch.read_text()


def test_incident_agent_files_differ_only_in_the_provider() -> None:
    from ruamel.yaml import YAML

    def plain(path: Path) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))
        for key in ("workflow", "description"):
            doc.pop(key)
        for name in ("rca", "recommend"):
            agent = doc["nodes"][name]["agent"]
            for key in ("provider", "model", "temperature", "replies"):
                agent.pop(key, None)
        return doc

    assert plain(AGENTS) == plain(OPENAI)
    rules = YAML(typ="safe").load((EXAMPLES / "incident" / "workflow.yaml").read_text())
    assert plain(AGENTS)["edges"] == rules["edges"]


# ---- audit -----------------------------------------------------------------------------


@pytest.fixture
def examples_extra() -> None:
    """Skip (fail under CI) where the audit example's retrieval cannot run: it needs
    the [examples] extra."""
    import importlib.util

    missing = [m for m in ("bm25s", "Stemmer", "model2vec")
               if importlib.util.find_spec(m) is None]
    if not missing:
        return
    why = (f"the audit example needs pip install -e '.[examples]' ({', '.join(missing)} "
           "missing)")
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{why}; under CI the examples must be tested", pytrace=False)
    pytest.skip(why)


needs_examples = pytest.mark.usefixtures("examples_extra")

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


@needs_examples
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


@needs_examples
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


@needs_examples
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


@needs_examples
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


@needs_examples
def test_audit_modify_still_high_pauses_again(store: str) -> None:
    wf, first = _audit(store, "northwind")
    again = wf.resume_sync(first.run_id, interlock.modify(
        {"corrections": {"new_erp_system": False}}, by="partner"), store=store)
    assert again.status == "WAITING_APPROVAL"
    assert again.waiting["node"] == "approval"
    records = trace(first.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "approval", "risk", "approval"]
    assert _switch(records) == [("HIGH", ["approval"]), ("HIGH", ["approval"])]


@needs_examples
def test_audit_reviewer_accepts_first_time(store: str) -> None:
    _, result = _audit(store, "contoso", min_citations=1)
    records = trace(result.run_id, store)
    assert visits(records) == [*AUDIT_HEAD, "evidence", "reviewer", "report"]
    assert [(d["taken"], d["value"]) for d in decisions(records, "reviewer")] == [
        (False, False), (True, True)]
    assert "review: accepted in round 1" in result.state["report"]


@needs_examples
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


@needs_examples
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

@pytest.mark.parametrize("path", [
    "examples/triage/workflow.yaml", "examples/incident/workflow.yaml",
    "examples/incident/workflow.agents.yaml", "examples/incident/workflow.openai.yaml",
    "examples/audit/workflow.yaml", "examples/jokes/workflow.yaml"])
def test_examples_validate_without_warnings_and_render(path: str) -> None:
    # (with a key: an openai variant without one is warned about, tests/cli/test_missing_api_key.py)
    checked = CliRunner(env={"OPENAI_API_KEY": "sk-test"}).invoke(cli, ["validate", path])
    assert checked.exit_code == 0, checked.output
    assert "warning" not in checked.output.lower() and checked.output.startswith("ok:")
    nodes = interlock.load(REPO / path).compile().spec.nodes
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


# ---- triage and audit: agent variants ----------------------------------------------------
# As for the incident: workflow.agents.yaml (scripted replies, offline) walks the same
# path as the rules, workflow.openai.yaml runs through the OpenAI SDK against a local
# OpenAI-compatible server (127.0.0.1 only), and the two files differ only in the provider.

TRIAGE_AGENTS = EXAMPLES / "triage" / "workflow.agents.yaml"
TRIAGE_OPENAI = EXAMPLES / "triage" / "workflow.openai.yaml"
AUDIT_AGENTS = EXAMPLES / "audit" / "workflow.agents.yaml"
AUDIT_OPENAI = EXAMPLES / "audit" / "workflow.openai.yaml"


@pytest.fixture
def serve(loopback: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        Callable[[Callable[[dict[str, Any]], Any]], FakeOpenAI]]:
    """Start a FakeOpenAI answering with ``answer(body)``, pointed at by the SDK's variables."""
    started: list[FakeOpenAI] = []

    def start(answer: Callable[[dict[str, Any]], Any]) -> FakeOpenAI:
        fake = FakeOpenAI(answer)
        started.append(fake)
        monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        return fake

    try:
        yield start
    finally:
        for fake in started:
            fake.close()


def _yaml(path: Path) -> dict[str, Any]:
    from ruamel.yaml import YAML

    loaded: dict[str, Any] = json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))
    return loaded


def _without_provider(path: Path, agent_nodes: list[str]) -> dict[str, Any]:
    doc = _yaml(path)
    for key in ("workflow", "description"):
        doc.pop(key)
    for name in agent_nodes:
        for key in ("provider", "model", "temperature", "replies"):
            doc["nodes"][name]["agent"].pop(key, None)
    return doc


def _agent_replies(records: list[dict[str, Any]]) -> list[str]:
    return [r["node"] for r in records if r["type"] == "agent.reply"]


def _triage_shape(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What must be the same whether the summarizer is a rule or an agent."""
    seq = visits(records)
    return {"checks": checked(records), "tail": seq[1:],
            "journal": decisions(records, "journal"), "verify": decisions(records, "verify"),
            "effects": types(records)["effect.recorded"] - len(_agent_replies(records))}


def test_triage_agents_scripted_walk_the_remediation_loop_like_the_rules(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # scripted: no key needed
    ruled = load("triage").run_sync({"scenario": "disk-full"}, store=store)
    agents = interlock.load(TRIAGE_AGENTS).run_sync({"scenario": "disk-full"}, store=store)
    assert agents.status == ruled.status == "COMPLETED", agents.error
    # the agent's structured output lands where the rules put it
    for key in ("severity", "findings", "remediation", "report"):
        assert agents.state[key] == ruled.state[key], key
    def unticketed(journal: list[str]) -> list[str]:  # a page's ticket names the run
        return [line.split(" (ticket-")[0] for line in journal]
    assert unticketed(agents.state["journal"]) == unticketed(ruled.state["journal"])
    assert agents.state["journal"][0] == "triage: critical (2 finding(s))"
    assert agents.state["assessment"] == {"severity": "critical",
                                          "findings": ruled.state["findings"]}
    records = trace(agents.run_id, store)
    shape = _triage_shape(records)
    assert shape == _triage_shape(trace(ruled.run_id, store))
    assert shape["checks"] == CHECKS
    assert shape["tail"] == ["summarizer", "journal", "remediate", "verify", "remediate",
                             "verify", "summary", "final_report"]
    # the severity edge routed on the agent's answer
    assert shape["journal"][0]["reads"] == {"severity": "critical"}
    assert not shape["journal"][0]["taken"] and shape["journal"][1]["taken"]
    # ... and it was an agent: one model call, charged to the budget
    assert _agent_replies(records) == ["summarizer"]
    [request] = [r for r in records if r["type"] == "agent.request"]
    assert "disk usage 97%" in request["prompt"]
    assert agents.tokens == 425 and ruled.tokens == 0


def test_triage_agents_run_against_an_openai_compatible_server(
        store: str, serve: Callable[..., FakeOpenAI]) -> None:
    healthy = {"severity": "healthy", "findings": {}}
    server = serve(lambda body: healthy)
    result = interlock.load(TRIAGE_OPENAI).run_sync({"scenario": "all-green"}, store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state["assessment"] == healthy
    assert result.state["severity"] == "healthy" and result.state["findings"] == {}
    records = trace(result.run_id, store)
    assert visits(records)[1:] == ["summarizer", "journal", "final_report"]
    assert decisions(records, "journal")[0] == {
        "taken": True, "to": ["final_report"], "expr": 'severity == "healthy"', "value": True,
        "reads": {"severity": "healthy"}}
    assert result.state["report"] == "severity: healthy"
    assert result.tokens == 120
    # one real Chat Completions call through the OpenAI SDK, with the schema attached
    [req] = server.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-local"
    assert req["body"]["model"] == "gpt-4o-mini" and req["body"]["temperature"] == 0
    schema = req["body"]["response_format"]["json_schema"]
    assert schema["name"] == "assessment"
    assert schema["schema"]["properties"]["severity"]["enum"] == [
        "healthy", "degraded", "critical"]
    prompt = req["body"]["messages"][-1]["content"]
    assert all(system in prompt for system in CHECKS)


def test_triage_agent_files_differ_only_in_the_provider() -> None:
    agents = _without_provider(TRIAGE_AGENTS, ["summarizer"])
    assert agents == _without_provider(TRIAGE_OPENAI, ["summarizer"])
    rules = _yaml(EXAMPLES / "triage" / "workflow.yaml")
    assert agents["edges"] == rules["edges"]
    for key in ("config", "input", "state"):
        assert agents[key] == rules[key], key
    # only the summarizer (an agent) and journal (which lifts its output) differ
    changed = {n for n in rules["nodes"] if agents["nodes"][n] != rules["nodes"][n]}
    assert changed == {"summarizer", "journal"}
    assert agents["nodes"]["summarizer"]["agent"]["output_key"] == "assessment"
    assert agents["nodes"]["journal"]["writes"] == ["severity", "findings", "journal"]


@needs_examples
def test_audit_agents_scripted_walk_the_high_risk_gate_like_the_rules(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # scripted: no key needed
    runs = {}
    for name, wf in (("rules", load("audit")), ("agents", interlock.load(AUDIT_AGENTS))):
        first = wf.run_sync(data("audit/engagements/northwind.json"), store=store)
        assert first.status == "WAITING_APPROVAL", first.error
        assert first.waiting["node"] == "approval"
        assert first.waiting["show"]["risk"]["level"] == "HIGH"
        done = wf.resume_sync(first.run_id, interlock.approve(by="partner"), store=store)
        assert done.status == "COMPLETED", done.error
        runs[name] = done
    ruled, agents = runs["rules"], runs["agents"]
    # the agent's {level, reason} is the rules' answer for this engagement
    assert agents.state["risk"] == {k: ruled.state["risk"][k] for k in ("level", "reason")}
    for key in ("evidence", "review", "report"):
        assert agents.state[key] == ruled.state[key], key
    records = trace(agents.run_id, store)
    ruled_records = trace(ruled.run_id, store)
    assert visits(records) == visits(ruled_records) == [
        *AUDIT_HEAD, "approval", "evidence", "reviewer", "evidence", "reviewer", "report"]
    # the switch routed on the agent's risk.level
    assert _switch(records) == _switch(ruled_records) == [("HIGH", ["approval"])]
    assert decisions(records, "risk")[0]["reads"] == {"risk.level": "HIGH"}
    for node in ("approval", "reviewer"):
        assert decisions(records, node) == decisions(ruled_records, node), node
    _check_grounded(agents.state)
    assert _agent_replies(records) == ["risk"]
    assert agents.tokens == 1460 and ruled.tokens == 0


@needs_examples
def test_audit_agents_scripted_modify_reenters_at_risk_like_the_rules(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    patch = {"corrections": {"new_erp_system": False, "prior_findings": 0}}
    runs = {}
    for name, wf in (("rules", load("audit")), ("agents", interlock.load(AUDIT_AGENTS))):
        first = wf.run_sync(data("audit/engagements/northwind.json"), store=store)
        done = wf.resume_sync(first.run_id, interlock.modify(patch, by="partner"), store=store)
        assert done.status == "COMPLETED", done.error
        runs[name] = done
    ruled, agents = runs["rules"], runs["agents"]
    records, ruled_records = trace(agents.run_id, store), trace(ruled.run_id, store)
    assert visits(records) == visits(ruled_records)
    assert _switch(records) == _switch(ruled_records) == [
        ("HIGH", ["approval"]), ("MEDIUM", ["evidence"])]
    # the second scripted reply answers the re-run with the corrected facts
    assert agents.state["risk"] == {k: ruled.state["risk"][k] for k in ("level", "reason")}
    assert _agent_replies(records) == ["risk", "risk"]
    requests = [r for r in records if r["type"] == "agent.request"]
    assert "Corrections by a reviewer: none\n" in requests[0]["prompt"]
    assert ('Corrections by a reviewer: {"new_erp_system": false, "prior_findings": 0}'
            in requests[1]["prompt"])


@needs_examples
def test_audit_agents_run_against_an_openai_compatible_server(
        store: str, serve: Callable[..., FakeOpenAI]) -> None:
    # the model disagrees with the rules (LOW for northwind): the switch follows the model
    low = {"level": "LOW", "reason": "controls were remediated after last year's findings"}
    server = serve(lambda body: low)
    result = interlock.load(AUDIT_OPENAI).run_sync(data("audit/engagements/northwind.json"),
                                                   store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state["risk"] == low and "approval" not in result.state
    records = trace(result.run_id, store)
    assert _switch(records) == [("LOW", ["evidence"])]
    assert visits(records)[:4] == [*AUDIT_HEAD, "evidence"]
    assert f"risk: LOW ({low['reason']})" in result.state["report"]
    [req] = server.requests
    assert req["body"]["response_format"]["json_schema"]["name"] == "risk"
    prompt = req["body"]["messages"][-1]["content"]
    assert "Northwind Traders" in prompt and "F-2024-07" in prompt


def test_audit_agent_files_differ_only_in_the_provider() -> None:
    agents = _without_provider(AUDIT_AGENTS, ["risk"])
    assert agents == _without_provider(AUDIT_OPENAI, ["risk"])
    rules = _yaml(EXAMPLES / "audit" / "workflow.yaml")
    assert agents["edges"] == rules["edges"]
    changed = {n for n in rules["nodes"] if agents["nodes"][n] != rules["nodes"][n]}
    assert changed == {"risk"}
    assert agents["nodes"]["risk"]["agent"]["output"]["required"] == ["level", "reason"]


@pytest.mark.parametrize("path", [
    "examples/triage/workflow.agents.yaml", "examples/triage/workflow.openai.yaml",
    "examples/audit/workflow.agents.yaml", "examples/audit/workflow.openai.yaml"])
def test_agent_variants_validate_without_warnings_and_render(path: str) -> None:
    test_examples_validate_without_warnings_and_render(path)


# ---- jokes (map-reduce) ------------------------------------------------------------------

def test_jokes_maps_one_joke_per_subject_then_picks_the_best(store: str) -> None:
    result = load("jokes").run_sync({"topic": "animals"}, store=store)
    assert result.status == "COMPLETED", result.error
    subjects = ["hedgehogs", "cats", "owls", "pelicans", "yaks"]
    # collected in item order, whatever order the items finished in
    assert [j["joke"].split()[2] for j in result.state["jokes"]] == subjects
    assert result.state["count"] == 5
    assert result.state["best"] == "Why do cats never get lost? They follow the stac."
    records = trace(result.run_id, store)
    finished = [r["item"] for r in records if r["type"] == "node.completed" and "item" in r]
    assert sorted(finished) == list(range(5)) and finished != list(range(5))
    assert result.steps == 7  # plan, five items, best


def test_jokes_with_another_topic_maps_over_its_own_list(store: str) -> None:
    result = load("jokes").run_sync({"topic": "space"}, store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state["count"] == 3
