"""Sub-workflows (SPEC §7): a node that runs another workflow as a child run on the same
store -- linked both ways, pinned in the parent's definition, limits counted in both,
gates, failures, cancellation and crashes crossing the boundary. Real runs throughout;
the crash and the cancellation with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import record_row

import interlock
from interlock import END, START, Workflow

if TYPE_CHECKING:
    from conftest import CliProject

NODES = '''
import asyncio
import os
from pathlib import Path


def log(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def intake(s):
    log("intake")
    return {"incident": {"id": s["event"], "severity": "high"}}


def fix(s):
    log("fix")
    return {"fixed": s["incident"]["id"]}


def check(s):
    log("check")
    return {"result": {"ok": True, "fixed": s["fixed"]}}


def report(s):
    log("report")
    return {"report": s["remediate"]}


def flaky(s):
    count = Path("flaky.count")
    n = int(count.read_text()) if count.exists() else 0
    count.write_text(str(n + 1))
    log("flaky")
    if n < int(os.environ.get("FLAKY_FAILS", "1")):
        raise ConnectionError("the service is down")
    return {"result": "recovered"}


async def slow(s):
    log("slow")
    Path("ready").write_text("")
    while os.environ.get("HANG") or not Path("go").exists():
        await asyncio.sleep(0.02)
    return {"result": "slow done"}


async def slow_once(s):
    log("slow_once")
    marker = Path("slow.once")
    if not marker.exists():
        marker.write_text("")
        await asyncio.sleep(60)
    return {"result": "second time"}


async def spend(s, ctx):
    ctx.record_tokens(40)
    log("spend")
    return {"spent": 40}
'''

CHILD = """
workflow: remediation
input: [incident]
nodes:
  fix: {mod}:fix
  check: {mod}:check
edges:
  - {from: START, to: fix}
  - {from: fix, to: check}
"""

PARENT = """
workflow: triage
input: [event]
nodes:
  intake: {mod}:intake
  remediate: {workflow: child.yaml, output: result}
  report: {mod}:report
edges:
  - {from: START, to: intake}
  - {from: intake, to: remediate}
  - {from: remediate, to: report}
"""


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> CliProject:
    p = make_project(NODES, prefix="sub")
    p.workflow(CHILD, "child.yaml")
    p.workflow(PARENT, "parent.yaml")
    return p


def run_parent(p: CliProject, workflow: str = "parent.yaml", run_id: str = "p1",
               data: dict[str, Any] | None = None) -> interlock.RunResult:
    wf = interlock.load(workflow)
    return wf.run_sync(data if data is not None else {"event": "disk"}, store=p.store,
                       run_id=run_id)


def test_the_child_runs_as_its_own_run_linked_both_ways(project: CliProject) -> None:
    result = run_parent(project)
    assert result.status == "COMPLETED", result.error
    assert result.state["remediate"] == {"ok": True, "fixed": "disk"}
    assert result.state["report"] == {"ok": True, "fixed": "disk"}
    assert result.steps == 5  # intake, remediate, report, and the child's fix and check
    child = "p1.remediate.1"
    records = project.records(child)
    assert records[0]["type"] == "run.started"
    assert records[0]["parent"] == {"run": "p1", "node": "remediate", "visit": 1}
    assert records[0]["input"] == {"incident": {"id": "disk", "severity": "high"}}
    assert records[-1]["type"] == "run.completed"
    parent = project.records("p1")
    started = [r for r in parent if r["type"] == "child.started"]
    assert [(r["node"], r["run_id"], r["workflow"]) for r in started] == \
        [("remediate", child, "remediation")]
    assert project.executions() == ["intake", "fix", "check", "report"]
    # the child's definition is part of the parent's, and of its hash
    definition = interlock.load("parent.yaml").definition()
    pinned = definition["nodes"]["remediate"]["workflow"]
    assert pinned["file"] == "child.yaml"
    assert pinned["definition"] == interlock.load("child.yaml").definition()


def test_input_mapping_and_the_forms_of_output(project: CliProject) -> None:
    project.workflow("""
    workflow: shapes
    input: [event]
    nodes:
      intake: {mod}:intake
      whole:
        workflow: child.yaml
        input: {incident: "{'id': incident.id + '-x', 'severity': 'low'}"}
      some: {workflow: child.yaml, output: [fixed], output_key: fixes}
    edges:
      - {from: START, to: intake}
      - {from: intake, to: [whole, some]}
    """, "shapes.yaml")
    result = run_parent(project, "shapes.yaml", "s1")
    assert result.status == "COMPLETED", result.error
    whole = result.state["whole"]
    assert whole["incident"] == {"id": "disk-x", "severity": "low"}  # mapped by CEL
    assert whole["result"] == {"ok": True, "fixed": "disk-x"}  # the child's final state
    assert result.state["fixes"] == {"fixed": "disk"}  # same-named field by default


def test_the_builder_makes_the_same_workflow_as_the_file(project: CliProject) -> None:
    mod = project.mod
    built = (Workflow("triage", input=["event"]).node("intake", _imported(mod, "intake"))
             .subworkflow("remediate", "child.yaml", output="result")
             .node("report", _imported(mod, "report"))
             .edge(START, "intake").edge("intake", "remediate").edge("remediate", "report"))
    assert built.definition()["nodes"]["remediate"] == \
        interlock.load("parent.yaml").definition()["nodes"]["remediate"]

    async def fix(s: dict[str, Any]) -> dict[str, Any]:
        return {"fixed": s["incident"]["id"].upper()}

    child = (Workflow("py-child", input=["incident"]).node("fix", fix)
             .edge(START, "fix").edge("fix", END))
    parent = (Workflow("py-parent", input=["incident"])
              .subworkflow("remediate", child, output="fixed")
              .edge(START, "remediate").edge("remediate", END))
    result = parent.run_sync({"incident": {"id": "db"}}, store="memory://")
    assert result.status == "COMPLETED", result.error
    assert result.state["remediate"] == "DB"



def test_interlock_run_shows_the_childs_records_live_under_its_node(
        project: CliProject) -> None:
    """`interlock run`'s progress shows a child run's nodes as they complete, indented
    under the sub-workflow node (between its `running` and `completed` lines); the
    summary table stays the parent's own nodes."""
    out = project.cli("run", "parent.yaml", "--input", '{"event": "disk"}', "--run-id", "p1")
    assert out.exit_code == 0, out.output
    lines = [line.rstrip() for line in out.stderr.splitlines()]
    begin = lines.index("  remediate  running")
    end = next(i for i, line in enumerate(lines) if line.startswith("  remediate  completed"))
    inside = lines[begin + 1:end]
    assert inside[0] == "  │ child run p1.remediate.1 started: workflow remediation"
    assert [line.split()[1:3] for line in inside[1:]] == [
        ["fix", "running"], ["fix", "completed"], ["check", "running"],
        ["check", "completed"]]
    assert all(line.startswith("  │   ") for line in inside[1:])
    rows = [line.split()[0] for line in out.stdout.splitlines()
            if line.split() and line.split()[0] in ("intake", "remediate", "report", "fix",
                                                     "check")]
    assert rows == ["intake", "remediate", "report"]
    with_json = project.cli("run", "parent.yaml", "--input", '{"event": "disk"}',
                            "--run-id", "p2", "--json")
    assert "child run" not in with_json.stderr  # --json: no progress, the child's neither


def _cli(*args: str) -> Any:
    """A command without a store (validate, graph)."""
    from click.testing import CliRunner

    from interlock.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _imported(mod: str, name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(mod), name)


def test_a_workflow_that_includes_itself_is_refused_by_validate(project: CliProject) -> None:
    project.workflow("""
    workflow: a
    nodes:
      first: {mod}:fix
      inner: {workflow: b.yaml}
    edges:
      - {from: START, to: first}
      - {from: first, to: inner}
    """, "a.yaml")
    project.workflow("""
    workflow: b
    nodes:
      again: {workflow: a.yaml}
    edges:
      - {from: START, to: again}
    """, "b.yaml")
    out = _cli("validate", "a.yaml")
    assert out.exit_code == 2
    assert "b.yaml:4:" in out.output and "error: node 'again': workflow 'a.yaml' includes " \
        "itself (a.yaml -> b.yaml -> a.yaml)" in out.output
    project.workflow("""
    workflow: me
    nodes:
      me: {workflow: me.yaml}
    edges:
      - {from: START, to: me}
    """, "me.yaml")
    out = _cli("validate", "me.yaml")
    assert out.exit_code == 2
    assert "me.yaml:4:" in out.output and "(me.yaml -> me.yaml)" in out.output


def test_validate_checks_the_input_mapping(project: CliProject) -> None:
    project.workflow("""
    workflow: unmapped
    nodes:
      remediate: {workflow: child.yaml}
    edges:
      - {from: START, to: remediate}
    """, "unmapped.yaml")
    out = _cli("validate", "unmapped.yaml")
    assert out.exit_code == 2
    assert "unmapped.yaml:4:" in out.output
    assert "needs input 'incident', which is not mapped" in out.output
    project.workflow("""
    workflow: badexpr
    input: [event]
    nodes:
      remediate: {workflow: child.yaml, input: {incident: 'event +* 1'}}
    edges:
      - {from: START, to: remediate}
    """, "badexpr.yaml")
    out = _cli("validate", "badexpr.yaml")
    assert out.exit_code == 2
    assert "badexpr.yaml:5:" in out.output and "input 'incident': the expression" in out.output
    project.workflow("""
    workflow: broken-child
    nodes:
      a: {mod}:fix
    edges:
      - {from: START, to: nowhere}
    """, "broken.yaml")
    project.workflow("""
    workflow: uses-broken
    nodes:
      sub: {workflow: broken.yaml}
    edges:
      - {from: START, to: sub}
    """, "uses.yaml")
    out = _cli("validate", "uses.yaml")
    assert out.exit_code == 2
    assert "node 'sub': its sub-workflow 'broken.yaml' is invalid" in out.output
    assert "nowhere" in out.output


FLAKY_CHILD = """
workflow: flaky-child
input: [incident]
nodes:
  flaky: {mod}:flaky
edges:
  - {from: START, to: flaky}
"""

GATED_CHILD = """
workflow: gated
input: [incident]
nodes:
  fix: {mod}:fix
  approval: {approval: {show: [fixed], approvers: [alice]}}
  check: {mod}:check
edges:
  - {from: START, to: fix}
  - {from: fix, to: approval}
  - {from: approval, to: check}
"""

GATED_PARENT = PARENT.replace("child.yaml", "gated.yaml")


def test_a_gate_in_the_child_pauses_the_parent_and_is_approved_through_it(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    result = run_parent(project, "gparent.yaml", "g1")
    assert result.status == "WAITING_APPROVAL"
    assert result.waiting is not None
    assert result.waiting["node"] == "remediate/approval"
    assert result.waiting["show"] == {"fixed": "disk"}
    out, status = project.cli_json("status", "g1")
    assert out.exit_code == 3 and status["waiting"]["node"] == "remediate/approval"
    # the child is pinned: what the file says now does not change the run
    (project.root / "gated.yaml").write_text("workflow: gated\nnodes: {}\n")
    refused = project.cli("resume", "g1", "--approve", "--by", "mallory")
    assert refused.exit_code == 2 and "'mallory' may not decide 'approval'" in refused.output
    out, done = project.cli_json("resume", "g1", "--approve", "--by", "alice")
    assert out.exit_code == 0, out.output
    assert done["status"] == "COMPLETED"
    assert done["state"]["remediate"] == {"ok": True, "fixed": "disk"}
    child = project.records("g1.remediate.1")
    decided = [r for r in child if r["type"] == "approval.decided"]
    assert [(d["node"], d["decision"], d["by"]) for d in decided] == \
        [("approval", "approved", "alice")]
    assert project.executions() == ["intake", "fix", "check", "report"]
    assert project.cli("verify", "g1").exit_code == 0


def test_resuming_the_child_itself_decides_its_gate_and_continues_the_parent(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    assert run_parent(project, "gparent.yaml", "g2").status == "WAITING_APPROVAL"
    out, child = project.cli_json("resume", "g2.remediate.1", "--approve", "--by", "alice")
    assert out.exit_code == 0, out.output
    assert child["status"] == "COMPLETED"
    out, parent = project.cli_json("status", "g2")
    assert parent["status"] == "COMPLETED", parent
    assert parent["state"]["report"] == {"ok": True, "fixed": "disk"}
    assert project.executions() == ["intake", "fix", "check", "report"]


def test_a_child_that_fails_fails_the_node_and_a_retry_continues_it(
        project: CliProject) -> None:
    project.workflow("""
    workflow: flaky-child
    input: [incident]
    nodes:
      fix: {mod}:fix
      flaky: {mod}:flaky
    edges:
      - {from: START, to: fix}
      - {from: fix, to: flaky}
    """, "flaky.yaml")
    project.workflow(PARENT.replace("child.yaml", "flaky.yaml").replace(
        "output: result}", "output: result, retry: {attempts: 2}}"), "retrying.yaml")
    result = run_parent(project, "retrying.yaml", "r1")
    assert result.status == "COMPLETED", result.error
    assert result.state["remediate"] == "recovered"
    # the child was continued, not started again: fix ran once, flaky twice
    assert project.executions() == ["intake", "fix", "flaky", "flaky", "report"]
    child = [r["type"] for r in project.records("r1.remediate.1")]
    assert child.count("run.started") == 1
    assert "run.failed" in child and child.index("run.resumed") > child.index("run.failed")
    parent = project.records("r1")
    retrying = [r for r in parent if r["type"] == "node.retrying"]
    assert len(retrying) == 1 and retrying[0]["error"]["type"] == "child_failed"
    assert "r1.remediate.1" in retrying[0]["error"]["message"]
    assert project.cli("verify", "r1").exit_code == 0


def test_a_child_that_fails_without_a_retry_fails_the_parent(project: CliProject,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("FLAKY_FAILS", "5")
    project.workflow(FLAKY_CHILD, "flaky.yaml")
    project.workflow(PARENT.replace("child.yaml", "flaky.yaml"), "failing.yaml")
    result = run_parent(project, "failing.yaml", "f1")
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "child_failed"
    assert result.error["node"] == "remediate"
    assert "(run f1.remediate.1) failed at node 'flaky'" in result.error["message"]
    assert "ConnectionError" in result.error["message"]


def test_the_childs_steps_and_tokens_count_against_the_parents_limits(
        project: CliProject) -> None:
    project.workflow("""
    workflow: spender
    nodes:
      a: {mod}:spend
      b: {mod}:spend
    edges:
      - {from: START, to: a}
      - {from: a, to: b}
    """, "spender.yaml")
    project.workflow("""
    workflow: budgeted
    limits: {tokens: 100}
    nodes:
      one: {workflow: spender.yaml}
      two: {workflow: spender.yaml}
    edges:
      - {from: START, to: one}
      - {from: one, to: two}
    """, "budgeted.yaml")
    result = run_parent(project, "budgeted.yaml", "t1", {})
    # one's child spends 80 of 100; two's child may spend the 20 left: its second call
    # crosses the parent's budget, which fails the parent as that limit
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "budget_exceeded"
    assert result.error["node"] == "two"
    assert result.tokens >= 100
    _out, first = project.cli_json("status", "t1.one.1")
    assert first["tokens"] == 80 and first["status"] == "COMPLETED"
    project.workflow("""
    workflow: stepped
    limits: {steps: 5}
    nodes:
      one: {workflow: spender.yaml}
      two: {workflow: spender.yaml, retry: {attempts: 3}}
    edges:
      - {from: START, to: one}
      - {from: one, to: two}
    """, "stepped.yaml")
    result = run_parent(project, "stepped.yaml", "t2", {})
    assert result.status == "FAILED"
    # one and its child's two steps, two and one step of its child: the second crosses
    assert result.error is not None and result.error["type"] == "step_limit", result.error
    assert result.error["node"] == "two" and "its sub-workflow" in result.error["message"]
    assert result.steps == 5
    # an engine limit of the parent's: never retried
    assert not [r for r in project.records("t2") if r["type"] == "node.retrying"]
    assert project.cli("verify", "t1").exit_code == 0


SLOW_CHILD = """
workflow: slow-child
input: [incident]
nodes:
  fix: {mod}:fix
  slow: {mod}:slow
edges:
  - {from: START, to: fix}
  - {from: fix, to: slow}
"""


def _start_parent(p: CliProject, workflow: str, run_id: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", workflow, "--store", p.store, "--run-id",
         run_id, "--input", '{"event": "disk"}'], cwd=p.root,
        env={**os.environ, "PYTHONPATH": str(p.root), **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, "the run ended before the child's node started"
        assert time.monotonic() < deadline, "the child's node never started"
        time.sleep(0.02)


def test_sigkill_of_the_parent_while_its_child_runs_then_resume_parent(
        project: CliProject) -> None:
    project.workflow(SLOW_CHILD, "slow.yaml")
    project.workflow(PARENT.replace("child.yaml", "slow.yaml"), "sparent.yaml")
    proc = _start_parent(project, "sparent.yaml", "k1", HANG="1")
    try:
        _wait_for(project.root / "ready", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert project.executions() == ["intake", "fix", "slow"]
    (project.root / "go").write_text("")
    out, result = project.cli_json("resume", "k1")
    assert out.exit_code == 0, out.output
    assert result["status"] == "COMPLETED"
    assert result["state"]["remediate"] == "slow done"
    # nothing completed ran again, in the parent (intake) or the child (fix)
    assert project.executions() == ["intake", "fix", "slow", "slow", "report"]
    assert project.cli("verify", "k1").exit_code == 0
    out, child = project.cli_json("status", "k1.remediate.1")
    assert child["status"] == "COMPLETED"


def test_sigkill_of_the_parent_then_resuming_the_child_continues_the_parent(
        project: CliProject) -> None:
    project.workflow(SLOW_CHILD, "slow.yaml")
    project.workflow(PARENT.replace("child.yaml", "slow.yaml"), "sparent.yaml")
    proc = _start_parent(project, "sparent.yaml", "k2", HANG="1")
    try:
        _wait_for(project.root / "ready", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (project.root / "go").write_text("")
    out, child = project.cli_json("resume", "k2.remediate.1")
    assert out.exit_code == 0, out.output
    assert child["status"] == "COMPLETED"
    out, parent = project.cli_json("status", "k2")
    assert parent["status"] == "COMPLETED", parent
    assert project.executions() == ["intake", "fix", "slow", "slow", "report"]


def test_cancelling_the_parent_cancels_the_child_it_runs(project: CliProject) -> None:
    project.workflow(SLOW_CHILD, "slow.yaml")
    project.workflow(PARENT.replace("child.yaml", "slow.yaml"), "sparent.yaml")
    proc = _start_parent(project, "sparent.yaml", "c1")
    try:
        _wait_for(project.root / "ready", proc)
        out = project.cli("cancel", "c1", "--by", "bob")
        assert out.exit_code == 0, out.output
        assert proc.wait(timeout=30) == 1  # the run's exit code for CANCELLED
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out, parent = project.cli_json("status", "c1")
    assert parent["status"] == "CANCELLED"
    out, child = project.cli_json("status", "c1.remediate.1")
    assert child["status"] == "CANCELLED"
    cancelled = [r for r in project.records("c1.remediate.1") if r["type"] == "run.cancelled"]
    assert cancelled and cancelled[0]["by"] == "bob"
    assert "report" not in project.executions()


def test_cancelling_a_parent_that_waits_for_its_childs_gate_cancels_the_child(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    assert run_parent(project, "gparent.yaml", "c2").status == "WAITING_APPROVAL"
    assert project.cli("cancel", "c2").exit_code == 0
    _, child = project.cli_json("status", "c2.remediate.1")
    assert child["status"] == "CANCELLED"


def test_verify_parent_checks_every_child_chain(project: CliProject) -> None:
    assert run_parent(project, run_id="v1").status == "COMPLETED"
    ok = project.cli("verify", "v1")
    assert ok.exit_code == 0, ok.output
    assert "v1.remediate.1" in ok.output
    (seq,), = project.sql("SELECT seq FROM records WHERE run_id = 'v1.remediate.1' AND "
                          "data LIKE '%node.completed%' ORDER BY seq LIMIT 1")
    project.sql("UPDATE entries SET data = replace(data, '\"disk\"', '\"DISK\"') "
                f"WHERE id = {record_row('v1.remediate.1', seq)}")
    bad = project.cli("verify", "v1")
    assert bad.exit_code == 1
    assert f"broken: v1.remediate.1 (a child run of v1) at record {seq} " in bad.output


def test_trace_nests_the_childs_records_and_runs_names_the_parent(
        project: CliProject) -> None:
    assert run_parent(project, run_id="n1").status == "COMPLETED"
    records = project.records("n1")
    started = next(r for r in records if r["type"] == "child.started")
    nested = started["records"]
    assert [r["type"] for r in nested][:3] == ["run.started", "edge.taken", "node.started"]
    assert nested[-1]["type"] == "run.completed"
    assert all(r["run_id"] == "n1.remediate.1" for r in nested)
    human = project.cli("trace", "n1")
    assert human.exit_code == 0
    assert "n1.remediate.1" in human.output
    _, rows = project.cli_json("runs")
    child = next(r for r in rows if r["run_id"] == "n1.remediate.1")
    assert child["parent"] == {"run": "n1", "node": "remediate", "visit": 1}


def test_graph_draws_a_sub_workflow_as_a_cluster(project: CliProject) -> None:
    mermaid = _cli("graph", "parent.yaml")
    assert mermaid.exit_code == 0
    assert "subgraph" in mermaid.output and "remediation" in mermaid.output
    dot = _cli("graph", "parent.yaml", "--format", "dot")
    assert "subgraph cluster_remediate" in dot.output


def test_a_sub_workflow_node_cannot_run_outside_a_run() -> None:
    child = Workflow("c").node("a", lambda s: {}).edge(START, "a")
    parent = Workflow("p").subworkflow("sub", child).edge(START, "sub")
    fn = parent.compile().nodes["sub"].fn
    assert fn is not None
    with pytest.raises(interlock.NodeError, match="needs the run executing it"):
        asyncio.run(fn({}, None))


def test_a_gate_two_levels_down_is_decided_through_the_top_parent(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow("""
    workflow: middle
    input: [incident]
    nodes:
      inner: {workflow: gated.yaml, output: result}
    edges:
      - {from: START, to: inner}
    """, "middle.yaml")
    project.workflow(PARENT.replace("child.yaml", "middle.yaml").replace(
        "output: result", "output: inner"), "top.yaml")
    result = run_parent(project, "top.yaml", "d1")
    assert result.status == "WAITING_APPROVAL"
    assert result.waiting is not None and result.waiting["node"] == "remediate/inner/approval"
    out, done = project.cli_json("resume", "d1", "--approve", "--by", "alice")
    assert out.exit_code == 0, out.output
    assert done["status"] == "COMPLETED", done
    assert done["state"]["remediate"] == {"ok": True, "fixed": "disk"}
    assert done["steps"] == 3 + 1 + 3  # intake, remediate, report; inner; fix, gate, check
    ok = project.cli("verify", "d1")
    assert ok.exit_code == 0 and "d1.remediate.1.inner.1" in ok.output, ok.output


def test_a_map_over_a_sub_workflow_runs_a_child_per_item(project: CliProject) -> None:
    project.workflow("""
    workflow: fleet
    nodes:
      plan: {mod}:intake
      remediate: {workflow: child.yaml, input: {incident: "{'id': item}"}, output: result}
    edges:
      - {from: START, to: plan}
      - {from: plan, map: '["a", "b", "c"]', to: remediate, collect: results}
    """, "fleet.yaml")
    result = run_parent(project, "fleet.yaml", "m1")
    assert result.status == "COMPLETED", result.error
    assert [r["remediate"]["fixed"] for r in result.state["results"]] == ["a", "b", "c"]
    assert result.steps == 1 + 3 + 3 * 2  # plan, the items, each child's two
    ok = project.cli("verify", "m1")
    assert ok.exit_code == 0 and "m1.remediate.1.2" in ok.output, ok.output
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow((project.root / "fleet.yaml").read_text().replace("child.yaml",
                                                                       "gated.yaml"),
                     "gfleet.yaml")
    out = _cli("validate", "gfleet.yaml")  # each item's child may wait
    assert out.exit_code == 0, out.output


def test_a_fork_of_a_parent_waiting_for_its_child_runs_a_child_of_its_own(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD, "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    assert run_parent(project, "gparent.yaml", "o1").status == "WAITING_APPROVAL"
    waiting = project.cli("resume", "o1")
    assert waiting.exit_code == 2
    assert "waiting for a decision at 'remediate/approval'" in waiting.output
    last = project.seqs("o1")[-1]
    _, forked = project.cli_json("fork", "o1", "--at", str(last))
    fork = forked["run_id"]
    refused = project.cli("resume", fork, "--approve", "--by", "alice")
    assert refused.exit_code == 2 and "resume it without a decision first" in refused.output
    _, again = project.cli_json("resume", fork)
    assert again["status"] == "WAITING_APPROVAL"
    assert again["waiting"]["node"] == "remediate/approval"
    _, done = project.cli_json("resume", fork, "--approve", "--by", "alice")
    assert done["status"] == "COMPLETED", done
    _, mine = project.cli_json("status", f"{fork}.remediate.1")
    assert mine["status"] == "COMPLETED"
    _, original = project.cli_json("status", "o1.remediate.1")
    assert original["status"] == "WAITING_APPROVAL"  # the fork left it alone
    ok = project.cli("verify", fork)
    assert ok.exit_code == 0, ok.output


def test_a_parent_node_that_times_out_leaves_its_child_to_be_continued(
        project: CliProject) -> None:
    project.workflow("""
    workflow: slow-once
    input: [incident]
    nodes:
      fix: {mod}:fix
      slow: {mod}:slow_once
    edges:
      - {from: START, to: fix}
      - {from: fix, to: slow}
    """, "once.yaml")
    project.workflow(PARENT.replace("child.yaml", "once.yaml").replace(
        "output: result}", "output: result, timeout: 1s, retry: {attempts: 2}}"), "tp.yaml")
    result = run_parent(project, "tp.yaml", "to1")
    assert result.status == "COMPLETED", result.error
    assert result.state["remediate"] == "second time"
    assert project.executions() == ["intake", "fix", "slow_once", "slow_once", "report"]
    [retrying] = [r for r in project.records("to1") if r["type"] == "node.retrying"]
    assert "timed out" in retrying["error"]["message"], retrying["error"]
    child = [r["type"] for r in project.records("to1.remediate.1")]
    assert child.count("run.started") == 1 and child.count("run.resumed") == 1
    assert project.cli("verify", "to1").exit_code == 0


def test_a_deadline_passed_in_the_child_is_applied_when_the_parent_resumes(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD.replace("approvers: [alice]}", "timeout: 1ms, "
                                         "on_timeout: check}"), "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    assert run_parent(project, "gparent.yaml", "e1").status == "WAITING_APPROVAL"
    out, done = project.cli_json("resume", "e1")
    assert out.exit_code == 0, out.output
    assert done["status"] == "COMPLETED", done
    decided = [r for r in project.records("e1.remediate.1") if r["type"] == "approval.decided"]
    assert [(d["decision"], d["by"], d.get("timed_out")) for d in decided] == \
        [("timed_out", "interlock (deadline)", True)]
    assert project.executions() == ["intake", "fix", "check", "report"]


def test_an_error_edge_catches_a_failed_child_by_its_class(
        project: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKY_FAILS", "5")
    project.workflow(FLAKY_CHILD, "flaky.yaml")
    project.workflow("""
    workflow: caught
    input: [event]
    nodes:
      intake: {mod}:intake
      remediate: {workflow: flaky.yaml, output: result}
      report: {mod}:report
      fallback: {mod}:fix
    edges:
      - {from: START, to: intake}
      - {from: intake, to: remediate}
      - {from: remediate, to: report}
      - {from: remediate, to: fallback, on_error: [ChildRunError]}
    """, "caught.yaml")
    result = run_parent(project, "caught.yaml", "oe1")
    assert result.status == "COMPLETED", result.error
    assert result.state["error"]["node"] == "remediate"
    assert result.state["error"]["type"] == "ChildRunError"
    assert "report" not in project.executions()
    assert project.executions()[-1] == "fix"


def test_prune_keeps_a_child_whose_parent_it_keeps(project: CliProject) -> None:
    from interlock._ops._prune import select

    assert run_parent(project, run_id="pr1").status == "COMPLETED"

    async def rows() -> list[Any]:
        async with interlock.open_store(project.store) as st:
            return await st.list_runs()

    stored = asyncio.run(rows())
    parent = next(r for r in stored if r.run_id == "pr1")
    parent.summary.status = "WAITING_APPROVAL"  # as if the parent were kept
    chosen, kept = select(stored, 0.0, ("COMPLETED",), time.time() + 10)
    assert [r.run_id for r in chosen] == [] and kept == ["pr1.remediate.1"]


def test_a_child_gates_input_schema_is_shown_and_checked_through_the_parent(
        project: CliProject) -> None:
    project.workflow(GATED_CHILD.replace(
        "approvers: [alice]}", "input: {type: object, properties: {reason: {type: string}},"
        " required: [reason]}}"), "gated.yaml")
    project.workflow(GATED_PARENT, "gparent.yaml")
    result = run_parent(project, "gparent.yaml", "h1")
    assert result.waiting is not None
    assert result.waiting["input"]["required"] == ["reason"]
    refused = project.cli("resume", "h1", "--approve", "--data", '{"reason": 3}')
    assert refused.exit_code == 2, refused.output
    out, done = project.cli_json("resume", "h1", "--approve", "--data", '{"reason": "ok"}')
    assert out.exit_code == 0 and done["status"] == "COMPLETED", out.output
    [decided] = [r for r in project.records("h1.remediate.1") if r["type"] == "approval.decided"]
    assert decided["data"] == {"reason": "ok"}
