"""SPEC §14, versions: runs that outlive their code.

Code digests in ``run.started``, compared when a run is resumed, decided or continued
by a worker (a warning naming the node, ``run.code_changed``, ``code_changed`` in the
run object; ``--strict-code`` refuses before anything is recorded); ``interlock
migrate`` with its static check, ``run.migrated``, and verify / trace / export /
coverage across a migration; workers and servers keep stored runs on their pinned
definitions. Each through the CLI, as a user would, some through a real server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _workflows import gated_double, with_check
from conftest import CliProject

from interlock.support import set_strict_code

NODES = """
import os

def first(state):
    return {"x": 1}

def finish(state):
    return {"done": True}

def broken(state):
    raise RuntimeError("the old code fails")
"""

AFTER = """
def double(state):
    return {"y": state["x"] * 2}
"""

GATED = gated_double("{mod}", "{after}", "versioned")


class Project:
    """A `CliProject` with a second node module (``{after}``), the one the tests edit."""

    def __init__(self, base: CliProject) -> None:
        self.base = base
        self.after = f"{base.mod}_after"
        self.after_file = base.root / f"{self.after}.py"
        self.after_file.write_text(AFTER)

    def workflow(self, text: str, name: str = "wf.yaml") -> str:
        return self.base.workflow(text.replace("{after}", self.after), name)

    def start(self, text: str, run_id: str) -> Any:
        return self.base.cli("run", self.workflow(text), "--run-id", run_id)

    def cli(self, *args: str) -> Any:
        return self.base.cli(*args)

    def records(self, run_id: str) -> list[dict[str, Any]]:
        return self.base.records(run_id)

    def edit_after(self) -> None:
        """A deploy: the module of node ``b`` changes on disk."""
        self.after_file.write_text(AFTER.replace("* 2", "* 3") + "# version 2\n")


@pytest.fixture(autouse=True)
def _lenient() -> Any:
    """``--strict-code`` is a process-wide setting of the CLI's: none leaks out."""
    yield
    set_strict_code(None)


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> Project:
    return Project(make_project(NODES, "versions_nodes"))


def types(records: list[dict[str, Any]]) -> list[str]:
    return [r["type"] for r in records]


# -- code digests and drift ---------------------------------------------------------------


def test_run_started_records_the_digest_of_each_nodes_module(project: Project) -> None:
    assert project.start(GATED, "r-dig").exit_code == 3
    started = project.records("r-dig")[0]
    code = started["code"]  # one digest per module the nodes run (the gate names none)
    assert set(code) == {project.base.mod, project.after}
    assert code[project.after].startswith("sha256:")


def test_a_module_many_nodes_run_is_recorded_once_and_its_change_names_each_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is per module (a 1000-node chain of one module's functions records one
    digest); the definition says which nodes a changed module is the code of."""
    from interlock._definition._digest import changed_code, code_digests
    from interlock._definition._spec import parse

    (tmp_path / "vshared.py").write_text("def f(s):\n    return {}\n")
    (tmp_path / "vother.py").write_text("def g(s):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse({"workflow": "shared", "nodes": {
        "n1": "vshared:f", "n2": "vshared:f", "n3": "vother:g"}, "edges": [
        {"from": "START", "to": "n1"}, {"from": "n1", "to": "n2"},
        {"from": "n2", "to": "n3"}, {"from": "n3", "to": "END"}]})
    recorded = code_digests(spec)
    assert set(recorded) == {"vshared", "vother"}
    (tmp_path / "vshared.py").write_text("def f(s):\n    return {'x': 1}\n")
    now = code_digests(spec)
    assert now["vshared"] != recorded["vshared"] and now["vother"] == recorded["vother"]
    assert changed_code(spec, recorded, now) == {"n1": ["vshared"], "n2": ["vshared"]}
    assert changed_code(spec, recorded, now, ["n2", "n3"]) == {"n2": ["vshared"]}
    assert code_digests(spec, ["n3"]) == {"vother": recorded["vother"]}


def test_a_waiting_run_whose_node_module_changed_warns_records_and_strict_refuses(
        project: Project) -> None:
    assert project.start(GATED, "r-drift").exit_code == 3
    _, before = project.base.cli_json("status", "r-drift")
    assert "code_changed" not in before  # nothing changed yet: the object is as it was
    project.edit_after()

    # the run object names the node whose code changed before anyone decides
    _, data = project.base.cli_json("status", "r-drift")
    assert data["code_changed"] == ["b"]
    seqs = [r["seq"] for r in project.records("r-drift")]

    refused = project.cli("resume", "r-drift", "--approve", "--by", "alice", "--strict-code")
    assert refused.exit_code == 2, refused.output
    assert "node 'b'" in refused.stderr and project.after in refused.stderr
    assert "--strict-code" in refused.stderr
    assert [r["seq"] for r in project.records("r-drift")] == seqs  # nothing recorded

    approved = project.cli("resume", "r-drift", "--approve", "--by", "alice")
    assert approved.exit_code == 0, approved.output
    assert "warning:" in approved.stderr and "node 'b'" in approved.stderr
    records = project.records("r-drift")
    changed = [r for r in records if r["type"] == "run.code_changed"]
    assert len(changed) == 1 and changed[0]["nodes"] == ["b"]
    assert changed[0]["modules"] == {"b": [project.after]}
    assert types(records)[-1] == "run.completed"
    assert project.cli("verify", "r-drift").exit_code == 0


def test_an_unchanged_run_records_nothing_and_strict_lets_it_go_on(project: Project) -> None:
    assert project.start(GATED, "r-same").exit_code == 3
    approved = project.cli("resume", "r-same", "--approve", "--strict-code")
    assert approved.exit_code == 0, approved.output
    assert "run.code_changed" not in types(project.records("r-same"))


def test_a_change_in_a_node_that_already_ran_is_not_reported(project: Project) -> None:
    assert project.start(GATED, "r-past").exit_code == 3
    mod = project.base.root / f"{project.base.mod}.py"
    mod.write_text(mod.read_text() + "\n# a's module changed after a ran\n")
    _, data = project.base.cli_json("status", "r-past")
    assert "code_changed" not in data
    approved = project.cli("resume", "r-past", "--approve", "--strict-code")
    assert approved.exit_code == 0, approved.output


# -- migrate --------------------------------------------------------------------------------

NODES_V2 = '''
def check(state):
    return {"checked": state["y"] + 100}
'''

# v2: a node ``c`` after the gate, before ``b``
GATED_V2 = with_check(GATED, "{after}", "{v2}")

# what cannot continue the run: the gate is gone, a condition reads a field nothing
# provides, and a field the run holds changes its reducer
GATED_BROKEN = """
workflow: versioned
state:
  x: {reducer: append}
nodes:
  a: {mod}:first
  review: {approval: {show: [x]}}
  b: {after}:double
edges:
  - {from: START, to: a}
  - {from: a, to: review}
  - {from: review, to: b, when: 'review.decision == "approved" && risk < 3'}
  - {from: review, to: END, otherwise: true}
  - {from: b, to: END}
"""


def with_v2(project: Project) -> str:
    """The v2 file (its new node's module beside it)."""
    v2 = f"{project.base.mod}_v2"
    (project.base.root / f"{v2}.py").write_text(NODES_V2.replace("y", "x"))
    return project.workflow(GATED_V2.replace("{v2}", v2), "wf_v2.yaml")


def test_migrate_a_waiting_run_onto_a_node_added_after_the_gate(project: Project) -> None:
    assert project.start(GATED, "r-mig").exit_code == 3
    v2 = with_v2(project)

    migrated = project.cli("migrate", "r-mig", "--to", v2, "--by", "ops",
                           "--comment", "add the check")
    assert migrated.exit_code == 0, migrated.output
    assert "node 'c' added" in migrated.stdout
    assert "edge gate -> c" in migrated.stdout and "added" in migrated.stdout
    assert "migrated: run r-mig" in migrated.stderr
    records = project.records("r-mig")
    assert types(records)[-1] == "run.migrated"
    rec = records[-1]
    assert rec["by"] == "ops" and rec["comment"] == "add the check" and rec.get("at_node") is None
    assert rec["from_hash"] == records[0]["definition_hash"] and rec["to_hash"] != rec["from_hash"]
    assert set(rec["code"]) == {project.base.mod, project.after, f"{project.base.mod}_v2"}
    # migrate does not execute: the run still waits, now on the new definition
    status = project.cli("status", "r-mig")
    assert status.exit_code == 3, status.output

    approved = project.cli("resume", "r-mig", "--approve", "--by", "alice")
    assert approved.exit_code == 0, approved.output
    _, data = project.base.cli_json("status", "r-mig")
    assert data["status"] == "COMPLETED"
    assert data["state"]["checked"] == 101 and data["state"]["y"] == 2  # through c, then b
    started = [r["node"] for r in project.records("r-mig") if r["type"] == "node.started"]
    assert started == ["a", "gate", "c", "b"]

    verified = project.cli("verify", "r-mig")
    assert verified.exit_code == 0, verified.output
    assert "ok: r-mig" in verified.stdout

    # trace names the migration; export and verify --file hold across it
    trace = project.cli("trace", "r-mig")
    assert trace.exit_code == 0 and "run.migrated" in trace.stdout
    migrated_line = next(line for line in trace.stdout.splitlines() if "run.migrated" in line)
    assert f"{rec['from_hash'][:12]} -> {rec['to_hash'][:12]}" in migrated_line
    assert "by ops" in migrated_line and "add the check" in migrated_line
    assert "c -> b" in trace.stdout  # the edges after it, named under the new definition
    exported = project.cli("export", "r-mig")
    assert exported.exit_code == 0, exported.output
    (project.base.root / "r-mig.jsonl").write_text(exported.stdout)
    from_file = project.base.cli("verify", "--file", "r-mig.jsonl")
    assert from_file.exit_code == 0, from_file.output

    # coverage: each segment under its own definition
    result, report = project.base.cli_json("coverage", v2)
    assert result.exit_code == 0, result.output
    edges = {(e["from"], e["to"]): e for e in report["edges"]}
    assert edges[("gate", "c")]["taken"] == 1
    assert edges[("c", "b")]["taken"] == 1 and edges[("b", "END")]["taken"] == 1
    assert report["nodes"]["c"] == 1
    result, report = project.base.cli_json("coverage", project.workflow(GATED))
    edges = {(e["from"], e["to"]): e for e in report["edges"]}
    assert edges[("a", "gate")]["taken"] == 1  # the segment before the migration
    assert edges[("gate", "b")]["taken"] == 0  # the run went through c, not this edge


def test_a_migrate_that_cannot_continue_the_run_lists_every_reason_and_records_nothing(
        project: Project) -> None:
    assert project.start(GATED, "r-no").exit_code == 3
    seqs = [r["seq"] for r in project.records("r-no")]
    broken = project.workflow(GATED_BROKEN, "wf_broken.yaml")
    refused = project.cli("migrate", "r-no", "--to", broken)
    assert refused.exit_code == 2, refused.output
    err = refused.stderr
    assert "the gate 'gate'" in err and "--at NODE" in err
    assert "'risk'" in err
    assert "reducer of the field 'x' changed (replace -> append)" in err
    assert "node 'gate' removed" in refused.stdout and "node 'review' added" in refused.stdout
    assert [r["seq"] for r in project.records("r-no")] == seqs  # nothing recorded
    assert project.cli("status", "r-no").exit_code == 3


TWO_GATES = """
workflow: versioned
nodes:
  a: {mod}:first
  legal: {approval: {show: [x]}}
  finance: {approval: {show: [x]}}
  b: {after}:double
edges:
  - {from: START, to: a}
  - {from: a, to: [legal, finance]}
  - {from: [legal, finance], to: b}
  - {from: b, to: END}
"""


def test_migrate_at_one_node_of_a_run_waiting_at_two_gates_is_refused(
        project: Project) -> None:
    """A new user's find: ``finance`` renamed ``treasury``, ``--at treasury`` dropped the
    ``legal`` gate and the join then ran with no one's decision on it."""
    assert project.start(TWO_GATES, "r-two").exit_code == 3
    seqs = [r["seq"] for r in project.records("r-two")]
    renamed = project.workflow(TWO_GATES.replace("finance", "treasury"), "wf_renamed.yaml")
    refused = project.cli("migrate", "r-two", "--to", renamed, "--at", "treasury")
    assert refused.exit_code == 2, refused.output
    assert "it is at 2 places (the gate 'legal', the gate 'finance')" in refused.stderr
    assert "Keep each of them in the new definition under its name" in refused.stderr
    assert [r["seq"] for r in project.records("r-two")] == seqs  # nothing recorded
    # the way out it names: the gates kept, migrated without --at; both still decided
    kept = project.workflow(TWO_GATES.replace("b: {after}:double", "b: {after}:double\n"
                                              "  c: {mod}:first").replace(
        "{from: b, to: END}", "{from: b, to: c}\n  - {from: c, to: END}"), "wf_kept.yaml")
    moved = project.cli("migrate", "r-two", "--to", kept)
    assert moved.exit_code == 0, moved.output
    assert project.cli("resume", "r-two", "--gate", "finance", "--approve").exit_code == 3
    decided = project.cli("resume", "r-two", "--gate", "legal", "--approve")
    assert decided.exit_code == 0, decided.output


def test_migrate_dry_run_records_nothing(project: Project) -> None:
    assert project.start(GATED, "r-dry").exit_code == 3
    seqs = [r["seq"] for r in project.records("r-dry")]
    result, data = project.base.cli_json("migrate", "r-dry", "--to", with_v2(project),
                                         "--dry-run")
    assert result.exit_code == 0, result.output
    assert data["dry_run"] is True and data["recorded"] is None and data["refusals"] == []
    assert "node 'c' added" in data["differences"]
    assert [r["seq"] for r in project.records("r-dry")] == seqs


def test_a_tampered_run_migrated_record_is_caught_by_verify(project: Project) -> None:
    assert project.start(GATED, "r-tamper").exit_code == 3
    assert project.cli("migrate", "r-tamper", "--to", with_v2(project),
                       "--by", "ops").exit_code == 0
    seq = project.records("r-tamper")[-1]["seq"]
    from conftest import record_row

    (data,) = project.base.sql(f"SELECT data FROM entries WHERE id = "
                               f"{record_row('r-tamper', seq)}")[0]
    text = data.decode() if isinstance(data, bytes) else data
    forged = text.replace('"by":"ops"', '"by":"mallory"')
    assert forged != text
    project.base.sql(f"UPDATE entries SET data = ? WHERE id = {record_row('r-tamper', seq)}",
                     forged.encode() if isinstance(data, bytes) else forged)
    verified = project.cli("verify", "r-tamper")
    assert verified.exit_code == 1, verified.output
    assert f"record {seq}" in verified.stdout
    # and nothing continues it
    assert project.cli("resume", "r-tamper", "--approve").exit_code == 1


# -- through a real server: deploys, --strict-code, the migrate API ---------------------------

SERVED_NODES = '''
import os, time
from pathlib import Path

def _ran(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")

def first(state):
    _ran("first")
    return {"x": 1}

def double(state):
    _ran("double")
    return {"y": state["x"] * 2}

def check(state):
    _ran("check")
    return {"checked": True}

def slow(state):
    _ran("slow")
    Path("slow.started").write_text(str(os.getpid()))
    while not Path("slow.release").exists():
        time.sleep(0.02)
    return {"x": 5}
'''

SERVED_GATED = gated_double("vnodes")

# the deploy: a node ``c`` before ``b`` in both workflows
ADD_C = ("  b: vnodes:double", "  c: vnodes:check\n  b: vnodes:double")
SERVED_GATED_V2 = with_check(SERVED_GATED, "vnodes")

SERVED_SLOW = '''
workflow: slow
nodes:
  slow: vnodes:slow
  b: vnodes:double
edges:
  - {from: START, to: slow}
  - {from: slow, to: b}
  - {from: b, to: END}
'''

SERVED_SLOW_V2 = SERVED_SLOW.replace(*ADD_C) \
    .replace("{from: slow, to: b}", "{from: slow, to: c}\n  - {from: c, to: b}")


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from test_server import Served

    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "vnodes.py").write_text(SERVED_NODES)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "gated.yaml").write_text(SERVED_GATED)
    (tmp_path / "flows" / "slow.yaml").write_text(SERVED_SLOW)
    started: list[Any] = []

    def start(*args: str) -> Any:
        started.append(Served(tmp_path, *args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _started(client: Any, run_id: str) -> list[str]:
    return [r["node"] for r in client.get(f"/api/runs/{run_id}/records").json()
            if r["type"] == "node.started"]


def test_a_deploy_mid_run_changes_nothing_of_a_running_or_waiting_run(
        served: Any, tmp_path: Path) -> None:
    from test_server import events, wait_status

    old = served("--drain", "0")
    with old.client() as c:
        for rid in ("w1", "w2"):
            assert c.post("/api/workflows/gated/runs", json={"run_id": rid}).status_code == 201
            wait_status(c, rid, "WAITING_APPROVAL")
        assert c.post("/api/workflows/slow/runs", json={"run_id": "s1"}).status_code == 201
        for ev in events(c, "s1"):
            if ev["event"] == "node.started":
                break  # the slow node is running
    # the deploy: new workflow files, the server restarted on them mid-run
    (tmp_path / "flows" / "gated.yaml").write_text(SERVED_GATED_V2)
    (tmp_path / "flows" / "slow.yaml").write_text(SERVED_SLOW_V2)
    old.stop()
    (tmp_path / "slow.release").write_text("")
    new = served()
    with new.client() as c:
        # the server knows the new version ...
        graph = c.get("/api/workflows/gated").json()
        assert "c" in graph["definition"]["nodes"]
        # ... and the running run, taken over, goes on on the definition it started with
        run = wait_status(c, "s1", "COMPLETED")
        assert run["state"]["y"] == 10 and "checked" not in run["state"]
        assert _started(c, "s1") == ["slow", "slow", "b"]
        # so does the waiting one, decided after the deploy
        decided = c.post("/api/runs/w1/decisions", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        run = wait_status(c, "w1", "COMPLETED")
        assert "checked" not in run["state"] and _started(c, "w1") == ["a", "gate", "b"]

        # moving a run onto the new version is a deliberate act: the migrate API
        # (default: the server's registered definition of the run's workflow)
        dry = c.post("/api/runs/w2/migrate", json={"dry_run": True})
        assert dry.status_code == 200, dry.text
        assert "node 'c' added" in dry.json()["differences"] and dry.json()["recorded"] is None
        moved = c.post("/api/runs/w2/migrate", json={"by": "ops", "comment": "v2"})
        assert moved.status_code == 200, moved.text
        assert moved.json()["recorded"] is not None
        again = c.post("/api/runs/w2/migrate", json={})
        assert again.status_code == 409  # on that definition already: refused, nothing recorded
        assert again.headers["content-type"].startswith("application/problem+json")
        assert "nothing to migrate" in again.json()["detail"]
        decided = c.post("/api/runs/w2/decisions", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        run = wait_status(c, "w2", "COMPLETED")
        assert run["state"]["checked"] is True and _started(c, "w2") == ["a", "gate", "c", "b"]
    executed = (tmp_path / "executions.log").read_text().split()
    assert executed.count("check") == 1  # only the migrated run ran the new node


def test_a_server_with_strict_code_refuses_a_decision_after_the_code_changed(
        served: Any, tmp_path: Path) -> None:
    from test_server import wait_status

    server = served("--strict-code")
    with server.client() as c:
        assert c.post("/api/workflows/gated/runs", json={"run_id": "g1"}).status_code == 201
        wait_status(c, "g1", "WAITING_APPROVAL")
        (tmp_path / "vnodes.py").write_text(SERVED_NODES.replace("* 2", "* 3"))
        run = c.get("/api/runs/g1").json()
        assert run["code_changed"] == ["b"]  # (a ran already: what changed for it is moot)
        before = len(c.get("/api/runs/g1/records").json())
        refused = c.post("/api/runs/g1/decisions", json={"decision": "approve"})
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        detail = refused.json()["detail"]
        assert "node 'b'" in detail and "vnodes" in detail and "--strict-code" in detail
        assert len(c.get("/api/runs/g1/records").json()) == before  # nothing recorded
        assert c.get("/api/runs/g1").json()["status"] == "WAITING_APPROVAL"


# -- a worker's continuation ------------------------------------------------------------------


def test_a_worker_continuing_a_run_whose_code_changed_records_it_or_refuses_it(
        project: Project) -> None:
    from test_workers import Worker

    store = project.base.store
    detached = project.cli("run", "--detach", project.workflow(GATED), "--run-id", "d1")
    assert detached.exit_code == 0, detached.output
    project.edit_after()  # a deploy between the submission and the worker

    strict = Worker(project.base.root, store, "--strict-code")
    try:
        strict.wait_for("run d1 (workflow versioned) could not be executed here")
        assert "node 'b'" in strict.text and project.after in strict.text
    finally:
        assert strict.stop() == 0
    assert types(project.records("d1")) == ["run.started"]  # nothing recorded, not claimed

    lenient = Worker(project.base.root, store)
    try:
        lenient.wait_for("run d1 (workflow versioned): WAITING_APPROVAL after")
        assert "node 'b'" in lenient.text  # the warning, in the worker's log
    finally:
        assert lenient.stop() == 0
    records = project.records("d1")
    assert types(records)[:3] == ["run.started", "run.resumed", "run.code_changed"]
    assert records[1]["worker"] and records[2]["nodes"] == ["b"]


# -- a failed run, --at ----------------------------------------------------------------------

FAILING = """
workflow: failing
nodes:
  a: {mod}:first
  f: {mod}:broken
edges:
  - {from: START, to: a}
  - {from: a, to: f}
  - {from: f, to: END}
"""

# the fix: ``f`` calls working code (same node, new call)
FIXED = FAILING.replace("{mod}:broken", "{mod}:finish")

# the redesign: ``f`` is gone, ``g`` does its job
REPLACED = FAILING.replace("  f: {mod}:broken", "  g: {mod}:finish").replace(
    "{from: a, to: f}", "{from: a, to: g}").replace("{from: f, to: END}", "{from: g, to: END}")


def test_a_failed_run_migrated_onto_a_fix_continues_with_resume(project: Project) -> None:
    assert project.start(FAILING, "r-fail").exit_code == 1
    fixed = project.workflow(FIXED, "fixed.yaml")
    migrated = project.cli("migrate", "r-fail", "--to", fixed)
    assert migrated.exit_code == 0, migrated.output
    assert "node 'f' changed (call)" in migrated.stdout
    assert f"`interlock resume r-fail --store {project.base.store}` continues it" \
        in migrated.stderr
    assert project.cli("status", "r-fail").exit_code == 1  # migrate executes nothing
    resumed = project.cli("resume", "r-fail")
    assert resumed.exit_code == 0, resumed.output
    _, data = project.base.cli_json("status", "r-fail")
    assert data["state"]["done"] is True
    assert project.cli("verify", "r-fail").exit_code == 0


def test_a_node_gone_from_the_new_graph_needs_at_and_continues_there(project: Project) -> None:
    assert project.start(FAILING, "r-at").exit_code == 1
    replaced = project.workflow(REPLACED, "replaced.yaml")
    refused = project.cli("migrate", "r-at", "--to", replaced)
    assert refused.exit_code == 2
    assert "the node 'f' is to run again" in refused.stderr and "--at NODE" in refused.stderr
    wrong = project.cli("migrate", "r-at", "--to", replaced, "--at", "nope")
    assert wrong.exit_code == 2 and "--at 'nope'" in wrong.stderr
    moved = project.cli("migrate", "r-at", "--to", replaced, "--at", "g", "--by", "ops")
    assert moved.exit_code == 0, moved.output
    assert project.records("r-at")[-1]["at_node"] == "g"
    resumed = project.cli("resume", "r-at")
    assert resumed.exit_code == 0, resumed.output
    started = [r["node"] for r in project.records("r-at") if r["type"] == "node.started"]
    assert started == ["a", "f", "g"]
    assert project.cli("verify", "r-at").exit_code == 0


# -- on every store ---------------------------------------------------------------------------


def test_migrate_resume_and_verify_on_every_store(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI in processes of its own, on SQLite and (when INTERLOCK_TEST_POSTGRES is set)
    PostgreSQL: a waiting run migrated, decided, verified."""
    import os
    import subprocess
    import sys

    from test_decision_race import store_urls

    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    (tmp_path / "vmod.py").write_text(NODES)
    (tmp_path / "vmod_after.py").write_text(AFTER)
    (tmp_path / "vmod_v2.py").write_text(NODES_V2.replace("y", "x"))
    fill = {"{mod}": "vmod", "{after}": "vmod_after", "{v2}": "vmod_v2"}
    for name, text in (("v1.yaml", GATED), ("v2.yaml", GATED_V2)):
        for key, value in fill.items():
            text = text.replace(key, value)
        (tmp_path / name).write_text(text)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "interlock", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(tmp_path), os.environ.get("PYTHONPATH", "")])})

    for n, store in enumerate(store_urls(tmp_path)):
        run_id = f"every-{n}-{os.getpid()}"
        assert cli("run", "v1.yaml", "--store", store, "--run-id", run_id).returncode == 3
        moved = cli("migrate", run_id, "--to", "v2.yaml", "--store", store, "--json")
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["recorded"] is not None
        decided = cli("resume", run_id, "--approve", "--store", store, "--json")
        assert decided.returncode == 0, decided.stderr
        assert json.loads(decided.stdout)["state"]["checked"] == 101
        verified = cli("verify", run_id, "--store", store)
        assert verified.returncode == 0, verified.stdout + verified.stderr


# -- snapshots ------------------------------------------------------------------------------


def test_a_migrated_run_is_never_restored_from_a_snapshot_of_the_old_plan(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot taken after a migration holds a view of the new plan, which the run's
    row (the definition it started with) does not name: it is not used, the log is."""
    from interlock._engine import _snapshot

    monkeypatch.setattr(_snapshot, "EVERY", 1)  # a snapshot at every flush
    monkeypatch.setattr(_snapshot, "BYTES_PER_RECORD", 10**9)
    assert project.start(GATED, "r-snap").exit_code == 3
    assert project.cli("migrate", "r-snap", "--to", with_v2(project)).exit_code == 0
    approved = project.cli("resume", "r-snap", "--approve")
    assert approved.exit_code == 0, approved.output
    (snap,) = project.base.sql("SELECT data FROM snapshots WHERE run_id = 'r-snap'")[0]
    assert b'"migration"' in (snap if isinstance(snap, bytes) else snap.encode())
    _, data = project.base.cli_json("status", "r-snap")
    assert data["status"] == "COMPLETED" and data["state"]["checked"] == 101
    verified = project.cli("verify", "r-snap")
    assert verified.exit_code == 0, verified.output


def test_migrate_through_a_server_with_the_cli(served: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``interlock migrate --server``: the file's definition sent, the server checks and
    records; a refusal is the server's every reason, exit 2."""
    from click.testing import CliRunner
    from test_server import wait_status

    from interlock.cli import cli

    monkeypatch.chdir(tmp_path)
    server = served()
    with server.client() as c:
        assert c.post("/api/workflows/gated/runs", json={"run_id": "m1"}).status_code == 201
        wait_status(c, "m1", "WAITING_APPROVAL")
    (tmp_path / "v2.yaml").write_text(SERVED_GATED_V2)
    (tmp_path / "gone.yaml").write_text(SERVED_GATED.replace("gate", "review"))
    runner = CliRunner()
    refused = runner.invoke(cli, ["migrate", "m1", "--to", "gone.yaml", "--server", server.url])
    assert refused.exit_code == 2
    assert "the gate 'gate'" in refused.stderr and "--at NODE" in refused.stderr
    moved = runner.invoke(cli, ["migrate", "m1", "--to", "v2.yaml", "--server", server.url,
                                "--by", "ops"])
    assert moved.exit_code == 0, moved.output
    assert "node 'c' added" in moved.stdout and "migrated: run m1" in moved.stderr
    with server.client() as c:
        records = c.get("/api/runs/m1/records").json()
        assert records[-1]["type"] == "run.migrated" and records[-1]["by"] == "ops"


def test_a_pending_run_migrated_is_continued_by_a_worker_on_the_new_definition(
        project: Project) -> None:
    from test_workers import Worker

    detached = project.cli("run", "--detach", project.workflow(GATED), "--run-id", "p1")
    assert detached.exit_code == 0, detached.output
    moved = project.cli("migrate", "p1", "--to", with_v2(project))
    assert moved.exit_code == 0, moved.output
    assert "a worker (`interlock worker`) continues it" in moved.stderr
    assert project.cli("resume", "p1", "--detach", "--approve").exit_code == 2  # not waiting
    worker = Worker(project.base.root, project.base.store)
    try:
        worker.wait_for("run p1 (workflow versioned): WAITING_APPROVAL after")
        assert project.cli("resume", "p1", "--approve", "--detach").exit_code == 0
        worker.wait_for("finished run p1 (workflow versioned): COMPLETED")
    finally:
        assert worker.stop() == 0
    started = [r["node"] for r in project.records("p1") if r["type"] == "node.started"]
    assert started == ["a", "gate", "c", "b"]
    assert project.cli("verify", "p1").exit_code == 0


def test_reading_a_runs_code_drift_imports_nothing(tmp_path: Path) -> None:
    """`status` (and the API's run object) compares digests without importing the nodes'
    modules: a package's ``__init__`` runs when a run executes, not when one is read."""
    import os
    import subprocess
    import sys

    pkg = tmp_path / "vpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import os\nwith open('imports.log', 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n")
    (pkg / "nodes.py").write_text(NODES)
    (tmp_path / "wf.yaml").write_text(GATED.replace("{mod}", "vpkg.nodes")
                                      .replace("{after}", "vpkg.nodes")
                                      .replace(":double", ":finish"))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env.pop("INTERLOCK_STORE", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "interlock", *args, "--store",
                               f"sqlite:///{tmp_path / 'runs.db'}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)

    assert cli("run", "wf.yaml", "--run-id", "imp").returncode == 3
    imported = (tmp_path / "imports.log").read_text().split()
    (pkg / "nodes.py").write_text(NODES + "\n# changed\n")
    status = cli("status", "imp", "--json")
    assert json.loads(status.stdout)["code_changed"] == ["b"]
    assert (tmp_path / "imports.log").read_text().split() == imported  # nothing imported


def test_a_refused_migrate_through_a_server_prints_what_the_local_one_prints(
        served: Any, tmp_path: Path) -> None:
    """``migrate --server`` refused: the differences (and with --json the migration with
    its refusals) as the local command prints them, not only the error."""
    import subprocess
    import sys

    from test_server import wait_status

    server = served()
    with server.client() as c:
        assert c.post("/api/workflows/gated/runs", json={"run_id": "m1"}).status_code == 201
        wait_status(c, "m1", "WAITING_APPROVAL")
    gone = tmp_path / "nogate.yaml"  # the gate the run waits at is gone
    gone.write_text(SERVED_GATED.replace("  gate: {approval: {show: [x]}}\n", "").replace(
        "  - {from: a, to: gate}\n", "  - {from: a, to: b}\n").replace(
        "  - {from: gate, to: b, when: 'gate.decision == \"approved\"'}\n", "").replace(
        "  - {from: gate, to: END, otherwise: true}\n", ""))

    def migrate(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "interlock", "migrate", "m1", "--to",
                               str(gone), "--dry-run", "--server", server.url, *extra],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)

    shown = migrate()
    assert shown.returncode == 2, shown
    assert "node 'gate' removed" in shown.stdout, shown
    assert "the gate 'gate'" in shown.stderr, shown
    as_json = migrate("--json")
    assert as_json.returncode == 2, as_json
    found = json.loads(as_json.stdout)
    assert found["run_id"] == "m1" and found["refusals"], found
    assert "node 'gate' removed" in found["differences"]
