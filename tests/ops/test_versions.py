"""SPEC §14, versions: runs that outlive their code.

Code digests in ``run.started``, compared when a run is resumed, decided or continued
by a worker (a warning naming the node, ``run.code_changed``, ``code_changed`` in the
run object; ``--strict-code`` refuses before anything is recorded); ``interlock
migrate`` with its static check, ``run.migrated``, and verify / trace / export /
coverage across a migration; workers and servers keep stored runs on their pinned
definitions. Each through the CLI, as a user would, some through a real server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import CliProject

from interlock.support import set_strict_code

NODES = """
import os

def first(state):
    return {"x": 1}

def finish(state):
    return {"done": True}
"""

AFTER = """
def double(state):
    return {"y": state["x"] * 2}
"""

GATED = """
workflow: versioned
nodes:
  a: {mod}:first
  gate: {approval: {show: [x]}}
  b: {after}:double
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: gate, to: END, otherwise: true}
  - {from: b, to: END}
"""


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
    code = started["code"]
    assert set(code) == {"a", "b"}  # the gate names no code
    assert set(code["b"]) == {project.after}
    assert code["b"][project.after].startswith("sha256:")


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
