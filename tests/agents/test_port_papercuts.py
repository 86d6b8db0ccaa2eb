"""What ports of LangGraph and ADK agents tripped on (issue 29), each fixed: a goto is a
node's whole routing; validate follows condition paths into an agent's output schema;
tools may take ``ctx``; a scripted provider gives a map's items different replies; tests
supply replies without a second file."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

import interlock
from interlock.testing import scripted

NODES = '''
import interlock

def write(state):
    return {"n": state.get("n", 0) + 1}

def critic(state):
    return interlock.goto("END" if state["n"] >= 2 else "write")

def exit_loop() -> str:
    """Stop refining: the draft is good."""
    return interlock.goto("END")

SEEN = []

async def charge(amount: int, ctx) -> dict:
    """Charge the customer."""
    async def pay():
        SEEN.append((amount, ctx.idempotency_key))
        return {"charged": amount, "key": ctx.idempotency_key}
    return await ctx.once("pay", pay)
'''


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"papercut_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(NODES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return name


def _load(text: str, mod: str) -> interlock.Workflow:
    return interlock.load(dict(__import__("yaml").safe_load(
        textwrap.dedent(text).replace("{mod}", mod))))


def test_a_nodes_goto_is_its_whole_routing(mod: str) -> None:
    # (before: the loop-back `when` edge was decided and taken too, and the loop ran on
    # to n == 5)
    wf = _load("""
        workflow: loop
        state: {n: {}}
        nodes:
          write: {call: "{mod}:write"}
          critic: {call: "{mod}:critic"}
        edges:
          - {from: START, to: write}
          - {from: write, to: critic}
          - {from: critic, choose: [END, write]}
          - {from: critic, to: write, when: 'n < 5', max: 10}
        """, mod)
    result = asyncio.run(wf.run({}, store="memory://"))
    assert result.status == "COMPLETED"
    assert result.state["n"] == 2


def test_a_tools_goto_ends_an_adk_style_loop(mod: str, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = _load("""
        workflow: refine
        state: {n: {}}
        nodes:
          write: {call: "{mod}:write"}
          critic:
            agent:
              provider: scripted
              prompt: "Draft {{ n }}"
              tools: ["{mod}:exit_loop"]
              replies:
                - needs work
                - {tool_calls: [{name: exit_loop}]}
        edges:
          - {from: START, to: write}
          - {from: write, to: critic}
          - {from: critic, choose: [END]}
          - {from: critic, to: write, when: 'n < 5', max: 10}
        """, mod)
    result = asyncio.run(wf.run({}, store=store))
    assert result.status == "COMPLETED", result.error
    assert result.state["n"] == 2  # one more draft, then exit_loop's goto ended it
    skipped = [r for r in asyncio.run(interlock.trace(result.run_id, store=store))
               if r["type"] == "edge.skipped" and r.get("reason", "").endswith("(goto)")]
    assert len(skipped) == 1 and skipped[0]["edge"] == 3


def test_validate_follows_condition_paths_into_an_agents_output_schema(mod: str) -> None:
    text = """
        workflow: plan
        nodes:
          plan:
            agent:
              provider: scripted
              prompt: Plan it
              output:
                type: object
                properties:
                  response: {type: string}
                  steps: {type: object, properties: {first: {type: string}}}
              replies: ['{"response": "ok", "steps": {"first": "a"}}']
          done: {call: "{mod}:write"}
        edges:
          - {from: START, to: plan}
          - {from: plan, to: done, when: 'has(plan.%s)'}
          - {from: done, to: END}
        """
    with pytest.raises(interlock.WorkflowError) as err:
        _load(text % "respnse", mod)
    message = str(err.value)
    assert "has no property 'respnse' at plan" in message
    assert "did you mean 'response'?" in message
    with pytest.raises(interlock.WorkflowError, match=r"no property 'frist' at plan\.steps"):
        _load(text % "steps.frist", mod)
    _load(text % "response", mod)  # a declared path is fine
    _load(text % "steps.first", mod)


def test_a_tool_may_take_ctx_with_a_key_and_once_of_its_own_call(mod: str,
                                                                  tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wf = _load("""
        workflow: billing
        nodes:
          biller:
            agent:
              provider: scripted
              prompt: Bill them
              tools: ["{mod}:charge"]
              replies:
                - {tool_calls: [{name: charge, arguments: {amount: 5}},
                                {name: charge, arguments: {amount: 7}}]}
                - done
        edges:
          - {from: START, to: biller}
          - {from: biller, to: END}
        """, mod)
    from interlock.agents._tools import make_tool

    offered = make_tool(__import__(mod).charge).parameters  # the model never sees ctx
    assert list(offered["properties"]) == ["amount"] and offered["required"] == ["amount"]
    result = asyncio.run(wf.run({}, store=store))
    assert result.status == "COMPLETED", result.error
    seen = __import__(mod).SEEN
    assert [a for a, _ in seen] == [5, 7]  # each call its own once("pay")
    keys = [k for _, k in seen]
    assert len(set(keys)) == 2 and all(k.startswith(f"{result.run_id}:biller:1:") for k in keys)
    requests = [r for r in asyncio.run(interlock.trace(result.run_id, store=store))
                if r["type"] == "tool.called"]
    assert requests[0]["result"] == {"charged": 5, "key": keys[0]}


def test_a_scripted_provider_gives_a_maps_items_different_replies(mod: str) -> None:
    wf = _load("""
        workflow: jokes
        input: [subjects]
        nodes:
          joke:
            agent:
              provider: scripted
              prompt: "A joke about {{ subject }}"
              replies: [[about cats, about dogs, about fish]]
        edges:
          - {from: START, map: subjects, to: joke, as: subject, collect: jokes}
          - {from: joke, to: END}
        """, mod)
    result = asyncio.run(wf.run({"subjects": ["cats", "dogs", "fish"]}, store="memory://"))
    assert result.status == "COMPLETED", result.error
    assert [j["joke"] for j in result.state["jokes"]] == ["about cats", "about dogs",
                                                          "about fish"]


def test_tests_supply_replies_without_a_second_file(mod: str, tmp_path: Path) -> None:
    path = tmp_path / "risk.yaml"
    path.write_text(textwrap.dedent("""
        workflow: risk
        nodes:
          risk:
            agent:
              provider: openai
              model: gpt-4o-mini
              prompt: Assess it
              output: {type: object, properties: {level: {enum: [LOW, HIGH]}},
                       required: [level]}
        edges:
          - {from: START, to: risk}
          - {from: risk, to: END}
        """))
    wf = scripted(str(path), {"risk": [{"content": {"level": "HIGH"}}]})
    result = asyncio.run(wf.run({}, store="memory://"))
    assert result.status == "COMPLETED", result.error
    assert result.state == {"risk": {"level": "HIGH"}}
    with pytest.raises(interlock.UsageError, match="not an agent node"):
        scripted(str(path), {"nope": []})


