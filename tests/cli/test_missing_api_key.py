"""An agent node whose API key variable is unset: `validate` warns, `run` (and a local
`chat`) refuse before anything is recorded -- the run would fail only when it reached
the agent, after the nodes before it ran. `run --detach` records the run for a worker,
whose environment may have the key."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner
from conftest import CliProject

from interlock.cli import cli

NODES = '''
import os


def intake(state):
    with open("executions.log", "a") as f:
        f.write("intake\\n")
    return {"ticket": "t-1"}
'''

FLOW = """
workflow: keyed
nodes:
  intake: {mod}:intake
  rca:
    agent:
      model: gpt-test
      prompt: "{{ ticket }}"
      API_KEY_ENV
edges:
  - {from: START, to: intake}
  - {from: intake, to: rca}
"""


@pytest.fixture
def project(make_project: Callable[..., CliProject], monkeypatch: pytest.MonkeyPatch
            ) -> CliProject:
    for var in ("OPENAI_API_KEY", "TEAM_LLM_KEY"):
        monkeypatch.delenv(var, raising=False)
    return make_project(NODES)


def flow(p: CliProject, key_env: str | None = None) -> str:
    return p.workflow(FLOW.replace("API_KEY_ENV", f"api_key_env: {key_env}" if key_env
                                   else ""))


def test_validate_warns_naming_the_node_and_the_variable(project: CliProject) -> None:
    out = CliRunner().invoke(cli, ["validate", flow(project)])
    assert out.exit_code == 0 and "ok: wf.yaml" in out.output
    assert ("wf.yaml:6:5: warning: node 'rca': no API key: $OPENAI_API_KEY is not set in "
            "this environment") in out.output
    assert "export OPENAI_API_KEY=... (or name another variable with api_key_env)" \
        in out.output


def test_a_named_variable_is_the_one_checked(project: CliProject,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    out = CliRunner().invoke(cli, ["validate", flow(project, "TEAM_LLM_KEY")])
    assert "wf.yaml:9:7: warning: node 'rca': no API key: $TEAM_LLM_KEY" in out.output
    monkeypatch.setenv("TEAM_LLM_KEY", "sk-team")
    out = CliRunner().invoke(cli, ["validate", flow(project, "TEAM_LLM_KEY")])
    assert out.exit_code == 0 and "warning" not in out.output


def test_run_refuses_before_recording_anything(project: CliProject) -> None:
    out = project.cli("run", flow(project), "--run-id", "r1")
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: the run was not started (nothing is recorded)")
    assert "node 'rca': no API key: $OPENAI_API_KEY is not set" in out.output
    assert "interlock run wf.yaml ... --detach" in out.output
    assert project.executions() == []  # intake did not run
    status = project.cli("status", "r1")  # (not even a store was made)
    assert status.exit_code == 2 and f"no store at {project.db}" in status.output


def test_run_detach_records_it_for_a_worker_that_has_the_key(project: CliProject) -> None:
    out = project.cli("run", flow(project), "--run-id", "r2", "--detach")
    assert out.exit_code == 0, out.output
    assert "warning: node 'rca': no API key" in out.output
    assert "PENDING" in project.cli("status", "r2").output


def test_with_the_key_set_the_run_starts(project: CliProject,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # refused: fails fast
    out = project.cli("run", flow(project), "--run-id", "r3")
    assert "not started" not in out.output and project.executions() == ["intake"]


def test_a_sub_workflows_agent_counts_too(project: CliProject) -> None:
    project.workflow(FLOW.replace("API_KEY_ENV", ""), "child.yaml")
    parent = project.workflow("""
        workflow: parent
        nodes:
          sub: {workflow: child.yaml}
        edges:
          - {from: START, to: sub}
    """, "parent.yaml")
    out = project.cli("run", parent)
    assert out.exit_code == 2 and "not started" in out.output
    assert "node 'sub': its sub-workflow 'child.yaml'" in out.output
    assert "$OPENAI_API_KEY" in out.output and project.executions() == []


def test_a_local_chat_refuses_and_says_a_server_may_have_it(project: CliProject) -> None:
    chat = project.workflow("""
        workflow: talk
        chat: assistant
        nodes:
          assistant:
            agent: {model: gpt-test}
    """, "talk.yaml")
    out = CliRunner().invoke(cli, ["chat", chat, "--store", project.store], input="hello\n")
    assert out.exit_code == 2, out.output
    assert "node 'assistant': no API key: $OPENAI_API_KEY" in out.output
    assert "interlock chat talk.yaml --server URL" in out.output
