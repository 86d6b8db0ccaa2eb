"""What a failed run's hint offers must be able to work. A node error the pinned
definition causes (an agent's `AgentConfigError`: a scripted provider out of replies, an
MCP server without a tool it names, a bad template) fails the same way on every
`resume`, so the hint says to fix the file and `migrate` the run onto it -- and doing
that works. An error of this process's environment (`AgentEnvironmentError`: an API key,
an MCP header's variable) is fixed by setting it, then resuming. A `memory://` run is
gone with its process: its hints name no command that reads it again."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import CliRunner
from conftest import CliProject

from interlock.cli import cli
from interlock.cli._gate_hints import failed_hint

AGENT = """
workflow: scripted
nodes:
  a:
    agent:
      provider: scripted
      prompt: hello
      replies: {replies}
edges: [{{from: START, to: a}}, {{from: a, to: END}}]
"""


def test_a_failure_the_definition_causes_says_fix_then_migrate(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project("")
    wf = p.workflow(AGENT.format(replies="[]"))
    failed = p.cli("run", wf, "--run-id", "s1")
    assert failed.exit_code == 1, failed.output
    assert "run the failed node again" not in failed.output
    hint = "Fix the workflow file, move the run onto it with `interlock migrate s1 --to FILE"
    assert hint in failed.output
    again = p.cli("resume", "s1")  # what the hint says: the same failure
    assert again.exit_code == 1 and hint in again.output, again.output
    p.workflow(AGENT.format(replies="[done]"))  # fixed
    assert p.cli("migrate", "s1", "--to", wf, "--by", "ops").exit_code == 0
    done = p.cli("resume", "s1")
    assert done.exit_code == 0, done.output


def test_a_memory_run_names_no_command_that_cannot_reach_it(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project("")
    wf = p.workflow(AGENT.format(replies="[]"))
    failed = CliRunner().invoke(cli, ["run", wf, "--store", "memory://"])
    assert failed.exit_code == 1, failed.output
    assert "--store memory://" not in failed.output
    assert "gone with this process" in failed.output
    assert "error.details.traceback" in failed.output  # (where it is: --json prints it)


def test_an_environment_error_says_set_it_then_resume() -> None:
    error = {"type": "node_error", "node": "a", "details": {
        "exception": "AgentEnvironmentError",
        "mro": ["AgentEnvironmentError", "AgentConfigError", "AgentError"]}}
    hint = failed_hint("r1", error, " --store sqlite:///x.db")
    assert hint.startswith("set what the error names in the environment")
    assert "`interlock resume r1 --store sqlite:///x.db`" in hint


def test_a_memory_run_at_a_gate_names_no_command_that_cannot_reach_it(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project("")
    wf = p.workflow("""
workflow: gated
nodes: {gate: {approval: {}}}
edges: [{from: START, to: gate}, {from: gate, to: END}]
""")
    waiting = CliRunner().invoke(cli, ["run", wf, "--store", "memory://"])
    assert waiting.exit_code == 3, waiting.output
    assert "--store memory://" not in waiting.output
    assert "nothing can decide it" in waiting.output
