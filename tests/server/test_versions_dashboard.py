"""The dashboard's notice of code drift (docs/versions.md) in a real browser: a waiting
run whose node's module changed after it started says so on its run page, naming the
node, before anyone decides; a run whose code did not change shows no notice.

In a file of its own: it takes test_dashboard's browser fixtures, and that module skips
itself where Chromium is missing (so does this one, through the import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_dashboard import WAIT, browser, expect  # noqa: F401  (browser: a fixture)
from test_server import Served, wait_status

NODES = '''
def first(state):
    return {"x": 1}

def double(state):
    return {"y": state["x"] * 2}
'''

ADDER = '''
def bump(state):
    return {"y": state["x"] + 1}
'''

GATED = '''
workflow: drifting
nodes:
  a: dnodes:first
  gate: {approval: {show: [x]}}
  b: dafter:bump
edges:
  - {from: START, to: a}
  - {from: a, to: gate}
  - {from: gate, to: b, when: 'gate.decision == "approved"'}
  - {from: b, to: END}
'''


@pytest.fixture
def pages(browser: Any) -> Any:  # noqa: F811  (test_dashboard's fixture, by name)
    ctx = browser.new_context()
    ctx.set_default_timeout(WAIT)
    errors: list[str] = []
    ctx.on("weberror", lambda e: errors.append(str(e.error)))
    yield ctx
    ctx.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def test_the_run_page_says_which_nodes_code_changed(tmp_path: Path, pages: Any) -> None:
    (tmp_path / "dnodes.py").write_text(NODES)
    (tmp_path / "dafter.py").write_text(ADDER)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "drifting.yaml").write_text(GATED)
    served = Served(tmp_path)
    try:
        with served.client() as c:
            for rid in ("drift-1", "same-1"):
                r = c.post("/api/workflows/drifting/runs", json={"run_id": rid})
                assert r.status_code == 201, r.text
                wait_status(c, rid, "WAITING_APPROVAL")
        page = pages.new_page()
        page.goto(served.url + "/runs/same-1")
        expect(page.locator("#run-status [data-status]")).to_have_attribute(
            "data-status", "WAITING_APPROVAL")
        expect(page.locator("#code-changed")).to_be_empty()

        (tmp_path / "dafter.py").write_text(ADDER.replace("+ 1", "+ 2") + "# v2\n")  # a deploy
        page.goto(served.url + "/runs/drift-1")
        notice = page.locator("#code-changed .notice")
        expect(notice).to_contain_text("The code of b changed since this run started")
        expect(notice).to_contain_text("interlock migrate drift-1 --to FILE")
    finally:
        served.stop()
