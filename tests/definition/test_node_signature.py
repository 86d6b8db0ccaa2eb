"""A node function that cannot be called as ``fn(state)`` or ``fn(state, ctx)`` is refused
when the workflow loads (``validate`` too), with the node's line and the function's."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import interlock
from interlock import START, Workflow, WorkflowError
from interlock.cli import cli

NODES = '''
def one(state):
    return {"x": 1}


def two(state, ctx):
    return {"x": 2}


def defaults(state, limit=3, ctx=None):
    return {"x": 3}


def varargs(*args):
    return {"x": 4}


def threeargs(a, b, c):
    return {}


def nothing():
    return {}


def keyword(state, *, mode):
    return {}
'''


@pytest.fixture
def wdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "signodes.py").write_text(NODES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("signodes", None)  # the next test's is in its own folder


def workflow(wdir: Path, fn: str) -> Path:
    path = wdir / f"{fn}.yaml"
    path.write_text(textwrap.dedent(f"""\
        workflow: sig
        nodes:
          ok: signodes:one
          a: {{call: signodes:{fn}}}
        edges:
          - {{from: START, to: ok}}
          - {{from: ok, to: a}}
    """))
    return path


@pytest.mark.parametrize("fn", ["one", "two", "defaults", "varargs"])
def test_a_node_taking_state_or_state_and_ctx_loads_and_runs(wdir: Path, fn: str) -> None:
    result = interlock.load(workflow(wdir, fn)).run_sync({})
    assert result.status == "COMPLETED", result.error


@pytest.mark.parametrize("fn, problem", [
    ("threeargs", "signodes:threeargs takes 3 required parameters (a, b, c)"),
    ("nothing", "signodes:nothing takes no parameters"),
    ("keyword", "signodes:keyword has the required keyword-only parameter mode"),
])
def test_a_node_that_cannot_take_state_is_refused_at_load_with_its_lines(
        wdir: Path, fn: str, problem: str) -> None:
    with pytest.raises(WorkflowError) as info:
        interlock.load(workflow(wdir, fn))
    [d] = info.value.diagnostics
    assert (d.location.line, d.location.col) == (4, 7)  # the node's call value
    line = NODES.splitlines().index(next(s for s in NODES.splitlines()
                                         if s.startswith(f"def {fn}("))) + 1
    assert d.message == (f"node 'a': {problem}; a node takes (state) or (state, ctx) "
                         f"(def {fn} at signodes.py:{line})")


def test_validate_refuses_it_with_exit_2(wdir: Path) -> None:
    """The review's case: `validate` said ok, the run failed with a TypeError."""
    out = CliRunner().invoke(cli, ["validate", str(workflow(wdir, "threeargs").name)])
    assert out.exit_code == 2, out.output
    assert "threeargs.yaml:4:7: error: node 'a': signodes:threeargs takes 3 required " \
        "parameters" in out.output


def test_a_builder_node_is_checked_too() -> None:
    def body(a: object, b: object, c: object) -> dict[str, object]:
        return {}

    wf = Workflow("sig").node("a", body).edge(START, "a")
    with pytest.raises(WorkflowError, match=r"takes 3 required parameters \(a, b, c\); a "
                       r"node takes \(state\) or \(state, ctx\) \(def body at "):
        wf.compile()


def test_a_decorated_node_names_the_line_of_its_def(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 40: the error named the decorator's line (a decorated function's
    ``co_firstlineno``), not the ``def``'s."""
    (tmp_path / "decorated40.py").write_text(textwrap.dedent('''\
        import interlock
        wf = interlock.Workflow("api3")
        @wf.node(
            "n",
        )
        async def n(a, b, c):
            return {}
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        import decorated40

        with pytest.raises(WorkflowError, match=r"\(def n at decorated40\.py:6\)"):
            decorated40.wf.edge(START, "n").compile()
    finally:
        sys.modules.pop("decorated40", None)
