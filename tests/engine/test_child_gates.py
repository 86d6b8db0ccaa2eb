"""A parent shows every gate of its child runs (SPEC §3, several gates at once): each
child gate is in the parent's ``waiting.pending`` as ``parent_node/child_gate`` -- a
grandchild's as ``parent_node/child_node/gate``, a child's map item's as
``parent_node/gate[i]`` -- and each is decided through the parent by that path (CLI
``--gate``, the API's ``node``), in any order, its branch in the child going on at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import wait_for, write_flows
from conftest import CliProject

NODES = """
def _mark(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def start(state):
    return {"x": 1, "targets": ["t0", "t1", "t2"]}


def after_a(state):
    _mark("after_a")
    return {"after_a": True}


def after_b(state):
    _mark("after_b")
    return {"after_b": True}


def after(state):
    _mark("after")
    return {"after": True}
"""

CHILD = """
workflow: child
nodes:
  a: {approval: {show: [x]}}
  b: {approval: {show: [x]}}
  after_a: {mod}:after_a
  after_b: {mod}:after_b
edges:
  - {from: START, to: [a, b]}
  - {from: a, to: after_a, when: 'a.decision == "approved"'}
  - {from: b, to: after_b, when: 'b.decision == "approved"'}
"""

PARENT = """
workflow: parent
nodes:
  start: {mod}:start
  remediate: {workflow: child.yaml, input: {x: 'x'}}
  legal: {approval: {show: [x]}}
  after: {mod}:after
edges:
  - {from: START, to: start}
  - {from: start, to: [remediate, legal]}
  - {from: [remediate, legal], to: after}
"""


def _wait_for(what: Callable[[], bool], why: str, timeout: float = 30) -> None:
    wait_for(what, why, timeout, every=0.05)


def _pending(out: dict[str, Any]) -> list[str]:
    return sorted(g["node"] for g in (out["waiting"] or {}).get("pending") or ())


def test_every_gate_of_a_child_is_shown_and_decided_through_the_parent(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    p.workflow(CHILD, "child.yaml")
    started = p.cli("run", p.workflow(PARENT, "parent.yaml"), "--run-id", "kids-1", "--json")
    assert started.exit_code == 3, started.output
    out = json.loads(started.stdout)
    assert _pending(out) == ["legal", "remediate/a", "remediate/b"]
    kinds = {g["node"]: g["kind"] for g in out["waiting"]["pending"]}
    assert kinds["remediate/b"] == "approval"  # the child gate's own kind
    # every surface: status, runs --waiting (one row per gate)
    status, shown = p.cli_json("status", "kids-1")
    assert status.exit_code == 3 and _pending(shown) == _pending(out)
    listed, rows = p.cli_json("runs", "--waiting")
    assert sorted(r["waiting"]["node"] for r in rows if r["run_id"] == "kids-1") == [
        "legal", "remediate/a", "remediate/b"], listed.output
    # the child run waits at the same gates: not listed again (its gates are the
    # parent's rows, where they are decided)
    assert {r["run_id"] for r in rows} == {"kids-1"}, listed.output
    table = p.cli("runs", "--waiting")
    assert table.exit_code == 0 and table.stdout.count("remediate") == 2, table.output

    # the child's second gate first, through the parent: its branch goes on in the child
    result, out = p.cli_json("resume", "kids-1", "--approve", "--gate", "remediate/b",
                             "--by", "bea")
    assert result.exit_code == 3, result.output
    assert _pending(out) == ["legal", "remediate/a"]
    assert p.executions() == ["after_b"]
    again = p.cli("resume", "kids-1", "--approve", "--gate", "remediate/b", "--by", "bea")
    assert again.exit_code == 2, again.output  # decided already
    result, out = p.cli_json("resume", "kids-1", "--approve", "--gate", "remediate/a",
                             "--by", "al")
    assert result.exit_code == 3, result.output
    assert _pending(out) == ["legal"]
    assert out["state"]["remediate"]["b"]["by"] == "bea"
    assert out["state"]["remediate"]["a"]["by"] == "al"
    result, out = p.cli_json("resume", "kids-1", "--approve", "--gate", "legal", "--by", "lu")
    assert result.exit_code == 0, result.output
    assert p.executions() == ["after_b", "after_a", "after"]
    decided = [(r["node"], r.get("path"), r["by"]) for r in p.records("kids-1")
               if r["type"] == "approval.decided"]
    assert decided == [("remediate", "remediate/b", "bea"), ("remediate", "remediate/a", "al"),
                       ("legal", None, "lu")]
    assert p.cli("verify", "kids-1").exit_code == 0


GRANDCHILD = """
workflow: grandchild
nodes:
  approval: {approval: {show: [x]}}
  after_a: {mod}:after_a
edges:
  - {from: START, to: approval}
  - {from: approval, to: after_a, when: 'approval.decision == "approved"'}
"""

MIDDLE = """
workflow: middle
nodes:
  fix: {workflow: grandchild.yaml, input: {x: 'x'}}
  b: {approval: {show: [x]}}
  after_b: {mod}:after_b
edges:
  - {from: START, to: [fix, b]}
  - {from: b, to: after_b, when: 'b.decision == "approved"'}
"""

TOP = PARENT.replace("child.yaml", "middle.yaml")


def test_a_grandchilds_gate_is_shown_and_decided_by_its_path(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    p.workflow(GRANDCHILD, "grandchild.yaml")
    p.workflow(MIDDLE, "middle.yaml")
    started = p.cli("run", p.workflow(TOP, "top.yaml"), "--run-id", "kids-2", "--json")
    assert started.exit_code == 3, started.output
    assert _pending(json.loads(started.stdout)) == [
        "legal", "remediate/b", "remediate/fix/approval"]
    result, out = p.cli_json("resume", "kids-2", "--approve", "--gate",
                             "remediate/fix/approval", "--by", "gina")
    assert result.exit_code == 3, result.output
    assert _pending(out) == ["legal", "remediate/b"]
    assert p.executions() == ["after_a"]
    for gate, who in (("legal", "lu"), ("remediate/b", "bea")):
        result, out = p.cli_json("resume", "kids-2", "--approve", "--gate", gate, "--by", who)
    assert result.exit_code == 0, result.output
    assert sorted(p.executions()) == ["after", "after_a", "after_b"]
    assert p.cli("verify", "kids-2").exit_code == 0


MAPPED_CHILD = """
workflow: mapped_child
nodes:
  plan: {mod}:start
  deploy: {approval: {show: [x]}}
  after_b: {mod}:after_b
edges:
  - {from: START, to: plan}
  - {from: plan, map: 'targets', to: deploy, as: target, collect: decisions}
  - {from: deploy, to: after_b}
"""

MAP_PARENT = PARENT.replace("child.yaml", "mapped_child.yaml")


def test_a_childs_map_items_are_shown_and_decided_through_the_parent(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    p = make_project(NODES)
    p.workflow(MAPPED_CHILD, "mapped_child.yaml")
    started = p.cli("run", p.workflow(MAP_PARENT, "mp.yaml"), "--run-id", "kids-3", "--json")
    assert started.exit_code == 3, started.output
    pending = json.loads(started.stdout)["waiting"]["pending"]
    assert sorted(g["node"] for g in pending) == [
        "legal", "remediate/deploy[0]", "remediate/deploy[1]", "remediate/deploy[2]"]
    assert {g["show"].get("target") for g in pending if g["node"] != "legal"} == {
        "t0", "t1", "t2"}
    for i in (2, 0, 1):
        result, out = p.cli_json("resume", "kids-3", "--approve", "--gate",
                                 f"remediate/deploy[{i}]", "--by", f"d{i}")
        assert result.exit_code == 3, result.output
    assert _pending(out) == ["legal"]
    assert p.executions() == ["after_b"]
    assert [d["by"] for d in out["state"]["remediate"]["decisions"]] == ["d0", "d1", "d2"]
    result, out = p.cli_json("resume", "kids-3", "--approve", "--gate", "legal", "--by", "lu")
    assert result.exit_code == 0, result.output
    assert p.cli("verify", "kids-3").exit_code == 0


def test_the_server_lists_and_decides_each_child_gate(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """`/api/approvals` has a row per child gate; each is decided by its path through
    the API's ``node``."""
    from test_server import Served

    p = make_project(NODES)
    write_flows(p, parent=PARENT, child=CHILD)
    assert p.cli("run", "flows/parent.yaml", "--run-id", "kids-4").exit_code == 3
    served = Served(tmp_path, store=p.store)
    try:
        with served.client() as http:
            inbox = http.get("/api/approvals").json()
            # one row per gate: the child run's own are the parent's `remediate/...`
            assert {r["run_id"] for r in inbox} == {"kids-4"}, inbox
            rows = [r for r in inbox if r["run_id"] == "kids-4"]
            # asked for by its id (the child's run page), the child's own gates
            own = http.get("/api/approvals", params={"run_id": "kids-4.remediate.1"})
            assert sorted(r["node"] for r in own.json()) == ["a", "b"], own.text
            assert [r["node"] for r in http.get(
                "/api/approvals", params={"run_id": "kids-4"}).json()] == [
                r["node"] for r in rows]
            assert sorted((r["node"], r["kind"]) for r in rows) == [
                ("legal", "approval"), ("remediate/a", "approval"),
                ("remediate/b", "approval")]
            decided = http.post("/api/runs/kids-4/decisions", json={
                "decision": "approve", "node": "remediate/a", "by": "al"})
            assert decided.status_code == 200, decided.text
            # the server goes on with the run: the child's branch, then its other gate
            # asked again through the parent

            def rows() -> list[str]:
                return sorted(r["node"] for r in http.get("/api/approvals").json()
                              if r["run_id"] == "kids-4")

            _wait_for(lambda: rows() == ["legal", "remediate/b"] and p.executions()
                      == ["after_a"], "remediate/b asked again, after_a run")
            run = http.get("/api/runs/kids-4").json()
            assert run["status"] == "WAITING_APPROVAL"
            assert sorted(g["node"] for g in run["waiting"]["pending"]) == [
                "legal", "remediate/b"]
    finally:
        served.stop()
    assert p.executions() == ["after_a"]


SLOW_NODES = NODES + """

def slow(state):
    import os
    import pathlib
    import time

    pathlib.Path("slow_started.marker").write_text("started")
    deadline = time.monotonic() + 120
    while not os.path.exists("go.marker") and time.monotonic() < deadline:
        time.sleep(0.02)
    _mark("slow")
    return {"slow": True}
"""

ONE_GATE_CHILD = """
workflow: child
nodes:
  a: {approval: {show: [x]}}
  after_a: {mod}:after_a
edges:
  - {from: START, to: a}
  - {from: a, to: after_a, when: 'a.decision == "approved"'}
"""

BUSY_PARENT = """
workflow: busy_parent
nodes:
  start: {mod}:start
  remediate: {workflow: child.yaml, input: {x: 'x'}}
  slow: {mod}:slow
  after: {mod}:after
edges:
  - {from: START, to: start}
  - {from: start, to: [remediate, slow]}
  - {from: [remediate, slow], to: after}
"""


def test_a_childs_gate_decided_while_the_parent_executes_other_branches(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """The parent (a real process) runs ``slow`` while its child waits at ``a``: the
    parent shows WAITING_APPROVAL with ``remediate/a``; decided from another process by
    that path, the decider exits 0 at once and the executing parent continues the child
    (``after_a`` runs while ``slow`` still blocks)."""
    import os
    import subprocess
    import sys

    p = make_project(SLOW_NODES)
    p.workflow(ONE_GATE_CHILD, "child.yaml")
    wf = p.workflow(BUSY_PARENT, "busy_parent.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    executor = subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", wf, "--run-id", "kids-5", "--store",
         p.store, "--json"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (tmp_path / "slow_started.marker").exists(), "slow to start")
        seen: dict[str, Any] = {}

        def waits() -> bool:
            seen.update(p.cli_json("status", "kids-5")[1])
            return _pending(seen) == ["remediate/a"]

        _wait_for(waits, "the child's gate shown by the parent")
        assert seen["status"] == "WAITING_APPROVAL" and seen["waiting"]["running"] == ["slow"]
        decider = subprocess.run(
            [sys.executable, "-m", "interlock", "resume", "kids-5", "--approve", "--gate",
             "remediate/a", "--by", "al", "--store", p.store], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=60)
        assert decider.returncode == 0, decider.stderr
        assert "being executed by" in decider.stderr, decider.stderr
        _wait_for(lambda: "after_a" in p.executions(), "the child's branch to go on")
        assert "slow" not in p.executions()
        again = p.cli("resume", "kids-5", "--approve", "--gate", "remediate/a", "--by", "al")
        assert again.exit_code == 2, again.output  # decided already
        (tmp_path / "go.marker").write_text("go")
        out, err = executor.communicate(timeout=60)
    finally:
        if executor.poll() is None:
            executor.kill()
            executor.communicate(timeout=30)
    assert executor.returncode == 0, err
    assert json.loads(out)["status"] == "COMPLETED"
    assert p.executions() == ["after_a", "slow", "after"]
    assert p.cli("verify", "kids-5").exit_code == 0
