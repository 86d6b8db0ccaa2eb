"""Papercuts a new user met porting LangGraph / ADK workflows (issue #17), each fixed and
kept fixed: unknown keys, nodes reached only through ``on_modify``, ``otherwise`` beside
an unconditional edge, a modify patch naming a new field."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result

import interlock
from interlock import END, START, Workflow

if TYPE_CHECKING:
    from conftest import CliProject

def validate(name: str) -> Result:
    from interlock.cli import cli

    return CliRunner().invoke(cli, ["validate", name], catch_exceptions=False)


NODES = """
def step(state):
    return {"count": state.get("count", 0) + 1}
"""


@pytest.mark.parametrize("snippet, where, expected", [
    ("  a: {call: '{mod}:step', retires: 2}", "nodes.a.retires",
     "unknown key 'retires' (did you mean 'retry'?); the keys here are: call, reads, writes,"),
    ("  a: {call: '{mod}:step', retry: {attempt: 2}}", "nodes.a.retry.attempt",
     "(did you mean 'attempts'?); the keys here are: attempts, backoff, max_backoff"),
    ("  a: {call: '{mod}:step', arg: {x: 1}}", "nodes.a.arg",
     "(did you mean 'args'?)"),
])
def test_an_unknown_key_lists_the_valid_ones_with_a_did_you_mean(
        make_project: Callable[..., CliProject], snippet: str, where: str,
        expected: str) -> None:
    p = make_project(NODES)
    name = p.workflow("workflow: typo\nnodes:\n" + snippet + "\nedges:\n"
                      "  - {from: START, to: a}\n")
    result = validate(name)
    assert result.exit_code == 2
    assert "wf.yaml:3:" in result.output and f"{where}: unknown key" in result.output
    assert expected in result.output
    assert "SPEC" not in result.output


def test_an_unknown_key_of_an_edge_and_of_the_top_level(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    name = p.workflow("""
        workflow: typo
        limit: {steps: 3}
        state:
          log: {reducer: append, defaults: []}
        nodes:
          a: {mod}:step
        edges:
          - {from: START, to: a, on_eror: true}
        """)
    out = validate(name).output
    assert "limit: unknown key 'limit' (did you mean 'limits'?); the keys here are: " \
        "workflow, description, config, input, state, limits, nodes, edges" in out
    assert "state.log.defaults: unknown key 'defaults' (did you mean 'default'?)" in out
    assert "edges.0.on_eror: unknown key 'on_eror' (did you mean 'on_error'?)" in out
    assert "SPEC" not in out


# -- a node reachable only through on_modify ---------------------------------------------

def test_a_node_reached_only_through_on_modify_is_reachable() -> None:
    wf = Workflow("rewrite")
    wf.node("draft", lambda s: None).node("rewrite", lambda s: None)
    wf.node("orphan", lambda s: None)
    wf.approval("review", on_modify=["rewrite"])
    wf.edge(START, "draft").edge("draft", "review").edge("rewrite", "review")
    unreachable = [d.message for d in wf.check() if d.code == "unreachable"]
    assert unreachable == ["node 'orphan' is unreachable: no edge path from START leads to it"]


def test_modify_reenters_at_a_node_with_no_incoming_edge(tmp_path: Any) -> None:
    calls: list[str] = []

    def draft(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("draft")
        return {"text": "first draft"}

    def rewrite(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("rewrite")
        return {"text": f"rewritten: {state['hint']}"}

    wf = Workflow("rewrite", state={"hint": {"default": ""}})
    wf.node("draft", draft).node("rewrite", rewrite)
    wf.approval("review", show=["text"], on_modify=["rewrite"])
    wf.edge(START, "draft").edge("draft", "review").edge("rewrite", "review")
    store = f"sqlite:///{tmp_path}/runs.db"
    run = wf.run_sync(store=store)
    assert run.status == "WAITING_APPROVAL"
    again = wf.resume_sync(run.run_id, interlock.modify({"hint": "shorter"}), store=store)
    assert again.status == "WAITING_APPROVAL" and again.state["text"] == "rewritten: shorter"
    done = wf.resume_sync(run.run_id, interlock.approve(by="ann"), store=store)
    assert done.status == "COMPLETED" and calls == ["draft", "rewrite"]


def test_a_patch_naming_an_unknown_field_says_how_to_declare_it(tmp_path: Any) -> None:
    wf = Workflow("patch")
    wf.node("a", lambda s: {"x": 1})
    wf.approval("gate", on_modify=["a"])
    wf.edge(START, "a").edge("a", "gate")
    store = f"sqlite:///{tmp_path}/runs.db"
    run = wf.run_sync(store=store)
    with pytest.raises(interlock.UsageError) as info:
        wf.resume_sync(run.run_id, interlock.modify({"tone": "dry"}), store=store)
    text = str(info.value)
    assert "does not know: tone" in text
    assert "declare it in the workflow file (state: {tone: {}}" in text
    assert "start a new run" in text


# -- otherwise beside an unconditional edge, and "loop N times" --------------------------

def test_validate_warns_when_otherwise_sits_beside_an_edge_without_when() -> None:
    wf = Workflow("both")
    wf.node("refiner", lambda s: None).node("critic", lambda s: None)
    wf.edge(START, "refiner").edge("refiner", "critic", max=4)
    wf.edge("critic", "refiner", when="false").edge("critic", END, otherwise=True)
    wf.edge("refiner", END, otherwise=True)
    [warning] = [d for d in wf.check() if d.code == "otherwise"]
    assert warning.severity == "warning"
    assert "BOTH edges are taken each time 'refiner' completes" in warning.message
    assert "{from: refiner, to: critic, when: 'run.visits.refiner < 5'}" in warning.message


def test_the_loop_n_times_recipe_runs_the_loop_n_times() -> None:
    runs: list[int] = []

    def refiner(state: dict[str, Any]) -> dict[str, Any]:
        runs.append(len(runs) + 1)
        return {"draft": len(runs)}

    wf = Workflow("loop-n")
    wf.node("refiner", refiner)
    wf.edge(START, "refiner")
    wf.edge("refiner", "refiner", when="run.visits.refiner < 3")
    wf.edge("refiner", END, otherwise=True)
    assert not [d for d in wf.check() if d.code == "otherwise"]
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED" and runs == [1, 2, 3]


# -- an agent without an output schema -----------------------------------------------------

def test_an_agent_without_output_keeps_a_json_object_reply_as_an_object() -> None:
    from interlock.testing import ScriptedProvider

    wf = Workflow("no-schema")
    wf.agent("obj", prompt="Give JSON", provider=ScriptedProvider(
        ['```json\n{"verdict": "ok", "score": 3}\n```']))
    wf.agent("num", prompt="A number", provider=ScriptedProvider(["42"]))
    wf.agent("prose", prompt="Talk", provider=ScriptedProvider(["{not json} at all"]))
    wf.edge(START, "obj").edge("obj", "num", when='obj.verdict == "ok"').edge("num", "prose")
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED", result.error
    assert result.state == {"obj": {"verdict": "ok", "score": 3}, "num": "42",
                            "prose": "{not json} at all"}


# -- x-* keys: the home of YAML anchors -----------------------------------------------------

def test_x_keys_at_the_top_level_and_in_nodes_are_kept_and_ignored(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    name = p.workflow("""
        workflow: anchors
        x-retry: &retry {attempts: 3, backoff: 0.1s}
        nodes:
          a: {call: '{mod}:step', retry: *retry, x-owner: team-a}
          b: {call: '{mod}:step', retry: *retry}
        edges:
          - {from: START, to: a}
          - {from: a, to: b}
        """)
    assert validate(name).exit_code == 0
    wf = interlock.load(p.root / name)
    assert wf.spec.nodes["b"].retry is not None and wf.spec.nodes["b"].retry.attempts == 3
    definition = wf.definition()
    assert definition["x-retry"] == {"attempts": 3, "backoff": "0.1s"}
    assert definition["nodes"]["a"]["x-owner"] == "team-a"
    # kept in the stored definition: a run re-reads the same workflow from it
    assert interlock.load(definition).definition_hash() == wf.definition_hash()
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED" and result.state["count"] == 2
    # a key that is not x-* is still refused, and the message says x-* keys exist
    bad = p.workflow("""
        workflow: typo
        nodes:
          a: {call: '{mod}:step', y-owner: 1}
        edges:
          - {from: START, to: a}
        """, name="bad.yaml")
    out = validate(bad).output
    assert "unknown key 'y-owner'" in out and "x-... (any key starting with x-" in out


def test_an_unknown_key_of_an_agent_block_has_a_did_you_mean() -> None:
    with pytest.raises(interlock.WorkflowError) as info:
        interlock.load({"workflow": "x", "edges": [{"from": "START", "to": "a"}],
                        "nodes": {"a": {"agent": {"prompt": "p", "provider": "scripted",
                                                  "replies": ["ok"], "outptu": {}}}}})
    assert "agent.outptu: unknown key 'outptu' (did you mean 'output'?); the keys here " \
        "are: provider, model," in str(info.value)
