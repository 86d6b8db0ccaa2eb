"""A node's exception names the line of the user's code it came from: the innermost frame
that is neither interlock's nor a library's, on the error's own line (as `run`, `status`
and `trace` print it), with the full traceback left in ``error.details.traceback``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import CliProject

import interlock
from interlock import START, Workflow

NODES = '''
import json


def boom(state):
    helper()


def helper():
    raise ValueError("kaboom")


def parse(state):
    return json.loads("{not json")


def caught(state):
    return {"seen": state["error"]}
'''
HELPER_LINE = 10  # `raise ValueError("kaboom")`
PARSE_LINE = 14  # `return json.loads(...)`: the user's call, not json's own frames

FLOW = """
workflow: origin
nodes:
  a: {call: {mod}:NODE, isolation: ISOLATION}
edges:
  - {from: START, to: a}
"""


def run_json(p: CliProject, node: str, isolation: str = "thread") -> tuple[int, Any]:
    wf = p.workflow(FLOW.replace("NODE", node).replace("ISOLATION", isolation))
    result = p.cli("run", wf, "--json", "--run-id", f"{node}-{isolation}")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_the_error_line_names_the_innermost_frame_of_the_users_code(
        make_project: Callable[..., CliProject], isolation: str) -> None:
    p = make_project(NODES)
    code, out = run_json(p, "boom", isolation)
    assert code == 1 and out["status"] == "FAILED"
    at = f"{p.mod}.py:{HELPER_LINE} in helper"
    assert out["error"]["message"] == f"node 'a' raised ValueError: kaboom (at {at})"
    details = out["error"]["details"]
    assert details["at"] == at and details["exception"] == "ValueError"
    assert f'{p.mod}.py", line {HELPER_LINE}, in helper' in details["traceback"]
    # the stored error is what status and trace print
    rid = f"boom-{isolation}"
    assert f"(at {at})" in p.cli("status", rid).output
    assert f"(at {at})" in p.cli("trace", rid).output


def test_a_library_raising_points_at_the_users_call_into_it(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    _, out = run_json(p, "parse")
    assert out["error"]["message"].endswith(f"(at {p.mod}.py:{PARSE_LINE} in parse)")
    assert "json/decoder.py" in out["error"]["details"]["traceback"]  # the full one


def test_run_and_status_say_where_the_full_traceback_is(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    ran = p.cli("run", p.workflow(FLOW.replace("NODE", "boom").replace("ISOLATION", "thread")),
                "--run-id", "r1")
    hint = (f"the full traceback: `interlock status r1 --json --store {p.store}` "
            "(error.details.traceback)")
    assert ran.exit_code == 1 and hint in ran.output
    assert hint in p.cli("status", "r1").output


def test_an_error_interlock_raised_itself_names_no_frame(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent without its key: every frame is interlock's (or asyncio's)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    wf = Workflow("noframe").agent("ask", model="gpt-test", prompt="hi").edge(START, "ask")
    result = wf.run_sync({})
    assert result.status == "FAILED" and result.error is not None
    assert "(at " not in result.error["message"]
    assert "at" not in result.error["details"]


def test_an_error_edges_target_gets_the_exceptions_own_message(
        make_project: Callable[..., CliProject]) -> None:
    p = make_project(NODES)
    wf = p.workflow("""
        workflow: caught
        nodes:
          a: {mod}:boom
          h: {mod}:caught
        edges:
          - {from: START, to: a}
          - {from: a, to: h, on_error: true}
    """)
    out = json.loads(p.cli("run", wf, "--json").stdout)
    assert out["status"] == "COMPLETED"
    assert out["state"]["seen"] == {"node": "a", "type": "ValueError", "message": "kaboom",
                                    "attempt": 1}


def test_the_python_api_error_carries_it_too(make_project: Callable[..., CliProject]
                                             ) -> None:
    p = make_project(NODES)
    result = interlock.load(p.workflow(FLOW.replace("NODE", "boom")
                                       .replace("ISOLATION", "thread"))).run_sync({})
    assert result.error is not None
    assert result.error["message"].endswith(f"(at {p.mod}.py:{HELPER_LINE} in helper)")
