"""Destructive actions are never repeated silently (SPEC §3): a real process is
SIGKILLed while an approved ``confirm: true`` node runs (a marker file says it started);
``resume`` then stops the run at an ``unknown_outcome`` gate: reject records it as not
done (the action is not run again), approve runs it again, ``--data`` records the
outcome a person checked by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _harness import wait_for
from conftest import CliProject

NODES = """
import os
import pathlib
import time


def prepare(state):
    return {"amount": 100}


def pay(state):
    # the side effect, then a hang: the test kills the process here
    with open("paid.log", "a") as f:
        f.write("paid\\n")
    pathlib.Path("pay_started.marker").write_text("started")
    if os.environ.get("PAY_HANGS") == "1":
        time.sleep(120)
    return {"paid": True}


def after(state):
    return {"after": True}


def handle(state):
    return {"handled": state["error"]["type"]}
"""

FLOW = """
workflow: payments
nodes:
  prepare: {mod}:prepare
  pay: {call: {mod}:pay, confirm: true, reads: [amount]}
  after: {mod}:after
edges:
  - {from: START, to: prepare}
  - {from: prepare, to: pay}
  - {from: pay, to: after}
"""

CAUGHT = (FLOW + """
  - {from: pay, to: handle, on_error: [UnknownOutcome]}
""").replace("  after: {mod}:after\n", "  after: {mod}:after\n  handle: {mod}:handle\n")


def _kill_while_paying(p: CliProject, tmp_path: Path, wf: str, run_id: str) -> None:
    """Run to the gate, approve it in a real process, SIGKILL it inside ``pay``."""
    started = p.cli("run", wf, "--run-id", run_id)
    assert started.exit_code == 3, started.output
    env = {**os.environ, "PAY_HANGS": "1", "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock", "resume", run_id, "--approve", "--by", "ann",
         "--store", p.store], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "pay_started.marker").exists(), "pay started",
                 alive=proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    (tmp_path / "pay_started.marker").unlink()
    assert _paid(tmp_path) == 1


def _paid(tmp_path: Path) -> int:
    log = tmp_path / "paid.log"
    return len(log.read_text().split()) if log.exists() else 0


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> CliProject:
    return make_project(NODES)


def _stopped_at_unknown_outcome(p: CliProject, run_id: str) -> dict[str, object]:
    result, out = p.cli_json("resume", run_id)
    assert result.exit_code == 3, result.output
    assert out["status"] == "WAITING_APPROVAL"
    waiting = out["waiting"]
    assert waiting["kind"] == "unknown_outcome" and waiting["node"] == "pay"
    assert waiting["show"]["action"] == "pay"
    assert waiting["show"]["arguments"] == {"amount": 100}
    assert isinstance(waiting["show"]["started_at"], float)
    assert [g["kind"] for g in waiting["pending"]] == ["unknown_outcome"]
    # every surface shows it: status (text), runs --waiting
    status = p.cli("status", run_id)
    assert "pay" in status.output and status.exit_code == 3
    listed, rows = p.cli_json("runs", "--waiting")
    assert listed.exit_code == 0, listed.output
    assert any(r["run_id"] == run_id and r["waiting"]["kind"] == "unknown_outcome"
               for r in rows)
    return waiting


def test_rejected_unknown_outcome_is_not_run_again(project: CliProject,
                                                   tmp_path: Path) -> None:
    p = project
    _kill_while_paying(p, tmp_path, p.workflow(FLOW), "pay-1")
    _stopped_at_unknown_outcome(p, "pay-1")
    assert _paid(tmp_path) == 1  # the resume itself did not run it again
    result, out = p.cli_json("resume", "pay-1", "--reject", "--by", "ann",
                             "--comment", "the bank says it did not go through")
    assert result.exit_code == 1, result.output  # failed: recorded as not done
    assert out["error"]["type"] == "unknown_outcome"
    assert _paid(tmp_path) == 1
    assert p.cli("verify", "pay-1").exit_code == 0


def test_approved_unknown_outcome_runs_again(project: CliProject, tmp_path: Path) -> None:
    p = project
    _kill_while_paying(p, tmp_path, p.workflow(FLOW), "pay-2")
    _stopped_at_unknown_outcome(p, "pay-2")
    result, out = p.cli_json("resume", "pay-2", "--approve", "--by", "ann")
    assert result.exit_code == 0, result.output
    assert out["state"]["paid"] is True and out["state"]["after"] is True
    assert _paid(tmp_path) == 2
    assert p.cli("verify", "pay-2").exit_code == 0


def test_unknown_outcome_checked_by_hand(project: CliProject, tmp_path: Path) -> None:
    p = project
    _kill_while_paying(p, tmp_path, p.workflow(FLOW), "pay-3")
    _stopped_at_unknown_outcome(p, "pay-3")
    bad = p.cli("resume", "pay-3", "--approve", "--data", '{"paid": true}')
    assert bad.exit_code == 2 and "result" in bad.output
    result, out = p.cli_json("resume", "pay-3", "--approve", "--by", "ann", "--data",
                             '{"result": {"paid": "by hand"}}')
    assert result.exit_code == 0, result.output
    assert out["state"]["paid"] == "by hand" and out["state"]["after"] is True
    assert _paid(tmp_path) == 1  # not run again
    assert p.cli("verify", "pay-3").exit_code == 0


def test_a_rejected_unknown_outcome_is_catchable(project: CliProject,
                                                 tmp_path: Path) -> None:
    p = project
    _kill_while_paying(p, tmp_path, p.workflow(CAUGHT), "pay-4")
    _stopped_at_unknown_outcome(p, "pay-4")
    result, out = p.cli_json("resume", "pay-4", "--reject", "--by", "ann")
    assert result.exit_code == 0, result.output
    assert out["state"]["handled"] == "UnknownOutcome"  # (the caught error's class)
    assert _paid(tmp_path) == 1
    records = p.records("pay-4")
    failed = [r for r in records if r["type"] == "node.failed" and r["node"] == "pay"]
    assert failed and failed[-1]["error"]["type"] == "unknown_outcome"
    assert json.dumps(failed[-1]["error"])  # (JSON, as every record)


# -- a guarded tool of an agent ------------------------------------------------------------

AGENT_NODES = """
import os
import pathlib
import time


def pay(amount: int) -> str:
    \"\"\"Pay an amount (destructive).\"\"\"
    with open("paid.log", "a") as f:
        f.write("paid\\n")
    pathlib.Path("pay_started.marker").write_text("started")
    if os.environ.get("PAY_HANGS") == "1":
        time.sleep(120)
    return f"paid {amount}"
"""

AGENT_FLOW = """
workflow: teller
nodes:
  teller:
    agent:
      provider: scripted
      prompt: pay the invoice
      tools:
        - {call: {mod}:pay, confirm: true}
      replies:
        - {content: "", tool_calls: [{name: pay, arguments: {amount: 100}}]}
        - "done"
edges:
  - {from: START, to: teller}
"""


def _agent_stopped(p: CliProject, run_id: str) -> dict[str, object]:
    result, out = p.cli_json("resume", run_id)
    assert result.exit_code == 3, result.output
    waiting = out["waiting"]
    assert waiting["kind"] == "unknown_outcome" and waiting["node"] == "teller"
    assert waiting["show"]["tool"] == "pay"
    assert waiting["show"]["arguments"] == {"amount": 100}
    assert isinstance(waiting["show"]["started_at"], float)
    return waiting


@pytest.mark.parametrize("decide, paid, answer", [
    (["--reject", "--by", "ann"], 1, "rejected"),
    (["--approve", "--by", "ann"], 2, "paid 100"),
    (["--approve", "--by", "ann", "--data", '{"result": "paid by hand"}'], 1, "paid by hand"),
], ids=["reject", "approve", "by-hand"])
def test_a_guarded_tool_with_an_unknown_outcome(
        make_project: Callable[..., CliProject], tmp_path: Path, decide: list[str],
        paid: int, answer: str) -> None:
    p = make_project(AGENT_NODES)
    _kill_while_paying(p, tmp_path, p.workflow(AGENT_FLOW), "teller-1")
    _agent_stopped(p, "teller-1")
    assert _paid(tmp_path) == 1
    result, out = p.cli_json("resume", "teller-1", *decide)
    assert result.exit_code == 0, result.output  # the agent carries on either way
    assert out["state"]["teller"] == "done"
    assert _paid(tmp_path) == paid
    # what the model was told about the call
    records = p.records("teller-1")
    requests = [r for r in records if r["type"] == "effect.recorded"
                and r.get("key") == "llm-1"]
    told = json.dumps(requests) + json.dumps(
        [r for r in records if r["type"] in ("tool.called", "tool.rejected")])
    assert answer in told or (answer == "rejected" and any(
        r["type"] == "tool.rejected" for r in records))
    assert p.cli("verify", "teller-1").exit_code == 0


# -- interrupted again after an approved re-run: asked again ----------------------------------


def _approve_and_kill(p: CliProject, tmp_path: Path, run_id: str) -> None:
    """Approve the unknown outcome in a real process and SIGKILL it inside the re-run."""
    env = {**os.environ, "PAY_HANGS": "1", "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock", "resume", run_id, "--approve", "--by", "ann",
         "--store", p.store], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        until = time.monotonic() + 60
        while not (tmp_path / "pay_started.marker").exists():
            assert proc.poll() is None, "the resume ended before pay ran again"
            assert time.monotonic() < until, "pay never ran again"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    (tmp_path / "pay_started.marker").unlink()


@pytest.mark.parametrize("what", ["node", "tool"])
def test_an_approved_rerun_interrupted_again_is_asked_about_again(
        make_project: Callable[..., CliProject], tmp_path: Path, what: str) -> None:
    """Killed while paying, approved to pay again, killed again while paying: the run
    waits at a second unknown_outcome gate (asked afresh, not run a third time on the
    first approval); rejected, the action ran exactly twice."""
    p = make_project(NODES if what == "node" else AGENT_NODES)
    wf = p.workflow(FLOW if what == "node" else AGENT_FLOW)
    run_id = f"again-{what}"
    _kill_while_paying(p, tmp_path, wf, run_id)
    first = (_stopped_at_unknown_outcome if what == "node" else _agent_stopped)(p, run_id)
    _approve_and_kill(p, tmp_path, run_id)
    assert _paid(tmp_path) == 2
    second = (_stopped_at_unknown_outcome if what == "node" else _agent_stopped)(p, run_id)
    assert _paid(tmp_path) == 2  # asked again, not run a third time
    show1, show2 = first["show"], second["show"]
    assert isinstance(show1, dict) and isinstance(show2, dict)
    assert show2["started_at"] != show1["started_at"]  # the re-run's own start
    result, out = p.cli_json("resume", run_id, "--reject", "--by", "ann")
    assert result.exit_code == (1 if what == "node" else 0), result.output
    assert out["status"] == ("FAILED" if what == "node" else "COMPLETED")
    assert _paid(tmp_path) == 2
    asked = [r for r in p.records(run_id) if r["type"] == "approval.requested"
             and r["kind"] == "unknown_outcome"]
    assert len(asked) == 2
    assert p.cli("verify", run_id).exit_code == 0
