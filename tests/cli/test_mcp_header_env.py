"""An MCP server header that reads a `${VAR}` unset in this process follows an agent's
API key's rule: `validate` warns (naming the node, the header, the variable and the
file:line), and `run` and a local `chat` refuse before anything is recorded -- the run
would fail only when it reached the agent, after the nodes before it ran."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner
from conftest import CliProject

from interlock.cli import cli

NODES = '''
def intake(state):
    with open("executions.log", "a") as f:
        f.write("intake\\n")
    return {"ticket": "t-1"}
'''

FLOW = """
workflow: fixer
nodes:
  intake: {mod}:intake
  fix:
    agent:
      provider: scripted
      prompt: "{{ ticket }}"
      replies: [done]
      tools:
        - mcp:
            url: http://127.0.0.1:9/mcp
            headers: {Authorization: "Bearer ${R41_TOOLS_TOKEN}"}
edges:
  - {from: START, to: intake}
  - {from: intake, to: fix}
"""

SAID = ("node 'fix': the header 'Authorization' of the MCP server http://127.0.0.1:9/mcp "
        "reads ${R41_TOOLS_TOKEN}, which is not set in this environment")


@pytest.fixture
def project(make_project: Callable[..., CliProject], monkeypatch: pytest.MonkeyPatch
            ) -> CliProject:
    monkeypatch.delenv("R41_TOOLS_TOKEN", raising=False)
    return make_project(NODES)


def test_validate_warns_naming_the_header_the_variable_and_the_line(
        project: CliProject, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = project.workflow(FLOW)
    out = CliRunner().invoke(cli, ["validate", wf])
    assert out.exit_code == 0, out.output
    assert f"wf.yaml:13:23: warning: {SAID}" in out.output
    assert "export R41_TOOLS_TOKEN=..." in out.output
    monkeypatch.setenv("R41_TOOLS_TOKEN", "t0ken")
    out = CliRunner().invoke(cli, ["validate", wf])
    assert out.exit_code == 0 and "warning" not in out.output


def test_run_refuses_before_recording_anything(project: CliProject) -> None:
    out = project.cli("run", project.workflow(FLOW), "--run-id", "h1")
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: the run was not started (nothing is recorded)")
    assert SAID in out.output and "interlock run wf.yaml ... --detach" in out.output
    assert project.executions() == []  # intake did not run
    assert not project.db.exists()  # nothing recorded: not even a store


def test_a_local_chat_refuses(project: CliProject) -> None:
    chat = project.workflow(FLOW.replace("workflow: fixer", "workflow: fixer\nchat: fix")
                            .replace('      prompt: "{{ ticket }}"\n', ""), "talk.yaml")
    out = CliRunner().invoke(cli, ["chat", chat, "--store", project.store], input="hello\n")
    assert out.exit_code == 2, out.output
    assert SAID in out.output
    assert "interlock chat talk.yaml --server URL" in out.output


def test_a_foreground_resume_refuses_too(project: CliProject) -> None:
    wf = project.workflow(FLOW)
    detached = project.cli("run", wf, "--run-id", "h2", "--detach")  # for a worker
    assert detached.exit_code == 0, detached.output
    out = project.cli("resume", "h2")
    assert out.exit_code == 2, out.output
    assert SAID in out.output and "nothing is recorded" in out.output
    assert project.executions() == []  # intake did not run
