"""Several gates at once (SPEC §3): gates in parallel branches wait together, each is
decided on its own (``resume --gate NODE``), in any order, by whoever its ``approvers:``
allow; a rejection that ends the run closes the others; a decision made while another
process executes the run is recorded once and continued by that process; of two
concurrent deciders on one gate exactly one wins, on two gates both win.

Through the CLI, real processes and real stores (SQLite; PostgreSQL too when
INTERLOCK_TEST_POSTGRES is set).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import released_together, serve, started_waiting, wait_for
from conftest import CliProject
from test_decision_race import store_urls

NODES = """
import os
import pathlib
import time


def _mark(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def start(state):
    _mark("start")
    return {"x": 1}


def done(state):
    _mark("done")
    return {"done": True}


def after_gate(state):
    _mark("after_gate")
    pathlib.Path("after_gate.marker").write_text("ran")
    return {"after": True}


def slow(state):
    pathlib.Path("slow_started.marker").write_text("started")
    deadline = time.monotonic() + 60
    while not os.path.exists("go.marker") and time.monotonic() < deadline:
        time.sleep(0.02)
    _mark("slow")
    return {"slow": True}
"""

PARALLEL = """
workflow: audit
nodes:
  start: {mod}:start
  legal: {approval: {show: [x], approvers: [alice]}}
  finance: {approval: {show: [x], approvers: [bob]}}
  done: {mod}:done
edges:
  - {from: START, to: start}
  - {from: start, to: [legal, finance]}
  - {from: [legal, finance], to: done}
"""


def _records(p: CliProject, run_id: str, rtype: str) -> list[dict[str, Any]]:
    return [r for r in p.records(run_id) if r["type"] == rtype]


def test_two_parallel_gates_decided_in_reverse_order_by_two_approvers(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    started = p.cli("run", p.workflow(PARALLEL), "--run-id", "par-1", "--json")
    assert started.exit_code == 3, started.output
    waiting = json.loads(started.stdout)["waiting"]
    assert waiting["node"] == "legal"  # the oldest
    assert [(g["node"], g["kind"]) for g in waiting["pending"]] == [
        ("legal", "approval"), ("finance", "approval")]
    assert all(isinstance(g["requested_at"], float) for g in waiting["pending"])

    # the second gate first, by its own approver: legal keeps waiting, done does not run
    result, out = p.cli_json("resume", "par-1", "--approve", "--gate", "finance",
                             "--by", "bob")
    assert result.exit_code == 3, result.output
    assert [g["node"] for g in out["waiting"]["pending"]] == ["legal"]
    assert out["state"]["finance"]["by"] == "bob"
    assert "done" not in p.executions()
    # alice may not decide finance (not waiting any more anyway), nor bob legal
    refused = p.cli("resume", "par-1", "--approve", "--gate", "legal", "--by", "bob")
    assert refused.exit_code == 2 and "approvers" in refused.output

    result, out = p.cli_json("resume", "par-1", "--approve", "--gate", "legal",
                             "--by", "alice")
    assert result.exit_code == 0, result.output
    assert out["status"] == "COMPLETED"
    assert p.executions().count("done") == 1  # the join fired once, after both
    decided = _records(p, "par-1", "approval.decided")
    assert [(r["node"], r["by"], r["via"]) for r in decided] == [
        ("finance", "bob", "cli"), ("legal", "alice", "cli")]
    assert p.cli("verify", "par-1").exit_code == 0


def test_a_gate_not_waiting_is_refused(make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "par-2").exit_code == 3
    assert p.cli("resume", "par-2", "--approve", "--gate", "finance",
                 "--by", "bob").exit_code == 3
    again = p.cli("resume", "par-2", "--reject", "--gate", "finance", "--by", "bob")
    assert again.exit_code == 2, again.output
    assert "finance" in again.output and "legal" in again.output  # what does wait
    unknown = p.cli("resume", "par-2", "--approve", "--gate", "nope", "--by", "alice")
    assert unknown.exit_code == 2 and "nope" in unknown.output
    assert len(_records(p, "par-2", "approval.decided")) == 1


def test_one_approved_one_rejected_ends_rejected(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "par-3").exit_code == 3
    assert p.cli("resume", "par-3", "--approve", "--gate", "legal",
                 "--by", "alice").exit_code == 3
    rejected = p.cli("resume", "par-3", "--reject", "--gate", "finance", "--by", "bob",
                     "--comment", "over budget")
    assert rejected.exit_code == 4, rejected.output
    assert "done" not in p.executions()
    assert p.cli("verify", "par-3").exit_code == 0


def test_a_rejection_closes_the_other_waiting_gates(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    assert p.cli("run", p.workflow(PARALLEL), "--run-id", "par-4").exit_code == 3
    result, out = p.cli_json("resume", "par-4", "--reject", "--gate", "finance",
                             "--by", "bob")
    assert result.exit_code == 4, result.output
    assert out["status"] == "REJECTED"
    decided = _records(p, "par-4", "approval.decided")
    assert [(r["node"], r["decision"]) for r in decided] == [
        ("finance", "rejected"), ("legal", "closed")]
    late = p.cli("resume", "par-4", "--approve", "--gate", "legal", "--by", "alice")
    assert late.exit_code == 2, late.output
    assert p.cli("verify", "par-4").exit_code == 0


BUSY = """
workflow: busy
nodes:
  start: {mod}:start
  gate: {approval: {show: [x]}}
  after_gate: {mod}:after_gate
  slow: {mod}:slow
edges:
  - {from: START, to: start}
  - {from: start, to: [gate, slow]}
  - {from: gate, to: after_gate, when: 'gate.decision == "approved"'}
"""


@pytest.mark.parametrize("through", ["store", "server"])
def test_a_decision_while_another_process_executes_is_continued_by_it(
        make_project: Callable[..., CliProject], tmp_path: Path, through: str) -> None:
    """The executor (a real `interlock run` process) is busy in ``slow``; the gate is
    decided from another process: the decider exits 0 at once, the executor records the
    decision once and runs ``after_gate`` while ``slow`` still runs."""
    p = make_project(NODES)
    wf = p.workflow(BUSY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    executor = subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", wf, "--run-id", "busy-1",
         "--store", p.store, "--json"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "slow_started.marker").exists(), "slow to start")
        wait_for(lambda: any(r["type"] == "approval.requested"
                             for r in p.records("busy-1")), "the gate's request")
        served = None
        if through == "server":  # the decision through a server that executes nothing
            from test_server import Served

            (tmp_path / "flows").mkdir()
            (tmp_path / "flows" / "busy.yaml").write_text((tmp_path / wf).read_text())
            served = Served(tmp_path, "--workers", "0", store=p.store)
            where = ["--server", served.url]
        else:
            where = ["--store", p.store]
        try:
            decider = subprocess.Popen(
                [sys.executable, "-m", "interlock", "resume", "busy-1", "--approve",
                 "--gate", "gate", "--by", "al", *where], cwd=tmp_path, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # the executor continues the gate's branch while slow still runs
            wait_for(lambda: (tmp_path / "after_gate.marker").exists(), "after_gate")
            assert "slow" not in p.executions()
            if through == "store":  # it said so and exited 0 without waiting for slow
                _, err = decider.communicate(timeout=60)
                assert decider.returncode == 0, err
                assert "recorded" in err and "being executed by" in err, err
            (tmp_path / "go.marker").write_text("go")
            _, err = decider.communicate(timeout=60)
            assert decider.returncode == 0, err  # (--server: followed to its end)
        finally:
            if served is not None:
                served.stop()
        out, err = executor.communicate(timeout=60)
    finally:
        if executor.poll() is None:
            executor.kill()
            executor.wait()
    assert executor.returncode == 0, err
    assert json.loads(out)["status"] == "COMPLETED"
    decided_recs = _records(p, "busy-1", "approval.decided")
    assert [(r["node"], r["by"]) for r in decided_recs] == [("gate", "al")]
    assert p.executions().count("after_gate") == 1
    assert p.cli("verify", "busy-1").exit_code == 0


# -- races: real deciders released together ---------------------------------------------

RACE = """
workflow: race2
nodes:
  start: race2_nodes:start
  a: {approval: {show: []}}
  b: {approval: {show: []}}
edges:
  - {from: START, to: start}
  - {from: start, to: [a, b]}
"""

RACE_NODES = """
def start(state):
    return {"x": 1}
"""


def _race(tmp_path: Path, store: str, run_id: str, deciders: list[list[str]]
          ) -> list[subprocess.CompletedProcess[str]]:
    return released_together(tmp_path, [["resume", run_id, *args, "--store", store, "--json"]
                                        for args in deciders])


def _decided(tmp_path: Path, store: str, run_id: str) -> list[dict[str, Any]]:
    trace = subprocess.run([sys.executable, "-m", "interlock", "trace", run_id, "--store",
                            store, "--json"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    return [r for r in json.loads(trace.stdout) if r["type"] == "approval.decided"]


TRIALS = 20


@pytest.mark.parametrize("same", [True, False], ids=["same-gate", "two-gates"])
def test_racing_deciders(tmp_path: Path, same: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """20 trials of two deciders released together: on one gate exactly one wins (the
    other exits 2), on two gates both win; the log always verifies."""
    (tmp_path / "race2.yaml").write_text(RACE)
    (tmp_path / "race2_nodes.py").write_text(RACE_NODES)
    import interlock

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for n, store in enumerate(store_urls(tmp_path)):
        wf = interlock.load(str(tmp_path / "race2.yaml"))
        ids = [f"race2-{'same' if same else 'two'}-{n}-{t}-{os.getpid()}"
               for t in range(TRIALS)]
        for run_id in ids:
            assert wf.run_sync(store=store, run_id=run_id).status == "WAITING_APPROVAL"
        for run_id in ids:
            gates = ["a", "a"] if same else ["a", "b"]
            results = _race(tmp_path, store, run_id, [
                ["--approve", "--gate", gates[0], "--by", "alice"],
                ["--reject" if same else "--approve", "--gate", gates[1], "--by", "bob"]])
            codes = sorted(r.returncode for r in results)
            decided = _decided(tmp_path, store, run_id)
            if same:
                # the winner: approve -> 3 (b still waits), reject -> 4 (REJECTED, b
                # closed); the loser: 2, refused
                assert codes in ([2, 3], [2, 4]), [(r.returncode, r.stderr) for r in results]
                loser = results[[r.returncode for r in results].index(2)].stderr
                assert "refused" in loser or "decided already" in loser, loser
                assert [r["node"] for r in decided if r["decision"] != "closed"] == ["a"]
            else:
                # both win: one of them (or a process it handed over to) completes it
                assert all(r.returncode in (0, 3) for r in results), \
                    [(r.returncode, r.stderr) for r in results]
                assert 0 in codes or _status(tmp_path, store, run_id) == "COMPLETED"
                assert sorted(r["node"] for r in decided) == ["a", "b"]
            verify = subprocess.run([sys.executable, "-m", "interlock", "verify", run_id,
                                     "--store", store], cwd=tmp_path, capture_output=True,
                                    text=True, timeout=60)
            assert verify.returncode == 0, verify.stdout


def _status(tmp_path: Path, store: str, run_id: str) -> str:
    out = subprocess.run([sys.executable, "-m", "interlock", "status", run_id, "--store",
                          store, "--json"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    status = json.loads(out.stdout)["status"]
    assert isinstance(status, str)
    return status


CHILD = """
workflow: child
nodes:
  approval: {approval: {show: [x]}}
  fix: {mod}:done
edges:
  - {from: START, to: approval}
  - {from: approval, to: fix, when: 'approval.decision == "approved"'}
"""

PARENT = """
workflow: parent
nodes:
  start: {mod}:start
  remediate: {workflow: child.yaml, input: {x: 'x'}}
  legal: {approval: {show: [x]}}
  after: {mod}:after_gate
edges:
  - {from: START, to: start}
  - {from: start, to: [remediate, legal]}
  - {from: [remediate, legal], to: after}
"""


def test_a_child_runs_gate_and_a_parent_gate_wait_together(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    p.workflow(CHILD, "child.yaml")
    started = p.cli("run", p.workflow(PARENT, "parent.yaml"), "--run-id", "fam-1", "--json")
    assert started.exit_code == 3, started.output
    pending = json.loads(started.stdout)["waiting"]["pending"]
    assert sorted((g["node"], g["kind"]) for g in pending) == [
        ("legal", "approval"), ("remediate/approval", "approval")]  # the child gate's kind
    # the child's gate first, by its path: the parent's gate keeps waiting
    result, out = p.cli_json("resume", "fam-1", "--approve", "--gate", "remediate/approval",
                             "--by", "carol")
    assert result.exit_code == 3, result.output
    assert [g["node"] for g in out["waiting"]["pending"]] == ["legal"]
    assert out["state"]["remediate"]["approval"]["by"] == "carol"
    assert "after_gate" not in p.executions()
    result, out = p.cli_json("resume", "fam-1", "--approve", "--gate", "legal", "--by", "dan")
    assert result.exit_code == 0, result.output
    assert p.executions().count("after_gate") == 1
    assert p.cli("verify", "fam-1").exit_code == 0


MAPPED = """
workflow: deploys
nodes:
  plan: {mod}:plan
  deploy: {approval: {show: [env]}}
  report: {mod}:report
edges:
  - {from: START, to: plan}
  - {from: plan, map: 'targets', to: deploy, as: target, collect: decisions}
  - {from: deploy, to: report}
"""

MAPPED_NODES = NODES + """

def plan(state):
    return {"targets": ["t0", "t1", "t2", "t3", "t4"], "env": "prod"}


def report(state):
    _mark("report")
    return {"report": [d["decision"] for d in state["decisions"]]}
"""


def test_a_map_over_five_items_each_with_a_gate_decided_in_a_shuffled_order(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(MAPPED_NODES)
    started = p.cli("run", p.workflow(MAPPED), "--run-id", "map-1", "--json")
    assert started.exit_code == 3, started.output
    pending = json.loads(started.stdout)["waiting"]["pending"]
    assert [(g["node"], g["item"], g["show"]["target"]) for g in pending] == [
        (f"deploy[{i}]", i, f"t{i}") for i in range(5)]
    order = [3, 0, 4, 1, 2]
    for n, i in enumerate(order):
        verb = "--reject" if i == 1 else "--approve"
        result, out = p.cli_json("resume", "map-1", verb, "--gate", f"deploy[{i}]",
                                 "--by", f"approver{i}")
        if n < len(order) - 1:
            assert result.exit_code == 3, result.output
            left = sorted(g["item"] for g in out["waiting"]["pending"])
            assert left == sorted(order[n + 1:])
            assert "report" not in p.executions()  # one node to the graph: after all
        else:
            assert result.exit_code == 0, result.output
    # collect holds each item's decision record, in item order
    assert out["state"]["report"] == ["approved", "rejected", "approved", "approved",
                                      "approved"]
    assert [d["by"] for d in out["state"]["decisions"]] == [f"approver{i}" for i in range(5)]
    assert p.executions().count("report") == 1
    twice = p.cli("resume", "map-1", "--approve", "--gate", "deploy[3]", "--by", "x")
    assert twice.exit_code == 2
    assert p.cli("verify", "map-1").exit_code == 0


def test_a_mapped_approval_needs_collect(make_project: Callable[..., CliProject]) -> None:
    p = make_project(MAPPED_NODES)
    from click.testing import CliRunner

    from interlock.cli import cli

    checked = CliRunner().invoke(cli, ["validate", p.workflow(
        MAPPED.replace(", collect: decisions", ""))])
    assert checked.exit_code == 2 and "collect" in checked.output


def test_the_server_lists_one_row_per_gate_and_decides_each(
        make_project: Callable[..., CliProject], tmp_path: Path) -> None:
    """A real server: `/api/approvals` has a row per waiting gate; each is decided through
    the API's ``node`` (``via`` recorded); a gate decided twice is 409."""
    p = make_project(NODES)
    served = serve(p, audit=PARALLEL)
    try:
        with served.client() as http:
            started_waiting(http, "audit", "srv-1")
            rows = [r for r in http.get("/api/approvals").json() if r["run_id"] == "srv-1"]
            assert sorted(r["node"] for r in rows) == ["finance", "legal"]
            decided = http.post("/api/runs/srv-1/decisions", json={
                "decision": "approve", "node": "finance", "by": "bob", "via": "dashboard"})
            assert decided.status_code == 200, decided.text
            rows = [r for r in http.get("/api/approvals").json() if r["run_id"] == "srv-1"]
            assert [r["node"] for r in rows] == ["legal"]
            again = http.post("/api/runs/srv-1/decisions", json={
                "decision": "reject", "node": "finance", "by": "bob"})
            assert again.status_code == 409, again.text
            http.post("/api/runs/srv-1/decisions", json={
                "decision": "approve", "node": "legal", "by": "alice"}).raise_for_status()
            wait_for(lambda: http.get("/api/runs/srv-1").json()["status"] == "COMPLETED",
                     "the run to complete")
    finally:
        served.stop()
    decided_recs = _records(p, "srv-1", "approval.decided")
    assert [(r["node"], r["by"], r.get("via")) for r in decided_recs] == [
        ("finance", "bob", "dashboard"), ("legal", "alice", "api")]
    assert p.executions().count("done") == 1
