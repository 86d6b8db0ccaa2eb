"""Papercuts of the first hour with the CLI (issue 33), each fixed and kept fixed: where
modules import from, a bad cron line in `triggers`, `status` of a PENDING run, the final
state printed, follow-up hints that keep --store / --server, did-you-mean for unknown
nodes, and `graph` drawing a child workflow's END inside its cluster."""

from __future__ import annotations

import os
import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

if TYPE_CHECKING:
    from conftest import CliProject

NODES = """
def a(state):
    return {"x": state["n"] + 1}

def b(state):
    return {"y": state["x"] * 2}
"""

GATED = """
workflow: gated
input: [n]
nodes:
  a: {call: '{mod}:a', writes: [x]}
  gate: {approval: {show: [x]}}
  b: {call: '{mod}:b', writes: [y]}
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: b, to: END}
"""


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    from interlock.cli import cli as group

    return CliRunner().invoke(group, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def project(make_project: Callable[..., CliProject]) -> CliProject:
    return make_project(NODES)


def test_a_module_that_does_not_import_says_where_modules_import_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = f"beside_{uuid.uuid4().hex[:8]}"
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / f"{mod}.py").write_text(NODES)
    (flows / "wf.yaml").write_text(textwrap.dedent(GATED).replace("{mod}", mod))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    try:
        done = cli("validate", str(flows / "wf.yaml"))
    finally:
        sys.modules.pop(mod, None)
    assert done.exit_code == 2
    assert (f"cannot import module {mod!r}: No module named {mod!r}; modules import from "
            f"the current directory ({elsewhere}) and PYTHONPATH: {mod!r} is in {flows} -- "
            f"run interlock from there, or PYTHONPATH={flows}") in done.output
    # a module found nowhere near: only where modules import from
    (flows / "wf.yaml").write_text(textwrap.dedent(GATED).replace("{mod}", "nowhere_mod"))
    done = cli("validate", str(flows / "wf.yaml"))
    assert "; modules import from the current directory" in done.output
    assert "run interlock from there" not in done.output


def test_triggers_on_a_bad_cron_line_is_an_error_not_a_traceback(project: CliProject
                                                                  ) -> None:
    name = project.workflow("""
        workflow: timed
        triggers:
          - {schedule: '61 * * * *'}
        nodes:
          a: {call: '{mod}:a', writes: [x]}
        edges:
          - {from: START, to: a}
        """)
    done = project.cli("triggers", name)  # (catch_exceptions=False: a traceback raises)
    assert done.exit_code == 2
    assert ("trigger 1: schedule '61 * * * *' is not a cron expression: [61 * * * *] is "
            "not acceptable, out of range (five fields") in done.output
    assert f"`interlock validate {name}` checks the whole file" in done.output


def test_status_of_a_pending_run_is_not_a_failure(project: CliProject) -> None:
    name = project.workflow(GATED)
    done = project.cli("run", "--detach", name, "--input", '{"n": 1}', "--run-id", "p1")
    assert done.exit_code == 0
    status = project.cli("status", "p1")
    assert status.exit_code == 0  # it was 1, as for a failed run
    assert status.output.startswith("PENDING  run p1")
    assert "interlock resume p1 --store" in status.output


def test_run_and_status_print_the_final_state_and_hints_keep_the_store(
        project: CliProject) -> None:
    name = project.workflow(GATED)
    waiting = project.cli("run", name, "--input", '{"n": 1}', "--run-id", "s1")
    assert waiting.exit_code == 3
    # the hint to decide names the store the run is in (a resume without it would look
    # in the default store)
    assert ("decide with: interlock resume s1 --gate gate --approve --store "
            f"{project.store} (or --reject)") in waiting.output
    done = project.cli("resume", "s1", "--approve", "--by", "ann")
    assert done.exit_code == 0
    assert re.search(r'^state: \{"n": 1, "x": 2, "gate": \{.*"decision": "approved".*\}, '
                     r'"y": 4\}$', done.output, re.M), done.output
    status = project.cli("status", "s1")
    assert status.exit_code == 0
    assert 'state: {"n": 1, "x": 2, "gate": {' in status.output
    assert '"y": 4}' in status.output


def test_a_long_final_state_is_shortened(project: CliProject) -> None:
    name = project.workflow(GATED)
    big = "z" * 2000
    project.cli("run", name, "--input", f'{{"n": 1, "big": "{big}"}}', "--run-id", "l1")
    done = project.cli("resume", "l1", "--approve", "--by", "ann")
    line = next(x for x in done.output.splitlines() if x.startswith("state: "))
    assert len(line) < 650 and line.endswith(
        f"(`interlock status l1 --json --store {project.store}` prints all of it)")


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    pytest.importorskip("fastapi")
    from test_server import GATED as SERVED_GATED
    from test_server import NODES as SERVED_NODES
    from test_server import Served

    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_TOKEN", raising=False)
    (tmp_path / "snodes.py").write_text(SERVED_NODES)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "gated.yaml").write_text(
        textwrap.dedent(SERVED_GATED).replace(', approvers: [alice, "role:admin"]', ""))
    server = Served(tmp_path)
    yield server
    server.stop()


def test_the_decide_hint_keeps_server_and_token(served: object) -> None:
    from test_server import Served, wait_status

    assert isinstance(served, Served)
    with served.client() as c:
        assert c.post("/api/workflows/gated/runs",
                      json={"input": {"n": 1}, "run_id": "h1"}).status_code == 201
        wait_status(c, "h1", "WAITING_APPROVAL")
    done = cli("status", "h1", "--server", served.url, "--token", "secret-token")
    assert done.exit_code == 3
    assert f"--by NAME [--comment TEXT] --server {served.url} --token TOKEN" in done.output
    assert "secret-token" not in done.output  # never the token itself
    # a token from $INTERLOCK_TOKEN needs no option: the command reads it again
    done = cli("status", "h1", "--server", served.url,
               env={**os.environ, "INTERLOCK_TOKEN": "secret-token"})
    assert f"--comment TEXT] --server {served.url}\n" in done.output
    # nor a server from $INTERLOCK_SERVER
    done = cli("status", "h1", env={**os.environ, "INTERLOCK_SERVER": served.url})
    assert "--by NAME [--comment TEXT]\n" in done.output and "--server" not in done.output


def test_unknown_nodes_get_a_did_you_mean(project: CliProject) -> None:
    name = project.workflow("""
        workflow: dym
        input: [n]
        nodes:
          alpha: {call: '{mod}:a', writes: [x]}
          gate: {approval: {on_modify: [alpah]}}
        edges:
          - {from: START, to: alpha}
          - {from: alpha, to: gate}
          - {from: gate, to: end}
        """)
    done = cli("validate", name)
    assert done.exit_code == 2
    assert "on_modify names unknown node 'alpah' (did you mean 'alpha'?)" in done.output
    assert "unknown node 'end' (did you mean 'END'?)" in done.output


CHILD = """
workflow: remediation
input: [x]
nodes:
  fix: {call: '{mod}:b', writes: [y]}
edges:
  - {from: START, to: fix}
  - {from: fix, to: END}
"""

PARENT = """
workflow: parent
input: [n]
nodes:
  a: {call: '{mod}:a', writes: [x]}
  remediate: {workflow: child.yaml, input: {x: x}, output: y}
  after: {call: '{mod}:a'}
edges:
  - {from: START, to: a}
  - {from: a, to: remediate}
  - {from: remediate, to: after}
  - {from: after, to: END}
"""


def test_graph_draws_a_childs_end_inside_its_cluster(project: CliProject) -> None:
    """The child's `fix -> END` ends at the child's END (which the parent's arc to
    `after` leaves from), not at the parent's END: that drew a path the parent never
    takes (`remediate` straight to the parent's END, skipping `after`)."""
    project.workflow(CHILD, "child.yaml")
    name = project.workflow(PARENT, "parent.yaml")
    mermaid = cli("graph", name)
    assert mermaid.exit_code == 0, mermaid.output
    assert "n_remediate__n_fix --> n_remediate__END" in mermaid.output
    assert "n_remediate__n_fix --> END" not in mermaid.output
    assert "n_remediate__END --> n_after" in mermaid.output
    dot = cli("graph", name, "--format", "dot")
    assert "n_remediate__n_fix -> n_remediate__END;" in dot.output
    assert "n_remediate__n_fix -> END" not in dot.output
