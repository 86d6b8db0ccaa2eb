"""Map edges (SPEC §7): one visit of the target per item of a list, concurrently, as one
node to the rest of the graph -- with real runs, a real crash and the validator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _harness import wait_for

import interlock
from interlock import END, START, Workflow


def run(wf: Workflow, data: dict[str, Any] | None = None
        ) -> tuple[interlock.RunResult, list[dict[str, Any]]]:
    """Run ``wf`` on an in-memory store; its result and its records."""
    async def go() -> tuple[interlock.RunResult, list[dict[str, Any]]]:
        async with interlock.open_store("memory://") as store:
            result = await wf.run(data or {}, store=store)
            return result, await interlock.trace(result.run_id, store=store)
    return asyncio.run(go())


def jokes_workflow(*, max_concurrency: int | None = None) -> tuple[Workflow, dict[str, int]]:
    """plan -> map(subjects) joke -> best; counts the items in flight at once."""
    seen = {"now": 0, "max": 0}

    async def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {"subjects": [f"s{i}" for i in range(state["n"])]}

    async def joke(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        seen["now"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        try:
            for _ in range(3):  # give the other items every chance to start meanwhile
                await asyncio.sleep(0)
        finally:
            seen["now"] -= 1
        return {"text": f"joke about {state['subject']}", "index": ctx.item_index,
                "key": ctx.idempotency_key}

    def best(state: dict[str, Any]) -> dict[str, Any]:
        return {"count": len(state["jokes"])}

    wf = (Workflow("jokes").node("plan", plan).node("joke", joke).node("best", best)
          .edge(START, "plan")
          .map("plan", "subjects", "joke", as_="subject", collect="jokes",
               max_concurrency=max_concurrency)
          .edge("joke", "best").edge("best", END))
    return wf, seen


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_a_map_runs_one_visit_per_item_and_collects_in_item_order(n: int) -> None:
    wf, seen = jokes_workflow(max_concurrency=8)
    result, recs = run(wf, {"n": n})
    assert result.status == "COMPLETED", result.error
    jokes = result.state["jokes"]
    assert [j["text"] for j in jokes] == [f"joke about s{i}" for i in range(n)]
    assert [j["index"] for j in jokes] == list(range(n))
    assert result.state["count"] == n
    assert seen["max"] <= 8
    if n == 1000:
        assert seen["max"] == 8  # and it did run them concurrently
    # every item has its own stable key; the item itself is not merged into the state
    assert len({j["key"] for j in jokes}) == n
    assert "subject" not in result.state
    items = [r for r in recs if r["type"] == "node.completed" and r["node"] == "joke"]
    assert sorted(r["item"] for r in items if "item" in r) == list(range(n))
    whole = [r for r in items if "item" not in r]
    assert len(whole) == 1 and whole[0]["items"] == n
    # each item is one step (plus plan and best)
    assert result.steps == n + 2


def test_the_default_concurrency_is_sixteen() -> None:
    wf, seen = jokes_workflow()
    assert run(wf, {"n": 100})[0].status == "COMPLETED"
    assert seen["max"] == 16


def test_without_collect_item_updates_merge_through_reducers_in_item_order() -> None:
    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": [3, 1, 2]}

    async def square(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.001 * state["x"])  # finish out of order
        return {"squares": state["x"] ** 2, "total": state["x"]}

    wf = (Workflow("sq", state={"squares": "append", "total": "add"})
          .node("fan", fan).node("square", square)
          .edge(START, "fan").map("fan", "xs", "square", as_="x").edge("square", END))
    result, _ = run(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["squares"] == [9, 1, 4]  # item order, not completion order
    assert result.state["total"] == 6


def test_two_items_writing_a_field_without_a_reducer_is_a_write_conflict() -> None:
    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": [1, 2]}

    async def one(state: dict[str, Any]) -> dict[str, Any]:
        return {"last": state["item"]}

    wf = (Workflow("c").node("fan", fan).node("one", one)
          .edge(START, "fan").map("fan", "xs", "one").edge("one", END))
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "write_conflict"
    assert "items 0 and 1 of mapped node 'one'" in result.error["message"]


def test_one_failing_item_fails_the_node_and_cancels_the_others() -> None:
    started: list[int] = []
    release = asyncio.Event()

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": list(range(6))}

    async def work(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        started.append(ctx.item_index)
        if state["item"] == 2:
            raise ValueError("item two is bad")
        await release.wait()  # the others wait: they are running when item 2 fails
        return {"ok": True}

    wf = (Workflow("f").node("fan", fan).node("work", work)
          .edge(START, "fan").map("fan", "xs", "work", collect="out", max_concurrency=4)
          .edge("work", END))
    result, recs = run(wf)
    assert result.status == "FAILED"
    assert result.error is not None
    assert "item two is bad" in result.error["message"]
    assert "(item 2, counting from 0, of 6)" in result.error["message"]
    assert sorted(started) == [0, 1, 2, 3]  # items 4 and 5 never started
    failed = {r.get("item"): r["error"]["type"] for r in recs
              if r["type"] == "node.failed" and r["node"] == "work"}
    assert failed[2] == "node_error"
    assert {failed[i] for i in (0, 1, 3)} == {"cancelled"}
    assert failed[None] == "node_error"  # the mapped visit itself
    assert recs[-1]["type"] == "run.failed"


def test_an_item_is_retried_on_its_own() -> None:
    tries: dict[int, int] = {}

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": ["a", "b", "c"]}

    async def flaky(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
        i = ctx.item_index
        tries[i] = tries.get(i, 0) + 1
        if i == 1 and tries[i] < 3:
            raise ConnectionError("try again")
        return {"v": state["item"], "key": ctx.idempotency_key}

    wf = (Workflow("r").node("fan", fan)
          .node("flaky", flaky, retry={"attempts": 3})
          .edge(START, "fan").map("fan", "xs", "flaky", collect="out").edge("flaky", END))
    result, recs = run(wf)
    assert result.status == "COMPLETED", result.error
    assert tries == {0: 1, 1: 3, 2: 1}
    assert [o["v"] for o in result.state["out"]] == ["a", "b", "c"]
    retrying = [r for r in recs if r["type"] == "node.retrying"]
    assert [(r["item"], r["attempt"]) for r in retrying] == [(1, 1), (1, 2)]


def test_a_list_over_max_items_fails_before_any_item_starts() -> None:
    ran: list[Any] = []

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": list(range(5))}

    async def work(state: dict[str, Any]) -> dict[str, Any]:
        ran.append(state["item"])
        return {}

    wf = (Workflow("m").node("fan", fan).node("work", work)
          .edge(START, "fan").map("fan", "xs", "work", collect="out", max_items=4)
          .edge("work", END))
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error is not None and "gave 5 items, over the edge's max_items (4)" \
        in result.error["message"]
    assert ran == []


def test_a_map_expression_that_is_not_a_list_fails_the_run_clearly() -> None:
    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": {"a": 1}}

    async def work(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    wf = (Workflow("m").node("fan", fan).node("work", work)
          .edge(START, "fan").map("fan", "xs", "work", collect="out").edge("work", END))
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "expression_error"
    assert "not a list" in result.error["message"]


def test_a_map_inside_a_loop_and_a_join_after_it() -> None:
    async def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {"round": state.get("round", 0) + 1,
                "batch": [state.get("round", 0) * 10 + i for i in range(3)]}

    async def work(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": state["n"]}

    async def side(state: dict[str, Any]) -> dict[str, Any]:
        return {"side": True}

    def merge(state: dict[str, Any]) -> dict[str, Any]:
        return {"rounds": state["round"]}

    wf = (Workflow("loop", state={"done": "append"})
          .node("plan", plan).node("work", work).node("side", side).node("merge", merge)
          .edge(START, "plan")
          .map("plan", "batch", "work", as_="n")
          .edge("plan", "side")
          .edge(["work", "side"], "merge")
          .edge("merge", "plan", when="round < 3")
          .edge("merge", END, otherwise=True))
    result, _ = run(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["done"] == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert result.state["rounds"] == 3


def test_the_yaml_form_is_the_builders(tmp_path: Path) -> None:
    (tmp_path / "wf.yaml").write_text(textwrap.dedent("""
        workflow: jokes
        nodes:
          plan: {call: m:plan}
          joke: {call: m:joke}
        edges:
          - {from: START, to: plan}
          - {from: plan, map: subjects, to: joke, as: subject, collect: jokes,
             max_concurrency: 4, max_items: 100}
          - {from: joke, to: END}
    """))
    async def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    built = (Workflow("jokes").node("plan", plan).node("joke", plan)
             .edge(START, "plan")
             .map("plan", "subjects", "joke", as_="subject", collect="jokes",
                  max_concurrency=4, max_items=100)
             .edge("joke", END))
    from interlock.support import load_spec

    assert load_spec(str(tmp_path / "wf.yaml")).edges == built.spec.edges


# -- validate ------------------------------------------------------------------------


def problems(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "maps_nodes.py").write_text(
        "def f(state):\n    return {}\n\ndef g(state, ctx):\n    return {}\n")
    (tmp_path / "wf.yaml").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        wf = interlock.load(tmp_path / "wf.yaml")
    except interlock.WorkflowError as exc:
        return [str(d) for d in exc.diagnostics if d.severity == "error"]
    return [str(d) for d in wf.check() if d.severity == "error"]


HEAD = """
workflow: v
state: {out: {reducer: append}, total: {reducer: add}}
input: [topic]
nodes:
  a: maps_nodes:f
  b: maps_nodes:f
  c: maps_nodes:g
"""


@pytest.mark.parametrize("edges, expected", [
    ("- {from: a, map: xs, to: END}", "END is not one"),
    ("- {from: a, map: xs, to: b, as: topic}\n- {from: b, to: END}",
     "'as: topic' names a field the workflow declares (input)"),
    ("- {from: a, map: xs, to: b, as: run}\n- {from: b, to: END}", "'as: run' must be"),
    ("- {from: a, map: xs, to: b, collect: out}\n- {from: b, to: END}",
     "'collect: out' writes the list of the items' updates, and 'out' has reducer append"),
    ("- {from: a, map: xs, to: b}\n- {from: a, to: b}\n- {from: b, to: END}",
     "is also the target of another edge"),
    ("- {from: a, map: xs, to: c}\n- {from: c, choose: [b]}\n- {from: b, to: END}",
     "a per-item choice has no single answer"),
    ("- {from: a, map: 'xs +', to: b}\n- {from: b, to: END}", "map 'xs +'"),
])
def test_validate_refuses_what_a_map_cannot_do(edges: str, expected: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    text = HEAD + "edges:\n- {from: START, to: a}\n" + edges + "\n"
    found = problems(text, tmp_path, monkeypatch)
    assert any(expected in p for p in found), found


def test_validate_reports_a_reducerless_write_of_a_mapped_node_without_collect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = HEAD.replace("b: maps_nodes:f", "b: {call: maps_nodes:f, writes: [last, total]}") \
        + "edges:\n- {from: START, to: a}\n- {from: a, map: xs, to: b}\n- {from: b, to: END}\n"
    found = problems(text, tmp_path, monkeypatch)
    assert any("each writes 'last', which has no reducer" in p for p in found), found
    assert not any("'total'" in p for p in found)  # it has a reducer


def test_options_of_a_map_on_another_edge_are_refused(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    text = HEAD + "edges:\n- {from: START, to: a}\n- {from: a, to: b, collect: out}\n" \
        "- {from: b, to: END}\n"
    found = problems(text, tmp_path, monkeypatch)
    assert any("'collect' belong to a map edge" in p for p in found), found


# -- a crash in the middle of a map ----------------------------------------------------

CRASH_NODES = '''
import asyncio, os, time
from pathlib import Path

async def plan(state):
    return {"items": list(range(50))}

async def work(state, ctx):
    i = state["n"]
    with open("ran.txt", "a") as f:
        f.write(f"{i}\\n")
    if os.environ.get("CRASH") and i == 30:
        Path("ready").write_text("")
        while True:
            await asyncio.sleep(0.05)
    return {"double": i * 2}

def total(state):
    return {"total": sum(x["double"] for x in state["out"])}
'''

CRASH_WORKFLOW = """
workflow: crashy-map
nodes:
  plan: crash_map_nodes:plan
  work: crash_map_nodes:work
  total: crash_map_nodes:total
edges:
  - {from: START, to: plan}
  - {from: plan, map: items, to: work, as: n, collect: out, max_concurrency: 1}
  - {from: work, to: total}
  - {from: total, to: END}
"""


def test_sigkill_in_the_middle_of_a_map_then_resume_runs_only_unfinished_items(
        tmp_path: Path) -> None:
    (tmp_path / "crash_map_nodes.py").write_text(CRASH_NODES)
    (tmp_path / "wf.yaml").write_text(CRASH_WORKFLOW)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "CRASH": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "interlock", "run", "wf.yaml", "--store",
                             store, "--run-id", "m1"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), "item 30", alive=proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ran_before = [int(x) for x in (tmp_path / "ran.txt").read_text().split()]
    assert ran_before == list(range(31))
    env.pop("CRASH")
    out = subprocess.run([sys.executable, "-m", "interlock", "resume", "m1", "--store", store,
                          "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "COMPLETED"
    assert result["state"]["total"] == sum(i * 2 for i in range(50))
    ran = [int(x) for x in (tmp_path / "ran.txt").read_text().split()]
    # items 0..29 had completed: only 30 (interrupted) and the ones never started ran again
    assert ran == list(range(31)) + list(range(30, 50))
    verify = subprocess.run([sys.executable, "-m", "interlock", "verify", "m1", "--store",
                             store], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_graph_draws_a_map_edge_with_its_expression() -> None:
    from interlock.support import to_dot, to_mermaid

    async def f(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    wf = (Workflow("g").node("plan", f).node("joke", f).edge(START, "plan")
          .map("plan", "plan_subjects", "joke", as_="subject", collect="jokes")
          .edge("joke", END))
    mermaid = to_mermaid(wf.spec)
    assert 'n_plan -->|"map plan_subjects as subject, collect jokes"| n_joke' in mermaid
    assert 'label="map plan_subjects as subject, collect jokes"' in to_dot(wf.spec)


def test_an_agent_node_mapped_over_a_list_sees_each_item_in_its_prompt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.testing import ScriptedProvider

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {"subjects": ["cats", "owls"]}

    schema = {"type": "object", "properties": {"joke": {"type": "string"}},
              "required": ["joke"]}
    wf = (Workflow("jokes").node("plan", plan)
          .agent("joke", prompt="A joke about {{ subject }}.", output=schema,
                 provider=ScriptedProvider([
                     {"content": {"joke": "cat joke"}, "usage": {"total_tokens": 10}},
                     {"content": {"joke": "owl joke"}, "usage": {"total_tokens": 15}}]))
          .edge(START, "plan")
          .map("plan", "subjects", "joke", as_="subject", collect="jokes", max_concurrency=1)
          .edge("joke", END))
    result, recs = run(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["jokes"] == [{"joke": {"joke": "cat joke"}},
                                     {"joke": {"joke": "owl joke"}}]
    assert result.tokens == 25
    prompts = [(r["item"], r["prompt"]) for r in recs if r["type"] == "agent.request"]
    assert prompts == [(0, "A joke about cats."), (1, "A joke about owls.")]


def test_an_isolated_mapped_node_knows_its_item(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "iso_map_nodes.py").write_text(
        "import os\n\n"
        "def item(state, ctx):\n"
        "    return {'pid': os.getpid(), 'index': ctx.item_index, 'x': state['x'],\n"
        "            'key': ctx.idempotency_key}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import iso_map_nodes  # type: ignore[import-not-found]

    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": ["a", "b"]}

    wf = (Workflow("iso").node("fan", fan)
          .node("item", iso_map_nodes.item, isolation="process", timeout="60s")
          .edge(START, "fan").map("fan", "xs", "item", as_="x", collect="out")
          .edge("item", END))
    result, _ = run(wf)
    assert result.status == "COMPLETED", result.error
    out = result.state["out"]
    assert [(o["index"], o["x"]) for o in out] == [(0, "a"), (1, "b")]
    assert all(o["pid"] != os.getpid() for o in out)
    assert out[0]["key"].endswith(":item:1:0") and out[1]["key"].endswith(":item:1:1")


def test_a_mapped_node_and_a_parallel_branch_writing_one_field_conflict() -> None:
    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": [1, 2]}

    async def each(state: dict[str, Any]) -> dict[str, Any]:
        return {"total": state["x"]}

    async def other(state: dict[str, Any]) -> dict[str, Any]:
        return {"summary": "other"}

    wf = (Workflow("c", state={"total": "add"}).node("fan", fan).node("each", each)
          .node("other", other)
          .edge(START, "fan").map("fan", "xs", "each", as_="x", collect="summary")
          .edge("fan", "other").edge("each", END).edge("other", END))
    result, _ = run(wf)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["type"] == "write_conflict"
    assert "'summary'" in result.error["message"]


def test_an_error_edge_catches_a_mapped_node_whose_item_failed() -> None:
    async def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"xs": [1, 0, 2]}

    async def invert(state: dict[str, Any]) -> dict[str, Any]:
        return {"inv": 1 / state["x"]}

    async def fallback(state: dict[str, Any]) -> dict[str, Any]:
        return {"handled": state["error"]["type"], "message": state["error"]["message"]}

    wf = (Workflow("caught").node("fan", fan).node("invert", invert).node("fallback", fallback)
          .edge(START, "fan").map("fan", "xs", "invert", as_="x", collect="out")
          .edge("invert", END).edge("invert", "fallback", on_error=["ZeroDivisionError"])
          .edge("fallback", END))
    result, recs = run(wf)
    assert result.status == "COMPLETED", result.error
    assert result.state["handled"] == "ZeroDivisionError"
    assert "(item 1, counting from 0, of 3)" in result.state["message"]
    assert "out" not in result.state  # the map did not complete: nothing collected
    [caught] = [r for r in recs if r["type"] == "node.failed" and "caught" in r]
    assert caught["node"] == "invert" and "item" not in caught


def test_validate_counts_a_collect_field_as_written_and_refuses_confirmed_tools_in_items(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fed = HEAD.replace("a: maps_nodes:f", "a: {call: maps_nodes:f, writes: [xs]}") \
        .replace("b: maps_nodes:f", "b: {call: maps_nodes:f, writes: [y]}") + (
        "edges:\n- {from: START, to: a}\n- {from: a, map: xs, to: b, collect: results}\n"
        "- {from: b, to: c, when: 'size(results) > 0'}\n- {from: b, to: END, otherwise: true}\n"
        "- {from: c, to: END}\n")
    (tmp_path / "maps_nodes.py").write_text(
        "def f(state):\n    return {}\n\ndef g(state, ctx):\n    return {}\n")
    (tmp_path / "wf.yaml").write_text(textwrap.dedent(fed))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "interlock", "validate", "wf.yaml"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stdout
    assert "results" not in result.stdout  # no "never fed" about the collected field
    guarded = HEAD.replace(
        "c: maps_nodes:g",
        "c:\n    agent: {provider: scripted, prompt: hi, replies: [ok],\n"
        "            tools: [{call: maps_nodes:f, confirm: true}]}") + (
        "edges:\n- {from: START, to: a}\n- {from: a, map: xs, to: c}\n- {from: c, to: END}\n")
    found = problems(guarded, tmp_path, monkeypatch)
    assert any("has tools a human confirms (maps_nodes:f)" in p for p in found), found
    # an MCP server's entry is named by the tools it confirms (it has no ``call``)
    mcp_guarded = guarded.replace(
        "{call: maps_nodes:f, confirm: true}",
        "{mcp: {command: [python, srv.py]}, confirm: [restart, wipe]}")
    found = problems(mcp_guarded, tmp_path, monkeypatch)
    assert any("has tools a human confirms (MCP tools restart, wipe)" in p
               for p in found), found
