"""The cost of evaluating conditions and rendering prompts is bounded (finding 1 and 2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import interlock
from interlock import END, START, Workflow

BIG = list(range(200_000))  # 1.4 MB as JSON: within INPUT_BYTES


def _noop(state: dict[str, Any]) -> None:
    return None


def _cond_workflow(name: str, when: str, fields: list[str]) -> Workflow:
    wf = Workflow(name, input=fields)
    wf.node("a", _noop).node("b", _noop)
    wf.edge(START, "a").edge("a", "b", when=when).edge("a", END, otherwise=True)
    return wf


def _run(wf: Workflow, inputs: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    recs: list[dict[str, Any]] = []
    result = wf.run_sync(inputs, store="memory://", listener=lambda r, v: recs.append(r))
    return result, recs


def _assert_refused(result: Any, recs: list[dict[str, Any]], expr: str) -> None:
    assert result.status == "FAILED"
    assert result.error["type"] == "expression_error"
    msg = result.error["message"]
    assert expr in msg and "a -> b" in msg
    assert "INTERLOCK_MAX_EXPRESSION_COST" in msg and "10_000_000" in msg
    assert "SPEC" not in msg
    assert recs[-1]["type"] == "run.failed"


@pytest.mark.parametrize("when", [
    "biglist.all(x, x in biglist)",
    "size(biglist.map(x, s + s)) > 0",
    "size(biglist.filter(x, x >= 0)) > 0",
    "biglist.exists(x, string(x) + s == s)",
])
def test_a_costly_condition_over_a_big_input_is_refused_not_run(when: str) -> None:
    wf = _cond_workflow("costly", when, ["biglist", "s"])
    result, recs = _run(wf, {"biglist": BIG, "s": "x" * 1000})
    _assert_refused(result, recs, when)


def test_a_quadratic_condition_over_a_small_list_still_runs() -> None:
    wf = _cond_workflow("small", "biglist.all(x, x in biglist)", ["biglist"])
    result, recs = _run(wf, {"biglist": list(range(50))})
    assert result.status == "COMPLETED"
    assert any(r["type"] == "edge.taken" and r.get("to") == ["b"] for r in recs)


def test_a_string_chain_within_the_length_limit_is_refused_over_a_big_string() -> None:
    when = "size(" + " + ".join(["s"] * 200) + ") > 0"
    wf = _cond_workflow("chain", when, ["s"])
    result, recs = _run(wf, {"s": "y" * 2_000_000})
    _assert_refused(result, recs, when)


def test_the_environment_variable_raises_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    wf = _cond_workflow("raised", "biglist.all(x, x in biglist)", ["biglist"])
    inputs = {"biglist": list(range(3000))}
    assert _run(wf, inputs)[0].status == "FAILED"
    monkeypatch.setenv("INTERLOCK_MAX_EXPRESSION_COST", str(10**12))
    assert _run(wf, inputs)[0].status == "COMPLETED"


def test_a_switch_over_a_value_a_node_wrote_is_bounded_by_its_actual_size() -> None:
    def writes(state: dict[str, Any]) -> dict[str, Any]:
        return {"items": [{"k": i, "v": "z" * 20} for i in range(100_000)]}  # no input limit

    wf = Workflow("switch")
    wf.node("w", writes).node("b", _noop)
    wf.edge(START, "w")
    wf.switch("w", "size(items.map(x, x.v + x.v))", {1: "b"}, default=END)
    result, recs = _run(wf, {})
    assert result.status == "FAILED" and result.error["type"] == "expression_error"
    assert "items" in result.error["message"]
    assert "INTERLOCK_MAX_EXPRESSION_COST" in result.error["message"]
    assert recs[-1]["type"] == "run.failed"


def test_plain_conditions_over_scalars_are_unchanged() -> None:
    wf = _cond_workflow("plain", "x > 1 && name == 'a'", ["x", "name"])
    result, recs = _run(wf, {"x": 2, "name": "a"})
    assert result.status == "COMPLETED"
    assert any(r["type"] == "edge.taken" and r.get("to") == ["b"] for r in recs)


def test_a_loop_with_an_expensive_admitted_condition_can_be_cancelled() -> None:
    from interlock._store import open_store

    async def main() -> None:
        store = open_store("memory://")
        visited = asyncio.Event()

        def step(state: dict[str, Any]) -> dict[str, Any]:
            return {"i": state["i"] + 1}

        async def astep(state: dict[str, Any]) -> dict[str, Any]:
            visited.set()
            return step(state)

        wf = Workflow("cancel-costly", input=["i", "big"])
        wf.node("step", astep)
        wf.edge(START, "step")
        # about 2-4 M cost units: admitted, some tens of ms per evaluation
        wf.edge("step", "step", when="big.all(x, x >= 0) && i < 1000000")
        wf.edge("step", END, otherwise=True)
        task = asyncio.create_task(wf.run({"i": 0, "big": list(range(20_000))}, store=store,
                                          run_id="c1"))
        await visited.wait()
        await interlock.cancel("c1", by="ops", store=store, wait=30)
        result = await asyncio.wait_for(task, 30)
        assert result.status == "CANCELLED"
        assert result.state["i"] < 1000000
        assert (await interlock.verify("c1", store=store)).ok

    asyncio.run(main())


# -- prompt templates ---------------------------------------------------------------------

HOSTILE = {
    "nested ranges": "{% for a in range(100000) %}{% for b in range(100000) %}x"
                     "{% endfor %}{% endfor %}",
    "a huge power": "{{ 10 ** 10000000 }}",
    "a gigabyte string": "{{ 'x' * 1000000000 }}",
}


def _agent_workflow(prompt: str, timeout: float | None = None) -> Workflow:
    from interlock.agents import ScriptedProvider

    wf = Workflow("hostile", input=["name"])
    wf.agent("ask", reads=["name"], prompt=prompt, timeout=timeout,
             provider=ScriptedProvider(["fine"]))
    wf.edge(START, "ask")
    return wf


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_fails_the_node_with_a_clear_error(name: str) -> None:
    result = _agent_workflow(HOSTILE[name]).run_sync({"name": "n"}, store="memory://")
    assert result.status == "FAILED"
    msg = result.error["message"]
    assert "ask" in msg and "prompt" in msg
    assert "INTERLOCK_MAX_PROMPT_CHARS" in msg or "INTERLOCK_MAX_RENDER_MS" in msg


def test_the_nodes_timeout_stops_a_slow_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_MAX_RENDER_MS", str(10**9))  # only the timeout is left
    result = _agent_workflow(HOSTILE["nested ranges"], timeout=0.5).run_sync(
        {"name": "n"}, store="memory://")
    assert result.status == "FAILED"
    assert "timed out" in result.error["message"]


def test_a_long_output_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_MAX_PROMPT_CHARS", "1000")
    result = _agent_workflow("{% for a in range(5000) %}ab{% endfor %}").run_sync(
        {"name": "n"}, store="memory://")
    assert result.status == "FAILED"
    assert "1_000" in result.error["message"]
    assert "INTERLOCK_MAX_PROMPT_CHARS" in result.error["message"]


def test_a_normal_template_renders_as_before() -> None:
    from interlock.agents._prompt import compile_template, render

    source = "Hi {{ name }}: {% for x in items %}{{ x * 2 }},{% endfor %} {{ cfg }} " \
             "{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ [1] + [2] }}"
    scope = {"name": "n", "items": [1, 2], "cfg": {"a": 1}}
    assert render(compile_template(source), scope) == \
        'Hi n: 2,4, {"a": 1} 1024 ababab [1, 2]'
    result = _agent_workflow("Hello {{ name }}").run_sync({"name": "n"}, store="memory://")
    assert result.status == "COMPLETED" and result.state["ask"] == "fine"
