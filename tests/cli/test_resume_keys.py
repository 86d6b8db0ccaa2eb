"""A foreground `interlock resume` of a run that may reach an agent node whose API key
variable is unset here refuses before anything is recorded (exit 2), as `run` does:
it would fail at the agent after the nodes before it ran. `resume --detach` records the
resume for a worker or server, whose environment may have the key. An agent the run can
no longer reach (a gate decided after it) does not stop a resume."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import CliProject

NODES = '''
def intake(state):
    with open("executions.log", "a") as f:
        f.write("intake\\n")
    return {"ticket": "t-1"}


def finish(state):
    with open("executions.log", "a") as f:
        f.write("finish\\n")
    return {"done": True}
'''

# intake, then the agent (a run recorded with --detach, resumed here)
CHAIN = """
workflow: keyed
nodes:
  intake: {call: {mod}:intake, writes: [ticket]}
  rca:
    agent: {model: gpt-test, prompt: "{{ ticket }}"}
edges:
  - {from: START, to: intake}
  - {from: intake, to: rca}
"""

# a gate before the agent: deciding it reaches the agent
GATE_FIRST = """
workflow: gatefirst
nodes:
  intake: {call: {mod}:intake, writes: [ticket]}
  gate: {approval: {show: [ticket]}}
  rca:
    agent: {model: gpt-test, prompt: "{{ ticket }}"}
edges:
  - {from: START, to: intake}
  - {from: intake, to: gate}
  - {from: gate, to: rca}
"""

# the agent on a branch the run did not take: the gate's way on never reaches it
AGENT_PASSED = """
workflow: passed
nodes:
  intake: {call: {mod}:intake, writes: [ticket]}
  rca:
    agent: {model: gpt-test, prompt: "{{ ticket }}"}
  gate: {approval: {show: [ticket]}}
  finish: {call: {mod}:finish, writes: [done]}
edges:
  - {from: START, to: intake}
  - {from: intake, to: rca, when: 'ticket == "never"'}
  - {from: intake, to: gate, otherwise: true}
  - {from: gate, to: finish}
"""


@pytest.fixture
def project(make_project: Callable[..., CliProject], monkeypatch: pytest.MonkeyPatch
            ) -> CliProject:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    return make_project(NODES)


def _records(p: CliProject, run_id: str) -> int:
    return len(p.records(run_id))


def _waiting_at_gate(p: CliProject, flow: str, run_id: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_id`` of ``flow`` started with a key (``run`` would refuse without), then the
    key unset: the run waits at its gate."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = p.cli("run", p.workflow(flow), "--run-id", run_id)
    assert out.exit_code == 3, out.output
    monkeypatch.delenv("OPENAI_API_KEY")


def test_a_resume_that_reaches_an_agent_without_its_key_is_refused(
        project: CliProject) -> None:
    """Before, the resume ran intake and failed at the agent (exit 1)."""
    out = project.cli("run", project.workflow(CHAIN), "--run-id", "r1", "--detach")
    assert out.exit_code == 0, out.output
    before = _records(project, "r1")
    out = project.cli("resume", "r1")
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: run r1 was not continued (nothing is recorded): "
                                 "an agent node it may reach from where it stopped has no "
                                 "API key here"), out.output
    assert "node 'rca': no API key: $OPENAI_API_KEY is not set" in out.output
    assert "interlock resume r1 ... --detach" in out.output
    assert project.executions() == [] and _records(project, "r1") == before
    # --detach records it (a worker with the key continues it)
    out = project.cli("resume", "r1", "--detach")
    assert out.exit_code == 0, out.output
    assert project.executions() == []


def test_a_decision_whose_way_on_reaches_the_agent_is_refused(
        project: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    _waiting_at_gate(project, GATE_FIRST, "r2", monkeypatch)
    before = _records(project, "r2")
    out = project.cli("resume", "r2", "--gate", "gate", "--approve")
    assert out.exit_code == 2, out.output
    assert "run r2 was not continued" in out.output
    assert "record the decision for a worker or server" in out.output
    assert _records(project, "r2") == before
    assert "WAITING_APPROVAL" in project.cli("status", "r2").output
    out = project.cli("resume", "r2", "--gate", "gate", "--approve", "--detach")
    assert out.exit_code == 0, out.output


def test_an_agent_the_run_no_longer_reaches_does_not_stop_a_resume(
        project: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    _waiting_at_gate(project, AGENT_PASSED, "r3", monkeypatch)
    out = project.cli("resume", "r3", "--gate", "gate", "--approve")
    assert out.exit_code == 0, out.output
    assert project.executions() == ["intake", "finish"]
