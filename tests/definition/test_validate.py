"""Loading and static validation: every error names file:line:col."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import interlock
from interlock import START, Workflow, WorkflowError

NODES = '''
async def a(state): return {"a": 1}
async def b(state): return {"b": 1}
async def c(state): return {"c": 1}
def route(state): return "b"
'''


@pytest.fixture
def wdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "flows"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nodes.py").write_text(NODES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write(wdir: Path, text: str, name: str = "wf.yaml") -> Path:
    path = wdir / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def diagnostics(path: Path) -> list[str]:
    try:
        wf = interlock.load(path)
    except WorkflowError as exc:
        return [str(d) for d in exc.diagnostics]
    return [str(d) for d in wf.check()]


def test_a_valid_file_loads_and_runs(wdir: Path) -> None:
    path = write(wdir, """
        workflow: ok
        nodes:
          a: flows.nodes:a
          b: {call: flows.nodes:b}
        edges:
          - {from: START, to: a}
          - {from: a, to: b}
    """)
    wf = interlock.load(path)
    result = wf.run_sync(store="memory://")
    assert result.status == "COMPLETED" and result.state == {"a": 1, "b": 1}


def test_unknown_node_in_an_edge_has_its_line(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: flows.nodes:a
        edges:
          - {from: START, to: a}
          - {from: a, to: bb}
    """)
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:6:")
    assert "unknown node 'bb'" in d


def test_a_workflow_built_in_python_is_named_in_its_errors() -> None:
    """No file to point at: the workflow's name (it said ``<workflow>``)."""
    wf = Workflow("p3").node("b", lambda s: {}).edge(START, "b").edge("b", "nonexistent")
    with pytest.raises(WorkflowError) as caught:
        wf.compile()
    assert str(caught.value) == ("invalid workflow:\n  workflow 'p3': error: edge b -> "
                                 "nonexistent: unknown node 'nonexistent'")
    bad = Workflow("p4").node("b", lambda s: {}, retry="x")
    with pytest.raises(WorkflowError) as caught:
        bad.compile()
    assert str(caught.value).startswith("invalid workflow:\n  workflow 'p4': error: "
                                        "nodes.b.retry: ")


def test_a_name_twice_in_one_edge_is_an_error_and_a_repeated_edge_a_warning(
        wdir: Path) -> None:
    head = "workflow: t\nnodes: {a: flows.nodes:a, b: flows.nodes:b}\nedges:\n" \
           "  - {from: START, to: a}\n"
    path = write(wdir, head + "  - {from: [a, a], to: b}\n")
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:5:") and "'a' named more than once in 'from'" in d
    repeated = write(wdir, head + "  - {from: a, to: b}\n" * 2, "twice.yaml")
    [w] = diagnostics(repeated)
    assert w.startswith(f"{repeated}:6:") and "repeats edge a -> b" in w and "warning" in w


def one_condition(wdir: Path, when: str) -> Path:
    """START -> a, then a -> END when ``when`` (line 6), otherwise -> END."""
    return write(wdir, f"""
        workflow: t
        nodes:
          a: flows.nodes:a
        edges:
          - {{from: START, to: a}}
          - {{from: a, to: END, when: '{when}'}}
          - {{from: a, to: END, otherwise: true}}
    """)


def test_a_single_equals_in_a_condition_says_to_write_double(wdir: Path) -> None:
    path = one_condition(wdir, "a = 1")
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:6:") and "written '==' in CEL, not '='" in d


def test_a_condition_that_is_not_a_boolean_fails_the_run_with_its_line(wdir: Path) -> None:
    path = one_condition(wdir, "a")
    result = interlock.load(path).run_sync(store="memory://")
    assert result.status == "FAILED" and result.error["type"] == "expression_error"
    assert result.error["message"].startswith(f"{path}:6:")
    assert "gave 1 (int), not a boolean" in result.error["message"]


def test_typo_suggests_the_known_name(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          alpha: flows.nodes:a
        edges:
          - {from: START, to: alpah}
    """)
    assert any("did you mean 'alpha'" in d for d in diagnostics(path))


def test_unguarded_cycle_is_rejected_with_its_line(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: flows.nodes:a
          b: flows.nodes:b
        edges:
          - {from: START, to: a}
          - {from: a, to: b}
          - {from: b, to: a}
          - {from: b, to: END, when: 'b == 2'}
    """)
    ds = diagnostics(path)
    cycle = [d for d in ds if "unguarded cycle" in d]
    assert cycle and cycle[0].startswith(f"{path}:8:")
    assert "a -> b -> a" in cycle[0]


def test_a_guarded_cycle_is_accepted(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        input: [n]
        nodes:
          a: flows.nodes:a
        edges:
          - {from: START, to: a}
          - {from: a, to: a, when: 'n > 1', max: 3}
          - {from: a, to: END, otherwise: true}
    """)
    assert diagnostics(path) == []


def test_bad_expression_is_rejected_with_line_and_column(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        input: [x]
        nodes:
          a: flows.nodes:a
          b: flows.nodes:b
        edges:
          - {from: START, to: a}
          - {from: a, to: b, when: 'x >'}
          - {from: a, to: END, otherwise: true}
    """)
    [d] = [d for d in diagnostics(path) if "error" in d]
    assert d.startswith(f"{path}:8:")
    assert "does not compile" in d and "'x >'" in d


def test_uncompilable_call_target_is_rejected(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: flows.nodes:a
          b: {call: flows.nodes:missing}
          c: {call: flows.nowhere:c}
        edges:
          - {from: START, to: a}
          - {from: a, to: [b, c]}
    """)
    ds = diagnostics(path)
    assert any(d.startswith(f"{path}:4:") and "flows.nodes:missing" in d for d in ds)
    assert any(d.startswith(f"{path}:5:") and "cannot import module 'flows.nowhere'" in d
               for d in ds)


def test_unreachable_and_endless_nodes(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: flows.nodes:a
          b: flows.nodes:b
          c: flows.nodes:c
        edges:
          - {from: START, to: a}
          - {from: b, to: c}
          - {from: a, to: a, when: 'true'}
    """)
    ds = diagnostics(path)
    assert any("'b' is unreachable" in d and d.startswith(f"{path}:4:") for d in ds)
    assert any("'a' can never reach END" in d for d in ds)


def test_unknown_key_is_caught_with_its_position(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: {call: flows.nodes:a, timout: 3s}
        edges:
          - {from: START, to: a, wen: 'true'}
    """)
    ds = diagnostics(path)
    assert any(d.startswith(f"{path}:3:") and "unknown key 'timout'" in d for d in ds)
    assert any(d.startswith(f"{path}:5:") and "unknown key 'wen'" in d for d in ds)


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1"])
def test_a_file_that_is_not_utf8_is_an_error_naming_it(wdir: Path, encoding: str) -> None:
    path = wdir / "wf.yaml"
    path.write_bytes("# café\nworkflow: t\nnodes: {a: flows.nodes:a}\n"
                     "edges: [{from: START, to: a}]\n".encode(encoding))
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:") and "not UTF-8" in d


def test_an_import_that_calls_sys_exit_is_an_import_error(wdir: Path) -> None:
    module = f"quits_{uuid.uuid4().hex[:8]}"  # a fresh module: nothing cached
    (wdir / f"{module}.py").write_text("import sys\nsys.exit(3)\n")
    path = write(wdir, f"""
        workflow: t
        nodes:
          a: {module}:a
        edges:
          - {{from: START, to: a}}
    """)
    ds = diagnostics(path)
    assert any("SystemExit" in d and f"{module}:a" in d for d in ds), ds


def test_yaml_syntax_error_has_a_line(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: [unclosed
        edges: []
    """)
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:") and "cannot parse" in d


def test_yaml_1_2_keeps_yes_and_on_as_strings(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        config: {answer: yes, switch: on, really: true}
        nodes:
          a: flows.nodes:a
        edges:
          - {from: START, to: a}
    """)
    wf = interlock.load(path)
    assert wf.spec.config == {"answer": "yes", "switch": "on", "really": True}


def test_json_files_load_with_line_numbers(wdir: Path) -> None:
    path = write(wdir, """
        {"workflow": "t",
         "nodes": {"a": "flows.nodes:a"},
         "edges": [{"from": "START", "to": "a"},
                   {"from": "a", "to": "zz"}]}
    """, name="wf.json")
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:4:") and "unknown node 'zz'" in d


def test_declared_but_never_fed_is_a_warning(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: {call: flows.nodes:a, writes: [a]}
          b: flows.nodes:b
        edges:
          - {from: START, to: a}
          - {from: a, to: b, when: 'risk.level == "HIGH"'}
          - {from: a, to: END, otherwise: true}
    """)
    [d] = diagnostics(path)
    assert d.startswith(f"{path}:7:") and ": warning: " in d and "'risk'" in d
    interlock.load(path)  # a warning does not stop loading


def test_a_field_nothing_writes_or_declares_is_an_error_when_every_node_declares_writes(
        wdir: Path) -> None:
    # SPEC §4: an error -- every node says what it writes, so nothing can feed 'zzz'
    path = write(wdir, """
        workflow: t
        state: {st: {reducer: append}}
        nodes:
          a: {call: flows.nodes:a, writes: [a]}
          b: {call: flows.nodes:b, writes: [b]}
        edges:
          - {from: START, to: a}
          - {from: a, to: b, when: 'zzz == 1'}
          - {from: a, to: END, when: 'size(st) == 0'}
          - {from: a, to: END, otherwise: true}
    """)
    ds = diagnostics(path)
    assert any(d.startswith(f"{path}:8:") and ": error: " in d and "'zzz'" in d for d in ds), ds
    # ... and one that state declares but nothing writes: declared but never fed
    assert any(d.startswith(f"{path}:9:") and ": warning: " in d and "'st'" in d
               and "never fed" in d for d in ds), ds
    with pytest.raises(WorkflowError, match="zzz"):
        interlock.load(path)
    # a typo of a field that is written gets the name it was meant to be
    typo = write(wdir, """
        workflow: t
        nodes:
          a: {call: flows.nodes:a, writes: [severity]}
        edges:
          - {from: START, to: a}
          - {from: a, to: END, when: 'sevrity == "high"'}
          - {from: a, to: END, otherwise: true}
    """, "typo.yaml")
    [d] = diagnostics(typo)
    assert "reads 'sevrity' (did you mean 'severity'?)" in d



def test_an_approval_showing_a_field_nothing_provides_is_caught_with_its_line(
        wdir: Path) -> None:
    """A new user's find: ``show: [docc]`` passed validate and the approver saw null."""
    path = write(wdir, """
        workflow: t
        nodes:
          a: {call: flows.nodes:a, writes: [doc]}
          legal:
            approval: {show: [doc, docc]}
        edges:
          - {from: START, to: a}
          - {from: a, to: legal}
    """)
    ds = diagnostics(path)
    assert any(d.startswith(f"{path}:5:") and ": error: " in d
               and "node 'legal': approval shows 'docc' (did you mean 'doc'?)" in d
               for d in ds), ds
    assert not any("shows 'doc'," in d for d in ds), ds


def _join_beside_a_loop(sources: list[str]) -> Workflow:
    """s -> [side, l]; l loops while n < 3, then -> fin; a join of ``sources`` -> j."""
    wf = Workflow("join-loop", state={"n": "add"})
    for name in ("s", "side", "fin", "j"):
        wf.node(name, lambda s: None)
    wf.node("l", lambda s: {"n": 1})
    wf.edge(START, "s").edge("s", ["side", "l"])
    wf.edge("l", "l", when="n < 3").edge("l", "fin", otherwise=True)
    return wf.edge(sources, "j")


def test_a_join_from_inside_a_loop_it_leaves_is_warned_about() -> None:
    [w] = [str(d) for d in _join_beside_a_loop(["side", "l"]).warnings]
    assert "source 'l' is inside a loop" in w and "once per iteration" in w
    # joining from where the loop exits is the fix, and draws no warning
    assert _join_beside_a_loop(["side", "fin"]).warnings == []


def test_router_target_must_import(wdir: Path) -> None:
    path = write(wdir, """
        workflow: t
        nodes:
          a: flows.nodes:a
          b: flows.nodes:b
        edges:
          - {from: START, to: a}
          - {from: a, router: flows.nodes:nope, to: [b]}
    """)
    ds = diagnostics(path)
    assert any(d.startswith(f"{path}:7:") and "flows.nodes:nope" in d for d in ds)


@pytest.mark.parametrize("expr, why", [
    ("x" + " && x" * 400, "characters long"),
    ("xs.map(a, xs.map(b, xs.map(c, a + b + c))).size() > 0", "nested comprehensions"),
    ("xs.all(a, a > 0) && xs.exists(a, a > 1) && xs.all(a, a < 9) && xs.exists(a, a == 2)"
     " && xs.all(a, a != 7)", "comprehensions"),
])
def test_hostile_expressions_are_rejected_at_load(expr: str, why: str) -> None:
    wf = Workflow("hostile", input=["x", "xs"])
    wf.node("a", lambda s: None).node("b", lambda s: None)
    wf.edge(START, "a").edge("a", "b", when=expr).edge("a", "END", otherwise=True)
    t0 = time.perf_counter()
    with pytest.raises(WorkflowError, match=why):
        wf.compile()
    assert time.perf_counter() - t0 < 5  # rejected by inspection, not by running it


def test_a_single_comprehension_is_fine() -> None:
    wf = Workflow("ok", input=["xs"])
    wf.node("a", lambda s: None).node("b", lambda s: {"b": True})
    wf.edge(START, "a").edge("a", "b", when="xs.exists(x, x > 2)")
    wf.edge("a", "END", otherwise=True)
    assert wf.run_sync({"xs": [1, 3]}, store="memory://").state == {"xs": [1, 3], "b": True}



@pytest.mark.parametrize("user_first", [False, True], ids=["engine-first", "user-first"])
def test_the_users_own_import_of_cel_works_next_to_the_engines(user_first: bool) -> None:
    # the CEL extension may be initialised once per process (a second load panics):
    # the engine's direct load of it and the user's ``import cel`` must share one
    script = textwrap.dedent(f"""
        if {user_first}:
            import cel
            assert cel.evaluate("1 + 1") == 2
        from interlock import START, Workflow
        wf = Workflow("w", input=["i"])
        wf.node("a", lambda s: {{"a": 1}})
        wf.edge(START, "a", when="i < 3").edge(START, "END", otherwise=True)
        assert wf.run_sync({{"i": 1}}, store="memory://").state["a"] == 1
        import cel
        assert cel.evaluate("1 + 2") == 3
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"

# -- parity: the file and the builder produce the same workflow ---------------------------

PARITY_FILE = """
workflow: incident
description: RCA with a policy gate
config: {code_fix_min_confidence: 0.5}
input: [error_event]
state:
  events: {reducer: append}
limits: {steps: 50, timeout: 30s}
nodes:
  intake: flows.nodes:a
  retrieval: {call: flows.nodes:b, timeout: 5s,
              retry: {attempts: 3, backoff: 0.5s, errors: [ConnectionError]}}
  rag: {call: flows.nodes:c, reads: [error_event], writes: [docs]}
  rca: flows.nodes:a
  triage: flows.nodes:b
  fix: flows.nodes:c
  review: flows.nodes:a
edges:
  - {from: START, to: intake}
  - {from: intake, to: [retrieval, rag]}
  - {from: [retrieval, rag], to: rca}
  - {from: rca, switch: 'rca.severity', cases: {high: triage, low: review}, default: review}
  - {from: triage, router: flows.nodes:route, to: [fix, review]}
  - {from: fix, to: review, when: 'rca.confidence >= config.code_fix_min_confidence'}
  - {from: fix, to: END, otherwise: true}
  - {from: review, choose: [rca, END], max: 2}
"""


def test_file_and_builder_produce_the_same_model(wdir: Path) -> None:
    from flows import nodes  # type: ignore[import-not-found]

    from_file = interlock.load(write(wdir, PARITY_FILE))

    wf = Workflow("incident", description="RCA with a policy gate",
                  config={"code_fix_min_confidence": 0.5}, input=["error_event"],
                  state={"events": "append"}, limits={"steps": 50, "timeout": "30s"})
    wf.node("intake", nodes.a)
    wf.node("retrieval", nodes.b, timeout="5s",
            retry={"attempts": 3, "backoff": "0.5s", "errors": ["ConnectionError"]})
    wf.node("rag", nodes.c, reads=["error_event"], writes=["docs"])
    wf.node("rca", nodes.a).node("triage", nodes.b).node("fix", nodes.c)
    wf.node("review", nodes.a)
    wf.edge(START, "intake").edge("intake", ["retrieval", "rag"])
    wf.edge(["retrieval", "rag"], "rca")
    wf.switch("rca", "rca.severity", {"high": "triage", "low": "review"}, default="review")
    wf.router("triage", nodes.route, to=["fix", "review"])
    wf.edge("fix", "review", when="rca.confidence >= config.code_fix_min_confidence")
    wf.edge("fix", "END", otherwise=True)
    wf.choose("review", ["rca", "END"], max=2)
    wf.compile()

    assert wf.spec == from_file.spec
    assert wf.definition_hash() == from_file.definition_hash()
    assert from_file.spec.definition() == wf.spec.definition()


def test_builder_errors_name_the_node_and_fix() -> None:
    wf = Workflow("b")
    wf.node("a", lambda s: None)
    with pytest.raises(interlock.UsageError, match="already defined"):
        wf.node("a", lambda s: None)
    with pytest.raises(interlock.UsageError, match="unknown node option"):
        wf.node("c", lambda s: None, timout=3)


def test_a_dict_in_the_file_shape_loads(wdir: Path) -> None:
    data: dict[str, Any] = {"workflow": "d", "nodes": {"a": "flows.nodes:a"},
                            "edges": [{"from": "START", "to": "a"}]}
    assert interlock.load(data).run_sync(store="memory://").state == {"a": 1}
