"""The command line for stored runs (SPEC §4): resume, status, runs, trace, verify, fork.

Every test uses a real SQLite store in ``tmp_path`` and runs in that directory,
with a node module written there (call paths resolve from the working
directory). Nodes append their name to ``executions.log`` so a test can tell
what ran, and how often.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from conftest import record_row

from interlock._ops._runs import TRACE_KEYS
from interlock._store import open_store
from interlock.cli import cli

if TYPE_CHECKING:
    from conftest import CliProject as Project

SPEC_KEYS = {"run_id", "workflow", "status", "state", "steps", "tokens", "error", "waiting"}

NODES = """
import os


def _log(name):
    with open("executions.log", "a") as f:
        f.write(name + "\\n")


def first(state):
    _log("first")
    return {"x": state.get("x", 0) + 1}


def flaky(state, ctx):
    _log("flaky")
    if not os.path.exists("marker"):
        raise RuntimeError("the marker file is missing")
    return {"y": state["x"] + 1, "mode": ctx.config.get("mode")}


def double(state):
    _log("double")
    return {"y": state["x"] * 2}
"""

FAILING = """
workflow: failing
config: {mode: normal}
nodes:
  a: {mod}:first
  f: {mod}:flaky
edges:
  - {from: START, to: a}
  - {from: a, to: f}
"""

GATED = """
workflow: gated
nodes:
  a: {mod}:first
  gate: {approval: {show: [x], on_modify: [a]}}
  b: {mod}:double
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: gate, to: END, otherwise: true}
"""

LINEAR = """
workflow: linear
nodes:
  a: {mod}:first
  b: {mod}:double
edges:
  - {from: START, to: a}
  - {from: a, to: b}
"""


@pytest.fixture
def project(make_project: Callable[..., Project]) -> Project:
    return make_project(NODES, "runs_nodes")


# -- resume a failed run -----------------------------------------------------------------------


def test_resume_a_failed_run_does_not_rerun_completed_nodes(project: Project) -> None:
    failed = project.start(FAILING, "r-fail")
    assert failed.exit_code == 1, failed.output
    assert "the marker file is missing" in failed.stdout
    assert project.executions() == ["first", "flaky"]
    status = project.cli("status", "r-fail")
    assert status.exit_code == 1
    assert "FAILED" in status.stdout and "the marker file is missing" in status.stdout
    assert "interlock resume r-fail" in status.stdout

    (project.root / "marker").write_text("")
    resumed = project.cli("resume", "r-fail", "--set", "mode=fixed")
    assert resumed.exit_code == 0, resumed.output
    assert "run r-fail resumed: workflow failing" in resumed.stderr
    assert re.search(r"^\s+f\s+completed", resumed.stderr, re.MULTILINE)
    assert "COMPLETED" in resumed.stdout
    # the summary covers the whole run: a ran once (before), f twice
    assert re.search(r"^\s*a\s+1\s+.*completed", resumed.stdout, re.MULTILINE)
    assert project.executions() == ["first", "flaky", "flaky"]  # a did NOT run again
    rerun = [line for line in project.cli("trace", "r-fail").stdout.splitlines()
             if "node.started" in line and " f " in line + " "]
    assert len(rerun) == 2 and rerun[1].count("attempt 2") == 1, rerun

    _, data = project.cli_json("status", "r-fail")
    assert set(data) == SPEC_KEYS
    assert data["status"] == "COMPLETED"
    assert data["state"] == {"x": 1, "y": 2, "mode": "fixed"}

    again = project.cli("resume", "r-fail")
    assert again.exit_code == 2
    assert again.stderr.startswith("error: ") and "COMPLETED" in again.stderr


def test_resume_and_fork_warn_of_a_set_key_the_runs_workflow_does_not_declare(
        project: Project) -> None:
    assert project.start(FAILING, "r-warn").exit_code == 1  # declares config: {mode}
    (project.root / "marker").write_text("")
    resumed = project.cli("resume", "r-warn", "--set", "mdoe=fixed")
    assert resumed.exit_code == 0, resumed.output
    assert "warning: --set mdoe:" in resumed.stderr
    assert "declares no config key 'mdoe' (declared: mode)" in resumed.stderr
    forked = project.cli("fork", "r-warn", "--at", "3", "--set", "mode=x", "--set", "typo=1")
    assert forked.exit_code == 0, forked.output
    assert "declares no config key 'typo'" in forked.stderr
    assert "'mode'" not in forked.stderr  # declared: no warning for it


def test_fork_sets_limits_the_new_run_keeps_the_parents_otherwise(project: Project) -> None:
    # the step-limit error says "--set limits.steps=N": a fork takes that advice too
    assert project.cli("run", project.workflow(LINEAR), "--run-id", "r-lim",
                       "--set", "limits.steps=1").exit_code == 1
    again = project.cli("fork", "r-lim", "--at", "2")  # after run.started and START's edge
    assert again.exit_code == 1 and "limits.steps=1" in again.stdout
    raised = project.cli("fork", "r-lim", "--at", "2", "--set", "limits.steps=5",
                         "--run-id", "r-lim2")
    assert raised.exit_code == 0, raised.output
    _, data = project.cli_json("status", "r-lim2")
    assert data["status"] == "COMPLETED" and data["steps"] == 2
    forked = [r for r in project.records("r-lim2") if r["type"] == "run.forked"]
    assert forked[0]["limits"] == {"steps": 5}


def test_status_of_a_failed_run_says_what_can_be_done_about_that_failure(
        project: Project) -> None:
    no_route = project.workflow("""
        workflow: stuck
        nodes:
          a: {mod}:first
          b: {mod}:double
        edges:
          - {from: START, to: a}
          - {from: a, to: b, when: "x > 5"}
        """, "stuck.yaml")
    assert project.cli("run", no_route, "--run-id", "r-stuck").exit_code == 1
    stuck = project.cli("status", "r-stuck").stdout
    assert "interlock fork r-stuck" in stuck and "--patch" in stuck
    assert "run the failed node again" not in stuck  # no node failed: a decision did
    assert "[x > 5 = false]" in stuck  # the value as CEL and the trace write it

    assert project.cli("run", project.workflow(LINEAR), "--run-id", "r-steps",
                       "--set", "limits.steps=1").exit_code == 1
    steps = project.cli("status", "r-steps").stdout
    assert "interlock resume r-steps" in steps and "--set limits.steps=N" in steps

    assert project.start(FAILING, "r-node").exit_code == 1  # a node raised
    assert "run the failed node again with `interlock resume r-node" in \
        project.cli("status", "r-node").stdout


def test_reading_commands_do_not_create_a_store_that_is_not_there(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped --store on a command that only reads is said to be one (exit 2, the
    path named), not "no runs" or "no run" -- and nothing is created (it used to say
    "no runs", exit 0)."""
    missing = project.root / "typo" / "nowhere.db"
    url = f"sqlite:///{missing}"
    for args in (["runs"], ["runs", "--waiting"], ["status", "r-x"], ["trace", "r-x"],
                 ["verify", "r-x"], ["export", "r-x"]):
        result = CliRunner().invoke(cli, [*args, "--store", url], catch_exceptions=False)
        assert result.exit_code == 2, (args, result.output)
        assert result.stdout == ""
        assert f"error: no store at {missing}: there is no such file" in result.stderr
        assert "check --store" in result.stderr
    monkeypatch.setenv("INTERLOCK_STORE", "sqlite:///typo.db")  # relative: the cwd's
    monkeypatch.chdir(tmp_path)
    status = CliRunner().invoke(cli, ["status", "r-x"], catch_exceptions=False)
    assert status.exit_code == 2
    assert "no store at ./typo.db" in status.stderr and "$INTERLOCK_STORE" in status.stderr
    monkeypatch.delenv("INTERLOCK_STORE")  # the default store, not made yet: no runs
    fresh = CliRunner().invoke(cli, ["runs"], catch_exceptions=False)
    assert fresh.exit_code == 0 and fresh.stdout.strip() == "no runs"
    status = CliRunner().invoke(cli, ["status", "r-x"], catch_exceptions=False)
    assert status.exit_code == 2
    assert f"no store at ./.interlock/runs.db (in {tmp_path})" in status.stderr
    assert not missing.exists() and not missing.parent.exists()
    assert not (tmp_path / "typo.db").exists() and not (tmp_path / ".interlock").exists()


def test_a_store_url_naming_a_directory_says_so(project: Project) -> None:
    """`--store sqlite:///adir` with adir a directory (it said "disk I/O error")."""
    (project.root / "adir").mkdir()
    for args in (["runs"], ["run", project.workflow(LINEAR), "--run-id", "r-d"]):
        result = CliRunner().invoke(cli, [*args, "--store", f"sqlite:///{project.root}/adir"],
                                    catch_exceptions=False)
        assert result.exit_code == 2, result.output
        assert (f"cannot open the SQLite store {project.root}/adir: it is a directory; a "
                f"store is a file, such as sqlite:///{project.root}/adir/runs.db"
                ) in result.stderr


def test_resume_json_and_bad_limits(project: Project) -> None:
    assert project.start(FAILING, "r-json").exit_code == 1
    bad = project.cli("resume", "r-json", "--set", "limits.bogus=1")
    assert bad.exit_code == 2 and "bogus" in bad.stderr
    (project.root / "marker").write_text("")
    result, data = project.cli_json("resume", "r-json")
    assert result.exit_code == 0
    assert set(data) == SPEC_KEYS and data["status"] == "COMPLETED"
    assert data["state"]["mode"] == "normal"


def test_resume_of_a_claimed_run_is_refused_unless_forced(project: Project) -> None:
    assert project.start(FAILING, "r-claim").exit_code == 1
    (project.root / "marker").write_text("")

    async def claim() -> None:
        st = open_store(project.store)
        try:
            await st.claim("r-claim", "elsewhere.example:4242:abcd", 60.0)
        finally:
            await st.close()

    asyncio.run(claim())
    refused = project.cli("resume", "r-claim")
    assert refused.exit_code == 2
    assert "is being executed by elsewhere.example:4242:abcd" in refused.stderr
    assert "--force" in refused.stderr
    forced = project.cli("resume", "r-claim", "--force")
    assert forced.exit_code == 0, forced.output


# -- approvals -------------------------------------------------------------------------------


def test_approval_waits_then_approve_then_a_second_decision_is_refused(
        project: Project) -> None:
    waiting = project.start(GATED, "r-gate")
    assert waiting.exit_code == 3, waiting.output

    status = project.cli("status", "r-gate")
    assert status.exit_code == 3
    assert "WAITING_APPROVAL" in status.stdout
    assert "waiting for a decision at 'gate'" in status.stdout
    assert re.search(r"^\s+x = 1$", status.stdout, re.MULTILINE)
    assert "decisions: approve, reject, modify" in status.stdout
    assert "interlock resume r-gate --gate gate --approve --by NAME" in status.stdout
    _, data = project.cli_json("status", "r-gate")
    assert data["waiting"]["node"] == "gate" and data["waiting"]["show"] == {"x": 1}

    listed = project.cli("runs", "--waiting")
    assert listed.exit_code == 0
    row = next(line for line in listed.stdout.splitlines() if line.startswith("r-gate"))
    assert re.search(r"r-gate\s+gated\s+gate\s+(\d+d )?(\d+[hm] )?\d+[sm]\s", row), row
    assert "{\"x\": 1}" in row

    approved = project.cli("resume", "r-gate", "--approve", "--by", "alice",
                           "--comment", "looks fine")
    assert approved.exit_code == 0, approved.output
    assert "gate  approved   by alice: looks fine" in approved.stderr
    assert project.executions() == ["first", "double"]
    assert "r-gate" not in project.cli("runs", "--waiting").stdout

    second = project.cli("resume", "r-gate", "--reject", "--by", "bob")
    assert second.exit_code == 2
    assert "refused" in second.stderr
    _, data = project.cli_json("status", "r-gate")
    assert data["state"]["gate"]["decision"] == "approved"
    assert data["state"]["gate"]["by"] == "alice"


def test_reject_exits_4(project: Project) -> None:
    assert project.start(GATED, "r-rej").exit_code == 3
    result, data = project.cli_json("resume", "r-rej", "--reject", "--by", "bob",
                                    "--comment", "too risky")
    assert result.exit_code == 4
    assert data["status"] == "REJECTED"
    assert project.cli("status", "r-rej").exit_code == 4
    human = project.cli("trace", "r-rej")
    assert "rejected by bob: too risky" in human.stdout


def test_modify_reenters_at_the_named_node(project: Project) -> None:
    assert project.start(GATED, "r-mod").exit_code == 3
    outside = project.cli("resume", "r-mod", "--modify", '{"x": 5}', "--at", "b")
    assert outside.exit_code == 2
    assert "on_modify" in outside.stderr

    result, data = project.cli_json("resume", "r-mod", "--modify", '{"x": 5}', "--at", "a",
                                    "--by", "carol")
    assert result.exit_code == 3  # the re-run reached the gate again
    assert project.executions() == ["first", "first"]
    assert data["waiting"]["show"] == {"x": 6}  # a ran again on the patched state
    assert data["state"]["gate"]["decision"] == "modified"
    assert data["state"]["gate"]["reenter"] == "a"

    human = project.cli("trace", "r-mod").stdout
    assert "modified by carol; patch {\"x\": 5}; re-enter at a" in human
    assert re.search(r"node\.started\s+a\s+visit 2  attempt 1", human)

    approved = project.cli("resume", "r-mod", "--approve")
    assert approved.exit_code == 0
    _, final = project.cli_json("status", "r-mod")
    assert final["state"]["y"] == 12


@pytest.mark.parametrize(("args", "message"), [
    (["--modify", "{bad"], "--modify is not valid JSON"),
    (["--modify", "[1]"], "must be a JSON object"),
    (["--modify", "{}"], "non-empty"),
    (["--at", "a"], "--at NODE goes with --modify"),
    (["--approve", "--modify", '{"x": 1}'], "not --approve and --modify"),
    (["--approve", "--reject"], "not --approve and --reject"),
    (["--reject", "--approve"], "not --approve and --reject"),
    (["--reject", "--modify", '{"x": 1}'], "not --reject and --modify"),
    (["--comment", "hi"], "go with a decision"),
    (["--set", "novalue"], "expected KEY=VALUE"),
])
def test_resume_usage_errors_exit_2(project: Project, args: list[str], message: str) -> None:
    assert project.start(GATED, "r-use").exit_code == 3
    result = project.cli("resume", "r-use", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert project.cli("status", "r-use").exit_code == 3  # nothing was decided


def test_resume_a_waiting_run_without_a_decision_exits_2(project: Project) -> None:
    assert project.start(GATED, "r-nod").exit_code == 3
    result = project.cli("resume", "r-nod")
    assert result.exit_code == 2
    assert "--approve" in result.stderr


# -- trace -----------------------------------------------------------------------------------


def test_trace_json_is_one_array_with_the_spec_keys(project: Project) -> None:
    assert project.start(GATED, "r-tr").exit_code == 3
    assert project.cli("resume", "r-tr", "--approve", "--by", "alice").exit_code == 0
    result = project.cli("trace", "r-tr", "--json")
    assert result.exit_code == 0
    records = json.loads(result.stdout)
    assert isinstance(records, list)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    # what log format 2 implies rides on the record implying it, with its seq
    assert all(i["seq"] == r["seq"] and i["implied"] for r in records
               for i in r.get("implies", ()))
    for rec in records:
        assert set(TRACE_KEYS) <= set(rec)
    conditional = [r for r in records if r["type"].startswith("edge.")
                   and r.get("expr") == 'gate.decision == "approved"']
    assert len(conditional) == 1
    assert conditional[0]["type"] == "edge.taken"
    assert conditional[0]["value"] is True
    assert conditional[0]["reads"] == {"gate.decision": "approved"}
    decided = next(r for r in records if r["type"] == "approval.decided")
    assert decided["by"] == "alice" and decided["decision"] == "approved"


def test_trace_human_explains_edges_failures_and_decisions(project: Project) -> None:
    assert project.start(GATED, "r-th").exit_code == 3
    assert project.cli("resume", "r-th", "--approve", "--by", "alice").exit_code == 0
    result = project.cli("trace", "r-th")
    assert result.exit_code == 0
    out = result.stdout
    assert re.search(r"^\s*1\s+\+0\.0 ms\s+run\.started\s+workflow gated$", out, re.MULTILINE)
    assert re.search(r'edge\.taken\s+gate -> b  \[gate\.decision == "approved" = true\]  '
                     r'taken  read \(gate\.decision="approved"\)', out)
    assert re.search(r"edge\.skipped\s+gate -> END  \[otherwise\]  skipped", out)
    assert re.search(r"approval\.decided\s+gate\s+approved by alice", out)
    assert re.search(r"node\.completed\s+a\s+attempt 1  [\d.]+ ms", out)
    # a line per record, and per record log format 2 implies (after the one implying it)
    records = project.records("r-th")
    assert len(out.splitlines()) == len(records) + sum(len(r.get("implies", ()))
                                                       for r in records)

    assert project.start(FAILING, "r-tf").exit_code == 1
    failed = project.cli("trace", "r-tf").stdout
    assert re.search(r"node\.failed\s+f\s+attempt 1  .*the marker file is missing", failed)


# -- verify ----------------------------------------------------------------------------------


def test_verify_ok_then_tampered_names_the_record(project: Project) -> None:
    assert project.start(LINEAR, "r-ver").exit_code == 0
    ok = project.cli("verify", "r-ver")
    assert ok.exit_code == 0
    n = len(project.records("r-ver"))
    assert ok.stdout.strip() == f"ok: r-ver ({n} records, chain and fold verified)"
    assert "warning" not in project.cli("trace", "r-ver").stderr

    with sqlite3.connect(project.db) as conn:
        changed = conn.execute(
            "UPDATE entries SET data = replace(data, '\"attempt\":1', '\"attempt\":2') "
            f"WHERE id = {record_row('r-ver', 3)}").rowcount
    assert changed == 1
    broken = project.cli("verify", "r-ver")
    assert broken.exit_code == 1
    assert "record 3" in broken.stdout
    assert "hash does not match" in broken.stdout
    refused = project.cli("resume", "r-ver")  # a broken log: exit 1 (LogError), not usage
    assert refused.exit_code == 1 and "broken at record 3" in refused.stderr
    # trace still shows what the store holds, and says it does not verify
    for args in (["trace", "r-ver"], ["trace", "r-ver", "--json"]):
        shown = project.cli(*args)
        assert shown.exit_code == 0, shown.output
        assert "does not verify at record 3" in shown.stderr, args
        assert "attempt" in shown.stdout


@pytest.mark.parametrize(("column", "value", "message"), [
    ("data", "{not json", "not valid JSON"),
    ("data", '{"seq": 3, "type": "node.started", "node": 1}', "hash does not match"),
    ("hash", "not a hash", "hash does not match"),
    ("hash", 7, "hash does not match"),
    ("data", b"\x00binary", "not valid JSON"),
])
def test_a_tampered_column_is_found_and_no_command_crashes_on_it(
        project: Project, column: str, value: object, message: str) -> None:
    assert project.start(FAILING, "r-tc").exit_code == 1
    with sqlite3.connect(project.db) as conn:
        conn.execute(f"UPDATE entries SET {column} = ? WHERE id = {record_row('r-tc', 3)}",
                     (value,))
    broken = project.cli("verify", "r-tc")
    assert broken.exit_code == 1 and "record 3" in broken.stdout and message in broken.stdout
    for args in (["resume", "r-tc"], ["fork", "r-tc", "--at", "2"]):
        refused = project.cli(*args)
        assert refused.exit_code == 1, (args, refused.output)  # LogError: not a usage error
        assert "broken at record 3" in refused.stderr, (args, refused.stderr)
    for args in (["trace", "r-tc"], ["trace", "r-tc", "--json"]):
        shown = project.cli(*args)
        if message == "not valid JSON":  # nothing to show
            assert shown.exit_code == 1 and "broken at record 3" in shown.stderr, args
        else:  # what the store holds, and that it does not verify
            assert shown.exit_code == 0, (args, shown.output)
            assert "does not verify at record 3" in shown.stderr, (args, shown.stderr)


# -- fork ------------------------------------------------------------------------------------


def test_fork_runs_a_patched_copy_and_leaves_the_original(project: Project) -> None:
    assert project.start(LINEAR, "r-orig").exit_code == 0
    before = project.records("r-orig")
    _, orig = project.cli_json("status", "r-orig")
    at = next(r["seq"] for r in before if r["type"] == "node.completed" and r["node"] == "a")

    result = project.cli("fork", "r-orig", "--at", str(at), "--patch", '{"x": 10}',
                         "--run-id", "r-fork")
    assert result.exit_code == 0, result.output
    assert f"run r-fork started (forked from r-orig at record {at})" in result.stderr
    assert "COMPLETED" in result.stdout
    _, forked = project.cli_json("status", "r-fork")
    assert forked["state"] == {"x": 10, "y": 20}
    assert project.executions() == ["first", "double", "double"]  # only b ran in the fork

    _, after = project.cli_json("status", "r-orig")
    assert after == orig
    assert len(project.records("r-orig")) == len(before)
    assert project.cli("verify", "r-fork").exit_code == 0

    runs = project.cli("runs")
    assert re.search(rf"^r-fork\s+linear\s+COMPLETED\s.*r-orig@{at}$", runs.stdout,
                     re.MULTILINE)


def test_fork_json_and_usage_errors(project: Project) -> None:
    assert project.start(LINEAR, "r-fj").exit_code == 0
    result, data = project.cli_json("fork", "r-fj", "--at", "4", "--patch", '{"x": 3}')
    assert result.exit_code == 0
    assert set(data) == SPEC_KEYS and data["state"]["y"] == 6
    assert data["run_id"] in result.stderr and data["run_id"] != "r-fj"
    for args, message in [
        (["--at", "4", "--patch", "{nope"], "--patch is not valid JSON"),
        (["--at", "4", "--patch", "3"], "must be a JSON object"),
        (["--at", "999"], "cannot fork at 999"),
        (["--at", "4", "--set", "limits.bogus=3"], "bogus"),
        (["--at", "4", "--patch", '{"zz": 90}'], "does not know: zz"),  # as modify refuses
    ]:
        bad = project.cli("fork", "r-fj", *args)
        assert bad.exit_code == 2, (args, bad.output)
        assert message in bad.stderr, (args, bad.stderr)


REDUCED = """
workflow: reduced
state: {events: {reducer: append}, total: {reducer: add}, meta: {reducer: merge}}
nodes:
  a: {mod}:first
  gate: {approval: {show: [x], on_modify: [a]}}
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: END}
"""


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("events", "5", "a list"), ("total", '"abc"', "a number"), ("meta", "[1]", "an object"),
    ("events", '"urgent"', "a list"),  # not a list of its characters
])
def test_a_whole_value_of_the_wrong_kind_for_a_reducer_is_refused_before_anything_runs(
        project: Project, field: str, value: str, kind: str) -> None:
    wf = project.workflow(REDUCED)
    started = project.cli("run", wf, "--input", f'{{"{field}": {value}}}', "--run-id", "r-in")
    assert started.exit_code == 2, started.output
    assert f"field {field!r} has reducer" in started.stderr and kind in started.stderr
    assert project.cli("status", "r-in").exit_code == 2  # no run was created

    assert project.start(REDUCED, "r-mod").exit_code == 3
    modified = project.cli("resume", "r-mod", "--modify", f'{{"{field}": {value}}}')
    assert modified.exit_code == 2, modified.output
    assert f"field {field!r} has reducer" in modified.stderr
    assert project.cli("status", "r-mod").exit_code == 3  # still waiting, nothing decided
    assert project.cli("resume", "r-mod", "--approve").exit_code == 0

    forked = project.cli("fork", "r-mod", "--at", "4", "--patch", f'{{"{field}": {value}}}')
    assert forked.exit_code == 2, forked.output
    assert f"field {field!r} has reducer" in forked.stderr
    assert [r["run_id"] for r in project.cli_json("runs")[1]] == ["r-mod"]  # nor r-in, nor a fork


def test_a_cancelled_waiting_run_waits_no_more(project: Project) -> None:
    assert project.start(GATED, "r-cw").exit_code == 3
    assert project.cli("cancel", "r-cw").exit_code == 0
    _, data = project.cli_json("status", "r-cw")
    assert data["status"] == "CANCELLED" and data["waiting"] is None


# -- runs ------------------------------------------------------------------------------------


def test_runs_lists_filters_and_prints_json(project: Project) -> None:
    assert project.start(LINEAR, "r-done").exit_code == 0
    assert project.start(FAILING, "r-bad").exit_code == 1
    assert project.start(GATED, "r-wait").exit_code == 3

    table = project.cli("runs")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["run", "id", "workflow"]
    assert [line.split()[0] for line in lines[1:]] == ["r-wait", "r-bad", "r-done"]
    assert re.search(r"^r-bad\s+failing\s+FAILED\s+2\s+0\s+\d{4}-\d\d-\d\d", table.stdout,
                     re.MULTILINE)

    result, rows = project.cli_json("runs")
    assert result.exit_code == 0
    assert [r["run_id"] for r in rows] == ["r-wait", "r-bad", "r-done"]
    assert {"run_id", "workflow", "status", "steps", "tokens", "created_at", "updated_at",
            "parent_run", "parent_seq"} <= set(rows[0])
    assert rows[0]["waiting"]["node"] == "gate"

    _, completed = project.cli_json("runs", "--status", "completed")
    assert [r["run_id"] for r in completed] == ["r-done"]
    _, gated = project.cli_json("runs", "--workflow", "gated")
    assert [r["run_id"] for r in gated] == ["r-wait"]
    _, limited = project.cli_json("runs", "--limit", "1")
    assert len(limited) == 1
    none = project.cli("runs", "--status", "REJECTED")
    assert none.exit_code == 0 and none.stdout.strip() == "no runs"
    clash = project.cli("runs", "--waiting", "--status", "FAILED")
    assert clash.exit_code == 2


KILLED = """
import os, signal

def die(state):
    os.kill(os.getpid(), signal.SIGKILL)  # the run's process is killed mid-node
"""


def test_runs_marks_a_run_whose_process_was_killed_as_interrupted(
        make_project: Callable[..., Project], project: Project) -> None:
    """`runs` is where a user looks first: a run left RUNNING by a killed process is
    marked as `status` says it (it was listed as plain RUNNING)."""
    assert project.start(LINEAR, "r-done").exit_code == 0
    killer = make_project(KILLED, "killed_nodes")
    flow = killer.workflow("""
        workflow: dies
        nodes: {d: "{mod}:die"}
        edges: [{from: START, to: d}, {from: d, to: END}]
    """, "dies.yaml")
    done = subprocess.run([sys.executable, "-m", "interlock", "run", flow, "--run-id", "r-dead",
                           "--store", project.store], cwd=project.root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    listed = project.cli("runs")
    assert listed.exit_code == 0
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "RUNNING (interrupted)" in rows["r-dead"]
    assert "interrupted" not in rows["r-done"]
    assert ("(interrupted): no process executes the run any more (its process stopped or was "
            "killed); continue it with `interlock resume RUN_ID --store "
            f"{project.store}`") in listed.stderr
    _, rows_json = project.cli_json("runs")  # the JSON keeps the stored status
    assert [r["status"] for r in rows_json] == ["RUNNING", "COMPLETED"]
    assert "interrupted: no process is executing it" in project.cli("status", "r-dead").stdout


# -- unknown runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["status", "nope"], ["resume", "nope"], ["resume", "nope", "--approve"],
    ["trace", "nope"], ["trace", "nope", "--json"], ["verify", "nope"],
    ["fork", "nope", "--at", "1"],
])
def test_unknown_run_exits_2(project: Project, args: list[str]) -> None:
    assert project.start(LINEAR, "r-there").exit_code == 0  # a store, without that run
    result = project.cli(*args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "no run 'nope'" in result.stderr


def test_a_reader_that_goes_away_neither_stops_the_run_nor_changes_its_exit_status(
        tmp_path: Path) -> None:
    """`interlock run ... 2>&1 | head -1`: the pipe closes after the first line. The run
    goes on unprinted and completes, and the exit status is the run's (it used to die
    at its next progress line, left RUNNING, exit 1)."""
    root = Path(__file__).resolve().parents[2]  # the example's nodes import from here
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock", "run", "examples/triage/workflow.yaml", "--input",
         '{"scenario": "disk-full"}', "--store", f"sqlite:///{tmp_path}/runs.db",
         "--run-id", "piped"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
    finally:
        proc.stdout.close()
    assert b"run piped started" in first, first
    assert proc.wait(timeout=60) == 0

    async def status() -> str:
        async with open_store(f"sqlite:///{tmp_path}/runs.db") as st:
            return (await st.get_run("piped")).summary.status

    assert asyncio.run(status()) == "COMPLETED"
