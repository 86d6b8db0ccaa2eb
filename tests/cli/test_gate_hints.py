"""What people are told at a gate, from the command line: an ``unknown_outcome`` gate (a
process SIGKILLed while an approved action ran) is unmistakable in ``resume``'s hint,
``status``, ``runs --waiting`` and ``interlock chat`` -- when it started as UTC time,
the action and its arguments, that approving runs it AGAIN, that rejecting records it
as not done, and ``--approve --data '{"result": ...}'`` for the outcome checked by hand;
a failure that a resume can never fix is said to be final and a resume of it is refused
without a record; a gate past its deadline points to ``interlock resume``; code drift is
shown before a decision; a branch beside a gate whose executor was killed is said to be
interrupted. The kills are real: the node SIGKILLs its own process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from _workflows import kchat, tool_call
from click.testing import CliRunner
from conftest import CliProject
from test_chat_live_server import Chat
from test_server import Served, pythonpath

from interlock.cli import cli

NODES = '''
import os, signal

def _once_killed(name):
    with open(name + ".log", "a") as f:
        f.write(name + "\\n")
    if os.path.exists("kill.me"):  # the process dies in the middle of the action
        os.remove("kill.me")
        os.kill(os.getpid(), signal.SIGKILL)

def fix(state):
    _once_killed("fix")
    return {"fixed": True}

def wipe(disk: str) -> str:
    """Wipe a disk."""
    _once_killed("wipe")
    return f"wiped {disk}"

def prep(state):
    return {"ready": True}

def plan(state):
    return {"targets": ["t0", "t1"]}

def deploy(state):
    _once_killed("deploy")
    return {"deployed": state["target"]}

def found(state):
    return {"found": state["incident"]["id"]}

def beside(state):
    """Killed once the gate beside it is recorded: the executor dies at work beside it."""
    import sqlite3, time
    if os.path.exists("kill.me"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with sqlite3.connect("runs.db") as db:
                if db.execute("SELECT 1 FROM records WHERE type = 'approval.requested'"
                              ).fetchall():
                    break
            time.sleep(0.01)
        os.remove("kill.me")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"slowed": True}
'''

ONE = """
    workflow: one
    nodes: {fix: {call: "{mod}:fix", confirm: true}}
    edges: [{from: START, to: fix}, {from: fix, to: END}]
"""

CHAT = kchat('[{call: "{mod}:wipe", confirm: true}]', tool_call("wipe", disk="sda"), "wiped")

UTC = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def killed(p: CliProject, *args: str) -> None:
    """``interlock ARGS`` in a process of its own, which the node SIGKILLs."""
    (p.root / "kill.me").touch()
    done = subprocess.run([sys.executable, "-m", "interlock", *args, "--store", p.store],
                          cwd=p.root, env={**os.environ, "PYTHONPATH": pythonpath(p.root)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, (done.returncode, done.stderr)


def lines(p: CliProject, name: str) -> int:
    log = p.root / f"{name}.log"
    return len(log.read_text().split()) if log.exists() else 0


def unknown_outcome(p: CliProject, run_id: str) -> Any:
    """``run_id`` of ONE, approved, its action killed mid-way, resumed: the run waits at
    its unknown_outcome gate. The resume's output."""
    assert p.start(ONE, run_id).exit_code == 3
    killed(p, "resume", run_id, "--approve", "--by", "al")
    resumed = p.cli("resume", run_id)
    assert resumed.exit_code == 3, resumed.output
    return resumed


def said_plainly(text: str, node: str = "node 'fix'") -> None:
    assert "OUTCOME UNKNOWN" in text
    assert f"{node} was approved and started" in text
    assert "the process running it died" in text
    assert UTC.search(text), text  # when it started, readable (not an epoch float)
    assert not re.search(r"\d{10}\.\d+", text), text
    assert "runs it AGAIN" in text
    assert "records it as not done" in text
    assert "--data '{\"result\":" in text


def test_an_unknown_outcome_is_unmistakable_in_the_hint_status_and_runs(
        make_project: Any) -> None:
    p = make_project(NODES)
    resumed = unknown_outcome(p, "u1")
    said_plainly(resumed.output)
    assert "--approve --data '{\"result\": {\"FIELD\": \"VALUE\"}}'" in resumed.output

    status = p.cli("status", "u1")
    said_plainly(status.output)
    assert "interlock resume u1 --gate fix --approve --data '{\"result\":" in status.output

    plain = p.cli("resume", "u1")  # refused: a decision is needed, and it says which
    assert plain.exit_code == 2 and "runs it AGAIN" in plain.output, plain.output

    runs = p.cli("runs", "--waiting")
    assert "fix (OUTCOME UNKNOWN)" in runs.stdout
    said_plainly(runs.stderr)
    assert "interlock resume u1 --gate fix --approve | --reject | --approve --data" \
        in runs.stderr
    assert f"--by NAME --store {p.store})" in runs.stderr  # the store it was listed from

    # the outcome checked by hand: recorded, the action not run again
    done = p.cli("resume", "u1", "--gate", "fix", "--approve", "--by", "al", "--data",
                 '{"result": {"fixed": "by hand"}}')
    assert done.exit_code == 0, done.output
    assert lines(p, "fix") == 1
    _, state = p.cli_json("status", "u1")
    assert state["state"]["fixed"] == "by hand"


def test_a_rejected_unknown_outcome_is_final_and_resume_refuses_it_recording_nothing(
        make_project: Any) -> None:
    p = make_project(NODES)
    unknown_outcome(p, "u2")
    rejected = p.cli("resume", "u2", "--gate", "fix", "--reject", "--by", "al")
    assert rejected.exit_code == 1, rejected.output
    status = p.cli("status", "u2")
    assert "this failure is final" in status.output
    assert "interlock fork u2" in status.output and "--at SEQ" in status.output
    assert "run the failed node again" not in status.output
    before = p.seqs("u2")
    for _ in range(2):
        again = p.cli("resume", "u2")
        assert again.exit_code == 2, again.output
        assert "failed for good" in again.output and "interlock fork u2" in again.output
    assert p.seqs("u2") == before  # no run.resumed / node.failed / run.failed appended
    assert lines(p, "fix") == 1


def test_interlock_chat_shows_a_guarded_tool_whose_outcome_is_unknown(
        make_project: Any) -> None:
    p = make_project(NODES)
    chat = p.workflow(CHAT, "kchat.yaml")
    assert p.cli("run", chat, "--run-id", "k1").exit_code == 3
    asked = p.cli("send", "k1", "wipe sda")
    assert asked.exit_code == 3, asked.output
    killed(p, "resume", "k1", "--approve", "--by", "al")
    assert p.cli("resume", "k1").exit_code == 3
    opened = CliRunner().invoke(cli, ["chat", chat, "--session", "k1", "--store", p.store],
                                input="", catch_exceptions=False)
    text = opened.stderr
    said_plainly(text.replace("/approve:", "approve:").replace("/reject:", "reject:"),
                 node="tool 'wipe' (called by node 'a')")
    assert '{"disk": "sda"}' in text
    assert "/approve: runs it AGAIN" in text
    assert "interlock resume k1 --gate a --approve --data '{\"result\": " in text
    assert lines(p, "wipe") == 1


def test_a_gate_past_its_deadline_offers_resume_not_a_decision(make_project: Any) -> None:
    p = make_project(NODES)
    started = p.start("""
        workflow: to
        nodes: {a: {approval: {show: [], timeout: 1ms, on_timeout: reject}},
                b: {approval: {show: []}}}
        edges: [{from: START, to: [a, b]}, {from: a, to: END}, {from: b, to: END}]
    """, "to1")
    assert started.exit_code == 3
    status = p.cli("status", "to1")
    assert "'a' passed its deadline" in status.output
    assert f"`interlock resume to1 --store {p.store}` applies its on_timeout" in status.output
    assert "--gate a --approve" not in status.output
    assert "--gate a --reject" not in status.output
    runs = p.cli("runs", "--waiting")
    assert f"`interlock resume to1 --store {p.store}` applies its on_timeout" in runs.output
    assert p.cli("resume", "to1").exit_code == 4  # the one command that works: rejected


def test_status_shows_code_drift_before_a_decision(make_project: Any) -> None:
    p = make_project(NODES)
    assert p.start("""
        workflow: drift
        nodes: {g: {approval: {show: []}}, fix: "{mod}:fix"}
        edges: [{from: START, to: g}, {from: g, to: fix}, {from: fix, to: END}]
    """, "d1").exit_code == 3
    assert "code changed" not in p.cli("status", "d1").output
    module = p.root / f"{p.mod}.py"
    module.write_text(module.read_text() + "\n# changed after the run started\n")
    status = p.cli("status", "d1")
    assert "code changed since the run started: fix" in status.output
    assert json.loads(p.cli("status", "d1", "--json").stdout)["code_changed"] == ["fix"]


def test_status_says_a_branch_beside_a_gate_is_interrupted_once_its_executor_is_killed(
        make_project: Any) -> None:
    p = make_project(NODES)
    wf = p.workflow("""
        workflow: beside
        nodes: {a: "{mod}:prep", s: "{mod}:beside", g: {approval: {show: []}}}
        edges: [{from: START, to: a}, {from: a, to: [s, g]}, {from: [s, g], to: END}]
    """)
    killed(p, "run", str(Path(p.root / wf)), "--run-id", "b1")
    status = p.cli("status", "b1")
    assert "interrupted beside the gate: s" in status.output, status.output
    assert "still running" not in status.output
    assert f"continue it with `interlock resume b1 --store {p.store}`" in status.output
    resumed = p.cli("resume", "b1")  # what it says works: the branch runs, the gate waits
    assert resumed.exit_code == 3, resumed.output
    assert "still running" not in p.cli("status", "b1").output


GATED = """
    workflow: gated
    input: [incident]
    nodes:
      found: "{mod}:found"
      approval: {approval: {show: [found]}}
    edges: [{from: START, to: found}, {from: found, to: approval}, {from: approval, to: END}]
"""

FLEET = """
    workflow: fleet
    nodes:
      plan: "{mod}:plan"
      remediate: {workflow: gated.yaml, input: {incident: "{'id': target}"}, output: [found]}
    edges:
      - {from: START, to: plan}
      - {from: plan, map: 'targets', to: remediate, as: target, collect: done}
      - {from: remediate, to: END}
"""


def test_a_mapped_child_rejected_is_final_and_resume_refuses_it_recording_nothing(
        make_project: Any) -> None:
    p = make_project(NODES)
    p.workflow(GATED, "gated.yaml")
    assert p.start(FLEET, "f1").exit_code == 3
    rejected = p.cli("resume", "f1", "--gate", "remediate[0]/approval", "--reject", "--by",
                     "al")
    assert rejected.exit_code == 1, rejected.output
    _, out = p.cli_json("status", "f1")
    assert out["error"]["type"] == "child_failed", out["error"]
    status = p.cli("status", "f1")
    assert "this failure is final" in status.output and "was rejected" in status.output
    assert "interlock fork f1" in status.output
    before = p.seqs("f1")
    again = p.cli("resume", "f1")
    assert again.exit_code == 2 and "failed for good" in again.output, again.output
    assert p.seqs("f1") == before


def test_interlock_chat_server_shows_a_guarded_tool_whose_outcome_is_unknown(
        make_project: Any, monkeypatch: Any) -> None:
    for name in ("INTERLOCK_SERVER", "INTERLOCK_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    p = make_project(NODES)
    (p.root / "flows").mkdir()
    chat = p.workflow(CHAT, "flows/kchat.yaml")
    assert p.cli("run", chat, "--run-id", "k2").exit_code == 3
    assert p.cli("send", "k2", "wipe sda").exit_code == 3
    killed(p, "resume", "k2", "--approve", "--by", "al")
    assert p.cli("resume", "k2").exit_code == 3
    server = Served(p.root)
    remote = Chat(p.root, chat, "--server", server.url, "--session", "k2")
    try:
        remote.stderr_has("OUTCOME UNKNOWN: tool 'wipe' (called by node 'a')")
        remote.stderr_has("/approve: runs it AGAIN")
        remote.stderr_has("/reject: records it as not done")
        data = remote.stderr_has("--approve --data '{\"result\": ")
        assert f"--server {server.url}" in data  # a command that reaches the same run
        assert remote.finish() in (0, 3)
        assert UTC.search("".join(remote.err))
    finally:
        remote.close()
        server.stop()
    assert lines(p, "wipe") == 1


ROLLOUT = """
    workflow: rollout
    nodes:
      plan: "{mod}:plan"
      deploy: {call: "{mod}:deploy", confirm: true}
    edges:
      - {from: START, to: plan}
      - {from: plan, map: 'targets', to: deploy, as: target, collect: deployed}
      - {from: deploy, to: END}
"""


def test_a_map_items_unknown_outcome_is_explained_beside_the_other_items_gates(
        make_project: Any) -> None:
    p = make_project(NODES)
    assert p.start(ROLLOUT, "m1").exit_code == 3
    killed(p, "resume", "m1", "--gate", "deploy[0]", "--approve", "--by", "al")
    resumed = p.cli("resume", "m1")
    assert resumed.exit_code == 3, resumed.output
    status = p.cli("status", "m1")
    said_plainly(status.output, node="item 'deploy[0]'")
    assert '"target": "t0"' in status.output  # the item's arguments
    runs = p.cli("runs", "--waiting")
    assert "deploy[0] (OUTCOME UNKNOWN)" in runs.stdout
    assert "item 'deploy[0]' was approved and started" in runs.stderr
    rejected = p.cli("resume", "m1", "--gate", "deploy[0]", "--reject", "--by", "al")
    assert lines(p, "deploy") == 1, rejected.output  # recorded as not done, not run again
