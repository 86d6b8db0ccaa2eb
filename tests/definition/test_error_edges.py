"""Error edges (SPEC §7): ``{from: X, to: Y, on_error: true | [ClassName, ...]}``.

Real runs through the CLI (a node module and a workflow file in a scratch directory)
and the Python API; a crash is a real SIGKILL of a real ``interlock run`` process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

import interlock
from interlock import START, Workflow, WorkflowError
from interlock._definition._render import to_dot, to_mermaid
from interlock.cli import cli

if TYPE_CHECKING:
    from conftest import CliProject

NODES = """
import os, time
from pathlib import Path

def _count(name):
    p = Path(f"count_{name}")
    n = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(n))
    return n

def flaky(state):
    n = _count("flaky")
    if n <= int(os.environ.get("FAIL_TIMES", "99")):
        raise KeyError(f"attempt {n}")
    return {"flaky": n}

def handle(state):
    return {"handled": state["error"]}

def after(state):
    return {"after": True}

def slow(state):
    time.sleep(5)

def spend(state, ctx):
    ctx.record_tokens(50)
    return {"spent": True}

def loop_back(state):
    return {}

class BadInput(ValueError):
    pass

def picky(state):
    raise BadInput("the input is not what I expected")
"""


def runs(project: CliProject, wf: str, *args: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any]]:
    result = project.cli("run", project.workflow(wf), "--json", *args, env=env)
    assert result.stdout, result.output
    return result.exit_code, json.loads(result.stdout)


def of_type(records: list[dict[str, Any]], rtype: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == rtype]


CAUGHT_AFTER_RETRIES = """
workflow: caught
nodes:
  flaky: {call: {mod}:flaky, retry: {attempts: 3}}
  handle: {mod}:handle
  after: {mod}:after
edges:
  - {from: START, to: flaky}
  - {from: flaky, to: after}
  - {from: flaky, to: handle, on_error: [LookupError]}
"""


def test_an_error_edge_is_taken_once_the_retries_are_spent(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    code, out = runs(p, CAUGHT_AFTER_RETRIES, "--run-id", "r1")
    assert code == 0 and out["status"] == "COMPLETED", out
    # the target saw the last error (a KeyError matched along its MRO: LookupError)
    assert out["state"]["handled"] == {"node": "flaky", "type": "KeyError",
                                       "message": "'attempt 3'", "attempt": 3}
    assert out["state"]["error"] == out["state"]["handled"]  # and it stays in the state
    assert "after" not in out["state"]  # the source's other edges are not decided
    recs = p.records("r1")
    assert len(of_type(recs, "node.retrying")) == 2
    [failed] = of_type(recs, "node.failed")
    assert failed["attempt"] == 3 and failed["error"]["type"] == "node_error"
    assert failed["caught"] == {"edge": 2, "error": out["state"]["handled"]}
    edges = of_type(recs, "edge.taken") + of_type(recs, "edge.skipped")
    from_flaky = [e for e in edges if e["from"] == "flaky"]
    assert from_flaky == [{**from_flaky[0], "edge": 2, "to": ["handle"], "expr": "on_error",
                           "value": "KeyError",
                           "reads": {"error": out["state"]["handled"]}}]
    assert p.cli("verify", "r1").exit_code == 0
    text = p.cli("trace", "r1").output
    assert "caught by edge 2 (on_error)" in text
    assert "flaky -> handle  [on_error = \"KeyError\"]  taken" in text


def test_a_success_does_not_take_the_error_edge(make_project: Callable[..., CliProject]
                                                ) -> None:
    p = make_project(NODES)
    code, out = runs(p, CAUGHT_AFTER_RETRIES, "--run-id", "ok", env={"FAIL_TIMES": "1"})
    assert code == 0 and out["state"]["after"] is True
    assert "handled" not in out["state"] and "error" not in out["state"]
    assert not any(r["from"] == "flaky" and r["edge"] == 2
                   for r in of_type(p.records("ok"), "edge.taken"))


def test_an_error_that_matches_no_edge_fails_the_run(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    code, out = runs(p, CAUGHT_AFTER_RETRIES.replace("LookupError", "ValueError"))
    assert code != 0 and out["status"] == "FAILED"
    assert out["error"]["type"] == "node_error" and "KeyError" in out["error"]["message"]
    assert out["error"]["message"].endswith("(not caught: its error edges catch ValueError, "
                                            "and KeyError is none of those nor a subclass "
                                            "of one)")


def test_the_first_matching_error_edge_in_declaration_order_is_taken(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    code, out = runs(p, """
        workflow: first-match
        nodes:
          flaky: {mod}:flaky
          handle: {mod}:handle
          after: {mod}:after
        edges:
          - {from: START, to: flaky}
          - {from: flaky, to: after, on_error: [ValueError]}
          - {from: flaky, to: handle, on_error: [KeyError]}
          - {from: flaky, to: after, on_error: true}
        """)
    assert code == 0, out
    assert out["state"]["handled"]["type"] == "KeyError" and "after" not in out["state"]


def test_a_nodes_own_timeout_and_token_budget_are_caught(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    code, out = runs(p, """
        workflow: own-limits
        nodes:
          slow: {call: {mod}:slow, timeout: 0.2s}
          spend: {call: {mod}:spend, tokens: 10}
          handle: {mod}:handle
        edges:
          - {from: START, to: slow}
          - {from: slow, to: spend, on_error: [TimeoutError]}
          - {from: spend, to: handle, on_error: [BudgetExceededError]}
        """)
    assert code == 0, out
    assert out["state"]["handled"]["type"] == "BudgetExceededError"
    assert "budget is 10" in out["state"]["handled"]["message"]
    recs = p.records(out["run_id"])
    assert [r["caught"]["error"]["type"] for r in of_type(recs, "node.failed")] == [
        "TimeoutError", "BudgetExceededError"]


def test_an_isolated_nodes_own_exception_class_is_matched_along_its_mro(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    code, out = runs(p, """
        workflow: isolated
        nodes:
          picky: {call: {mod}:picky, isolation: process}
          handle: {mod}:handle
        edges:
          - {from: START, to: picky}
          - {from: picky, to: handle, on_error: [ValueError]}
        """)
    assert code == 0, out
    assert out["state"]["handled"] == {"node": "picky", "type": "BadInput", "attempt": 1,
                                       "message": "the input is not what I expected"}


def test_engine_limits_are_never_caught(make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    # the run's budget (limits.tokens) is the engine's, not the node's
    _, out = runs(p, """
        workflow: run-budget
        limits: {tokens: 10}
        nodes:
          spend: {mod}:spend
          handle: {mod}:handle
        edges:
          - {from: START, to: spend}
          - {from: spend, to: handle, on_error: true}
        """)
    assert out["status"] == "FAILED" and out["error"]["type"] == "budget_exceeded", out
    assert "(not caught: the run's token budget (limits.tokens) is the engine's rule, not " \
        "the node's failure, and error edges never catch those)" in out["error"]["message"]
    assert "handled" not in out["state"]
    # the step limit: an error loop that never recovers stops at limits.steps
    _, out = runs(p, """
        workflow: step-limit
        limits: {steps: 5}
        nodes:
          flaky: {mod}:flaky
          loop_back: {mod}:loop_back
        edges:
          - {from: START, to: flaky}
          - {from: flaky, to: loop_back, on_error: true}
          - {from: loop_back, to: flaky}
        """)
    assert out["status"] == "FAILED" and out["error"]["type"] == "step_limit", out


def test_a_self_correcting_loop_is_bounded_by_max() -> None:
    """generate -> check -> (on error) generate again, at most twice: the third failure
    is not caught and fails the run with the check's own error."""
    seen: list[Any] = []

    def generate(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(state.get("error"))
        return {"code": "broken"}

    def check(state: dict[str, Any]) -> None:
        raise SyntaxError(f"invalid syntax in {state['code']}")

    wf = Workflow("bounded", limits={"steps": 50})
    wf.node("generate", generate).node("check", check)
    wf.edge("START", "generate").edge("generate", "check")
    wf.edge("check", "generate", on_error=["SyntaxError"], max=2)
    result = wf.run_sync(store="memory://")
    assert result.status == "FAILED"
    assert result.error is not None and "SyntaxError" in result.error["message"]
    assert [e and (e["type"], e["attempt"]) for e in seen] == [
        None, ("SyntaxError", 1), ("SyntaxError", 1)]
    assert result.state["error"]["message"] == "invalid syntax in broken"
    # the run's error says why the error edge did not catch the third failure
    assert result.error["message"].endswith(
        "(not caught: its error edge check -> generate (on error) was taken 2 times, its max)")


def test_a_self_correcting_loop_recovers() -> None:
    def generate(state: dict[str, Any]) -> dict[str, Any]:
        error = state.get("error")
        return {"code": "print(x)" if error is None else "x = 1; print(x)"}

    def check(state: dict[str, Any]) -> dict[str, Any]:
        scope: dict[str, Any] = {}
        exec(compile(state["code"], "<generated>", "exec"), scope)
        return {"ok": True}

    wf = Workflow("recovers", limits={"steps": 50})
    wf.node("generate", generate).node("check", check)
    wf.edge("START", "generate").edge("generate", "check")
    wf.edge("check", "generate", on_error=["NameError", "SyntaxError"], max=3)
    records: list[dict[str, Any]] = []
    result = wf.run_sync(store="memory://", listener=lambda rec, view: records.append(rec))
    assert result.status == "COMPLETED" and result.state["ok"] is True
    assert result.state["error"]["type"] == "NameError"
    assert [r["node"] for r in records if r["type"] == "node.started"] == [
        "generate", "check", "generate", "check"]


def test_an_error_edge_skipped_on_success_lets_a_join_fire_at_once() -> None:
    """On success, an error edge's target is ruled out (its port is dead), so a join
    after it fires with the branches that ran -- at once, not at the end of the run."""
    order: list[str] = []

    def mark(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def fn(state: dict[str, Any]) -> dict[str, Any]:
            order.append(name)
            return {name: True}
        return fn

    wf = Workflow("join-after-error-target")
    for n in ("a", "b", "fix", "joined", "last"):
        wf.node(n, mark(n))
    wf.edge("START", ["a", "b"])
    wf.edge("a", "fix", on_error=True)
    wf.edge(["a", "fix", "b"], "joined")
    wf.edge("joined", "last")
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED"
    assert "fix" not in order and order.index("joined") < order.index("last")


def test_the_builder_and_the_file_make_the_same_error_edge(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    name = p.workflow("""
        workflow: same
        nodes:
          a: {mod}:after
          b: {mod}:after
        edges:
          - {from: START, to: a}
          - {from: a, to: b, on_error: [ValueError], max: 2}
        """)
    wf = Workflow("same")
    wf.node("a", _noop).node("b", _noop)
    wf.edge("START", "a").edge("a", "b", on_error=["ValueError"], max=2)
    loaded = interlock.load(p.root / name)
    assert loaded.spec.edges == wf.spec.edges
    # and a definition without error edges is unchanged (old runs keep their hash)
    assert "on_error" not in json.dumps(Workflow("x").node("a", _noop).edge(
        "START", "a").definition())


def _noop(state: dict[str, Any]) -> None:
    return None


@pytest.mark.parametrize("edge, message", [
    ("{from: a, to: b, on_error: true, when: 'true'}", "cannot also have when"),
    ("{from: a, to: b, on_error: true, otherwise: true}", "cannot also have otherwise"),
    ("{from: a, to: b, on_error: ['not a class']}", "is not an exception class name"),
    ("{from: a, to: b, on_error: []}", "write 'on_error: true' to catch any error"),
    ("{from: START, to: b, on_error: true}", "START cannot fail"),
    ("{from: [a, c], to: b, on_error: true}", "has one source node"),
    ("{from: a, to: nope, on_error: true}", "unknown node 'nope'"),
])
def test_validate_refuses_a_malformed_error_edge(make_project: Callable[..., CliProject],
                                                 edge: str, message: str) -> None:
    p = make_project(NODES)
    (p.root / "wf.yaml").write_text(f"""
workflow: bad
nodes:
  a: {p.mod}:after
  b: {p.mod}:after
  c: {p.mod}:after
edges:
  - {{from: START, to: [a, c]}}
  - {edge}
""")
    with pytest.raises(WorkflowError) as info:
        interlock.load(p.root / "wf.yaml")
    assert message in str(info.value)
    assert "wf.yaml:9:" in str(info.value)  # the edge's line


@pytest.mark.parametrize("where", [
    "input: [error]",
    "state: {error: {reducer: append}}",
])
def test_the_error_field_is_reserved(make_project: Callable[..., CliProject],
                                    where: str) -> None:
    p = make_project(NODES)
    (p.root / "wf.yaml").write_text(f"""
workflow: reserved
{where}
nodes:
  a: {{call: {p.mod}:after, writes: [error]}}
edges:
  - {{from: START, to: a}}
""")
    with pytest.raises(WorkflowError) as info:
        interlock.load(p.root / "wf.yaml")
    text = str(info.value)
    assert text.count("'error' is reserved") == 2  # the declaration, and the writes


def test_an_approval_gate_has_no_error_edge(tmp_path: Path) -> None:
    wf = Workflow("gate")
    wf.approval("ok").node("b", _noop)
    wf.edge("START", "ok").edge("ok", "b", on_error=True)
    with pytest.raises(WorkflowError, match="approval gate, which does not fail"):
        wf.compile()


def test_a_condition_reading_error_without_error_edges_is_warned_about() -> None:
    wf = Workflow("no-error-edges")
    wf.node("a", _noop).node("b", _noop)
    wf.edge(START, "a").edge("a", "b", when="has(error.type)")
    [warning] = [d for d in wf.check() if d.code == "never-fed"]
    assert "only an on_error edge's catch writes" in warning.message
    wf2 = Workflow("with")
    wf2.node("a", _noop).node("b", _noop).node("c", _noop)
    wf2.edge(START, "a").edge("a", "b", on_error=True).edge("b", "c", when="has(error.type)")
    assert not [d for d in wf2.check() if d.code == "never-fed"]


def test_a_cycle_closed_by_an_error_edge_is_guarded() -> None:
    wf = Workflow("guarded")
    wf.node("a", _noop).node("b", _noop)
    wf.edge("START", "a").edge("a", "b").edge("b", "a", on_error=True)
    wf.compile()  # no "unguarded cycle"


def test_graph_draws_error_edges_in_red_and_labelled() -> None:
    wf = Workflow("drawn")
    wf.node("a", _noop).node("b", _noop)
    wf.edge("START", "a").edge("a", "b", on_error=["KeyError"], max=2)
    mermaid = to_mermaid(wf.spec)
    assert 'n_a -.->|"on error: KeyError, max 2"| n_b' in mermaid
    assert "linkStyle 1 stroke:#c53030" in mermaid
    assert "n_a --> END" in mermaid  # succeeding, a ends the run: the error edge is no exit
    dot = to_dot(wf.spec)
    assert 'n_a -> n_b [label="on error: KeyError, max 2", style=dashed, color="#c53030"' in dot


# -- a crash after the error edge was taken ----------------------------------------------

CRASH_NODES = '''
import os, time
from pathlib import Path

def _mark(what):
    with open("trace.txt", "a") as f:
        f.write(f"{os.getpid()} {what}\\n")

def check(state):
    _mark("check")
    raise NameError("name 'x' is not defined")

def repair(state):
    _mark("repair")
    if os.environ.get("CRASH_AT") == "repair":
        Path("ready_repair").write_text("")
        while True:
            time.sleep(0.05)
    return {"repaired": state["error"]["message"]}
'''

CRASH_WORKFLOW = """
workflow: crash-after-catch
nodes:
  check: nodes:check
  repair: nodes:repair
edges:
  - {from: START, to: check}
  - {from: check, to: repair, on_error: [NameError]}
"""


def test_a_resume_after_a_crash_follows_the_error_edge(tmp_path: Path) -> None:
    from test_crash import cli, start_and_kill  # a real process, SIGKILLed in a node

    (tmp_path / "nodes.py").write_text(CRASH_NODES)
    (tmp_path / "wf.yaml").write_text(CRASH_WORKFLOW)
    store = f"sqlite:///{tmp_path}/runs.db"
    run_id = start_and_kill(tmp_path, "repair", ["repair"], store)
    out = cli(tmp_path, "resume", run_id, "--store", store, "--json")
    result = json.loads(out.stdout)
    assert result["status"] == "COMPLETED", result
    assert result["state"]["repaired"] == "name 'x' is not defined"
    ran = [line.split()[1] for line in (tmp_path / "trace.txt").read_text().splitlines()]
    assert ran == ["check", "repair", "repair"]  # check's caught failure is not re-run
    verify = cli(tmp_path, "verify", run_id, "--store", store)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_an_agent_that_fails_is_caught_like_any_node() -> None:
    from interlock.testing import ScriptedProvider

    wf = Workflow("agent-fails")
    schema = {"type": "object", "properties": {"level": {"type": "string"}},
              "required": ["level"]}
    wf.agent("rate", prompt="Rate it", output=schema,
             provider=ScriptedProvider(["not json", "still not json"]))
    wf.node("fallback", lambda s: {"level": "unknown", "why": s["error"]["type"]})
    wf.edge(START, "rate").edge("rate", "fallback", on_error=["AgentError"])
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED", result.error
    assert result.state["level"] == "unknown"
    assert result.state["error"]["node"] == "rate"
    assert "AgentError" in interlock_mro(result.state["why"])


def interlock_mro(name: str) -> list[str]:
    from interlock import agents

    cls = getattr(agents, name)
    return [c.__name__ for c in cls.__mro__]


def test_a_node_that_would_write_its_output_to_the_error_field_is_refused() -> None:
    from interlock.testing import ScriptedProvider

    wf = Workflow("clobber")
    wf.approval("error")
    wf.agent("judge", prompt="p", output_key="error", provider=ScriptedProvider(["x"]))
    child = Workflow("child")
    child.node("work", lambda s: {"done": True})
    child.edge(START, "work")
    wf.subworkflow("nested", child, output_key="error")
    wf.edge(START, "error").edge("error", "judge").edge("judge", "nested")
    with pytest.raises(WorkflowError) as info:
        wf.compile()
    text = str(info.value)
    assert "node 'error' would write its decision to 'error': 'error' is reserved" in text
    assert "node 'judge' would write its reply to 'error': 'error' is reserved" in text
    assert "node 'nested' would write its result to 'error': 'error' is reserved" in text


def test_an_item_failing_fails_its_mapped_node_and_the_nodes_error_edge_catches_it(
        tmp_path: Path) -> None:
    def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {"subjects": ["cats", "owls", "eels"]}

    def joke(state: dict[str, Any]) -> dict[str, Any]:
        if state["subject"] == "owls":
            raise LookupError("no joke about owls")
        return {"joke": state["subject"]}

    wf = Workflow("map-caught")
    wf.node("plan", plan).node("joke", joke)
    wf.node("fallback", lambda s: {"fallback": s["error"]["message"]})
    wf.node("best", lambda s: {"best": s["jokes"]})
    wf.edge(START, "plan").map("plan", "subjects", "joke", as_="subject", collect="jokes",
                               max_concurrency=1)
    wf.edge("joke", "best").edge("joke", "fallback", on_error=["LookupError"])
    store = f"sqlite:///{tmp_path}/runs.db"
    result = wf.run_sync(store=store)
    assert result.status == "COMPLETED", result.error
    assert result.state["fallback"] == "no joke about owls (item 1, counting from 0, of 3)"
    assert "best" not in result.state and "jokes" not in result.state
    assert asyncio.run(interlock.verify(result.run_id, store=store)).ok
    # the caught visit is over: its stored log folds to the same state
    assert asyncio.run(interlock.status(result.run_id, store=store)).state == result.state


def test_a_goto_to_an_undeclared_target_is_not_caught() -> None:
    wf = Workflow("bad-goto")
    wf.node("pick", lambda s: interlock.goto("nowhere")).node("a", _noop).node("fix", _noop)
    wf.edge(START, "pick").choose("pick", ["a"]).edge("pick", "fix", on_error=True)
    result = wf.run_sync(store="memory://")
    assert result.status == "FAILED" and result.error is not None
    assert result.error["type"] == "invalid_route"
    assert "not caught: a route to an undeclared target is the engine's rule" in \
        result.error["message"]


@pytest.mark.parametrize(("names", "hint"), [
    ("[ValueErorr]", "did you mean 'ValueError'?"),
    ("[NodeTimout, KeyError]", "did you mean 'NodeTimeout'?"),
    ("[ValueError, NodeTimeout, BudgetExceededError]", None),
    ("[PaymentDeclined]", None),  # a class of the user's own: nothing to say
])
def test_validate_warns_of_a_misspelled_exception_class(
        make_project: Callable[..., CliProject], names: str, hint: str | None) -> None:
    p = make_project(NODES)
    path = p.workflow(CAUGHT_AFTER_RETRIES.replace("[LookupError]", names))
    result = CliRunner().invoke(cli, ["validate", path])
    assert result.exit_code == 0, result.output
    if hint is None:
        assert "on_error names" not in result.output
    else:
        assert hint in result.output
        # where it is: the file and the on_error line (the edge is the file's 10th line)
        assert f"{Path(path).name}:10:" in result.output, result.output
