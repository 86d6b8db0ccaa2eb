"""What ``validate`` says about a map whose items wait for people: an
approval node, a ``confirm: true`` node and a sub-workflow whose child waits may be
mapped; what is still refused says what is supported and how to fix it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import interlock

NODES = "def f(state):\n    return {}\n"


def errors(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch,
           files: dict[str, str] | None = None) -> list[str]:
    (tmp_path / "gv_nodes.py").write_text(NODES)
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(body))
    (tmp_path / "wf.yaml").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        wf = interlock.load(tmp_path / "wf.yaml")
    except interlock.WorkflowError as exc:
        return [str(d) for d in exc.diagnostics if d.severity == "error"]
    return [str(d) for d in wf.check() if d.severity == "error"]


def mapped(target: str, edge_extra: str = ", collect: out") -> str:
    return f"""
    workflow: m
    nodes:
      plan: gv_nodes:f
      {target}
    edges:
      - {{from: START, to: plan}}
      - {{from: plan, map: '["a", "b"]', to: t, as: x{edge_extra}}}
    """


def test_a_mapped_confirm_node_is_valid_with_collect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert errors(tmp_path, mapped("t: {call: gv_nodes:f, confirm: true}"), monkeypatch) == []


def test_a_mapped_confirm_node_without_collect_says_why_and_how(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = errors(tmp_path, mapped("t: {call: gv_nodes:f, confirm: true}", ""), monkeypatch)
    assert len(found) == 1, found
    assert "'t' is a confirm: true node: each item waits for its own decision" in found[0]
    assert "its result, or the record of its rejection" in found[0]
    assert "declare collect: FIELD on the map edge" in found[0]


def test_a_mapped_sub_workflow_whose_child_waits_is_valid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = """
    workflow: c
    nodes:
      ask: {approval: {show: []}}
      act: {call: gv_nodes:f, confirm: true}
    edges:
      - {from: START, to: ask}
      - {from: ask, to: act}
    """
    assert errors(tmp_path, mapped("t: {workflow: child.yaml}"), monkeypatch,
                  {"child.yaml": child}) == []


def test_a_mapped_approval_with_on_modify_says_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = errors(tmp_path, mapped("t: {approval: {show: [], on_modify: [plan]}}"),
                   monkeypatch)
    assert len(found) == 1, found
    assert "drop on_modify, or map a sub-workflow whose child holds the approval" in found[0]


def test_a_mapped_agent_with_guarded_tools_says_what_is_supported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = ("t:\n        agent: {provider: scripted, prompt: hi, replies: [ok],\n"
             "                tools: [{call: gv_nodes:f, confirm: true},\n"
             "                        {mcp: {url: 'http://127.0.0.1:9/mcp'}, "
             "confirm: [wipe]}]}")
    found = errors(tmp_path, mapped(agent), monkeypatch)
    [guarded] = [e for e in found if "tools a human confirms" in e]
    assert "(gv_nodes:f, MCP tools wipe)" in guarded  # the MCP tool by name, not None
    assert "None" not in guarded
    assert "can wait at an approval node, a confirm: true node or a sub-workflow's " \
        "gates" in guarded
    assert "put the agent in a sub-workflow and map that" in guarded


def test_a_mapped_sub_workflow_gets_its_input_from_the_maps_item_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The map's ``as: x`` is in the state of each visit: a child needing input ``x`` has
    it (neither error nor warning; the review saw "not mapped" for it)."""
    child = """
    workflow: c
    input: [x]
    nodes: {gate: {approval: {show: [x]}}}
    edges: [{from: START, to: gate}, {from: gate, to: END}]
    """
    (tmp_path / "gv_nodes.py").write_text(NODES)
    (tmp_path / "child.yaml").write_text(textwrap.dedent(child))
    (tmp_path / "wf.yaml").write_text(textwrap.dedent(mapped("t: {workflow: child.yaml}")))
    monkeypatch.syspath_prepend(str(tmp_path))
    said = [str(d) for d in interlock.load(tmp_path / "wf.yaml").check()]
    assert not [d for d in said if "needs input" in d], said
