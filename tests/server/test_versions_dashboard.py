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


# v2 of GATED: a node ``c`` between the gate and ``b``, its edge listed first, so that
# every edge index of the old definition names another edge in the new one
GATED_V2 = GATED.replace("  b: dafter:bump", "  c: dnodes:double\n  b: dafter:bump") \
    .replace("edges:\n", "edges:\n  - {from: c, to: b}\n") \
    .replace("{from: gate, to: b,", "{from: gate, to: c,")


def test_a_migrated_runs_page_draws_the_new_graph_and_lights_the_old_records_by_name(
        tmp_path: Path, pages: Any) -> None:
    import yaml

    (tmp_path / "dnodes.py").write_text(NODES)
    (tmp_path / "dafter.py").write_text(ADDER)
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "drifting.yaml").write_text(GATED)
    served = Served(tmp_path)
    try:
        with served.client() as c:
            assert c.post("/api/workflows/drifting/runs",
                          json={"run_id": "mig-1"}).status_code == 201
            wait_status(c, "mig-1", "WAITING_APPROVAL")
            moved = c.post("/api/runs/mig-1/migrate", json={
                "definition": yaml.safe_load(GATED_V2), "by": "ops"})
            assert moved.status_code == 200, moved.text
            at = moved.json()["recorded"]
        page = pages.new_page()
        page.goto(served.url + "/runs/mig-1")
        expect(page.locator("#migrated")).to_contain_text(f"migrated at record {at} by ops")
        svg = page.locator("svg.graph")
        expect(svg.locator('[data-node="c"]')).to_have_count(1)  # the new node is drawn
        # the records before the migration: lit by their nodes, not by their edge index
        for source, target in (("START", "a"), ("a", "gate")):
            expect(svg.locator(f'.route[data-source="{source}"][data-target="{target}"]')
                   ).to_have_attribute("data-state", "taken")
        expect(svg.locator('[data-edge="0"]')).to_have_attribute("data-state", "idle")
        expect(svg.locator('[data-edge="1"]')).to_have_attribute("data-state", "idle")

        page.locator('#run-gate article.gate button[data-decision="approve"]').click()
        expect(page.locator("#run-status [data-status]")).to_have_attribute(
            "data-status", "COMPLETED")
        # after it: by index, in the graph it is on (gate -> c is edge 3)
        expect(svg.locator('[data-edge="3"]')).to_have_attribute("data-state", "taken")
        expect(svg.locator('[data-edge="0"]')).to_have_attribute("data-state", "taken")
    finally:
        served.stop()
