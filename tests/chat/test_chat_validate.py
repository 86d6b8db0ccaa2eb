"""What ``validate`` says about a ``chat:`` file (SPEC §11)."""

from __future__ import annotations

from typing import Any

import pytest

import interlock


def chat(**agent: Any) -> dict[str, Any]:
    return {"workflow": "c", "chat": "assistant",
            "nodes": {"assistant": {"agent": {"provider": "scripted", "replies": ["hi"],
                                              **agent}}}}


def test_a_chat_file_needs_no_edges_and_names_an_agent_node() -> None:
    wf = interlock.load(chat())
    assert [(e.source, e.to) for e in wf.spec.edges] == [(["START"], ["assistant"]),
                                                         (["assistant"], ["END"])]
    with pytest.raises(interlock.WorkflowError, match="there is no such node"):
        interlock.load({**chat(), "chat": "nobody"})
    bad = {**chat(), "nodes": {"assistant": {"call": "os:getcwd"}}}
    with pytest.raises(interlock.WorkflowError, match="it is not an agent node"):
        interlock.load(bad)


@pytest.mark.parametrize("agent, message", [
    ({"prompt": "Hi {{ x }}"}, "takes the user's messages, not a prompt"),
    ({"redact": ["reply"]}, "rebuilds each turn from its journaled model calls"),
    ({"output": {"type": "object"}}, "replies in text"),
    ({"tools": [{"agent": {"provider": "scripted", "replies": ["x"]}}]}, "needs name:"),
    ({"tools": [{"name": "t", "call": "os:getcwd", "agent": {}}]}, "exactly one of"),
    ({"tools": [{"workflow": "no-such-file.yaml", "name": "t"}]}, "cannot read workflow"),
])
def test_what_a_conversations_agent_may_not_declare(agent: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(interlock.WorkflowError, match=message):
        interlock.load(chat(**agent))


def test_recall_is_a_conversations_and_an_agent_elsewhere_needs_a_prompt() -> None:
    plain = {"workflow": "p", "nodes": {"a": {"agent": {
        "provider": "scripted", "replies": ["x"], "prompt": "go", "recall": True}}},
        "edges": [{"from": "START", "to": "a"}, {"from": "a", "to": "END"}]}
    with pytest.raises(interlock.WorkflowError, match="recall: true gives a conversation"):
        interlock.load(plain)
    del plain["nodes"]["a"]["agent"]["recall"]
    del plain["nodes"]["a"]["agent"]["prompt"]
    with pytest.raises(interlock.WorkflowError, match="missing required key 'prompt'"):
        interlock.load(plain)


def test_a_misspelt_chat_node_is_placed_at_its_line_with_a_did_you_mean(tmp_path: Any) -> None:
    path = tmp_path / "hd.yaml"
    path.write_text("workflow: hd\nchat: asistant\nnodes:\n  assistant:\n"
                    "    agent: {provider: scripted, replies: [hi]}\n")
    with pytest.raises(interlock.WorkflowError) as caught:
        interlock.load(path)
    said = str(caught.value)
    assert f"{path}:2:" in said, said
    assert "did you mean 'assistant'?" in said, said
    assert "declare nodes: {asistant" not in said, said  # (the old advice repeated the typo)
