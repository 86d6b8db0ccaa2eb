"""A condition that fails at run time on a value's type ("No such overload") says what
it read -- each name's type and value -- and points at the expression itself, the
``file:line:col`` of the ``when``/``switch`` value that validate's warnings use."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CliProject

import interlock

NODES = '''
def a(state):
    return {"x": 1, "doc": {"title": "t", "tags": ["p", "q"]}}


def b(state):
    return {}
'''


def flow(p: CliProject, edge: str, name: str = "cel.yaml") -> str:
    return p.workflow("""
        workflow: cel
        config: {limit: 3}
        nodes:
          a: {mod}:a
          b: {mod}:b
        edges:
          - {from: START, to: a}
          EDGE
          - {from: b, to: END}
    """.replace("EDGE", edge), name)


def failed(p: CliProject, path: str) -> dict[str, Any]:
    result = interlock.load(path).run_sync({})
    assert result.status == "FAILED" and result.error is not None
    assert result.error["type"] == "expression_error"
    return result.error


@pytest.mark.parametrize("expr, said", [
    ("x.foo > 1", "x is an int (1), which has no field 'foo'"),
    ('x + "s" == "1s"', "x is an int (1)"),
    ("doc.title > config.limit", 'doc.title is a string ("t"); config.limit is an int (3)'),
    ("doc.tags > 1", "doc.tags is a list of 2 items"),
])
def test_a_type_error_names_the_type_and_value_of_what_it_read(
        make_project: Callable[..., CliProject], expr: str, said: str) -> None:
    p = make_project(NODES)
    path = flow(p, f"- {{from: a, to: b, when: '{expr}'}}\n"
                   "          - {from: a, to: END, otherwise: true}")
    message = failed(p, path)["message"]
    assert f"cannot evaluate {expr!r}: No such overload" in message
    assert message.endswith(f" -- {said}")


def test_the_runtime_error_has_the_column_of_validates_warning(
        make_project: Callable[..., CliProject]) -> None:
    """validate warns at the `when` value (7:22 in the review's file); the run's error
    used to point at the edge (7:5)."""
    p = make_project(NODES)
    path = flow(p, "- {from: a, to: b, when: 'x.foo > 1'}\n"
                   "          - {from: a, to: END, otherwise: true}")
    # b declares its writes (a does not): x is in no 'writes', which validate warns of
    text = Path(path).read_text()
    Path(path).write_text(re.sub(r"b: (\S+:b)\n", r"b: {call: \1, writes: []}\n", text))
    [warning] = interlock.load(path).warnings
    assert "when reads 'x'" in warning.message
    loc = warning.location
    message = failed(p, path)["message"]
    assert message.startswith(f"{loc.file}:{loc.line}:{loc.col}: edge a -> b: cannot evaluate")
    assert (loc.line, loc.col) == (9, 22)  # the edge's `when`, not its `{` (9:5)


def test_a_switch_points_at_its_expression_too(make_project: Callable[..., CliProject]
                                               ) -> None:
    p = make_project(NODES)
    path = flow(p, "- {from: a, switch: 'x.kind', cases: {k: b}, default: END}")
    message = failed(p, path)["message"]
    assert message.startswith(f"{path}:9:15: edge a switch 'x.kind': cannot evaluate")
    assert "x is an int (1), which has no field 'kind'" in message
