"""The dashboard's graph in Chromium (issue 33): for every example served, no drawn edge
passes through a node's box, measured on the SVG's own geometry (points along each drawn
path against each node's rectangle); a run's modify re-entry is drawn and lit; labels carry
the condition and ``max N``; nodes count their visits; a decision refused by ``max`` says
so. The layout's own checks over the tricky shapes: test_graph_layout.py.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_dashboard import CHROMIUM, WAIT, expect, sync_api  # (the browser's skip too)
from test_server import GATED, NODES, Served, wait_status

pytest.importorskip("fastapi")
pytest.importorskip("grandalf", reason="the graph's layout needs the server extra")

REPO = Path(__file__).resolve().parents[2]

# examples served (their nodes import from the repository root); the openai variants are
# the agents' graphs again
EXAMPLES = ["audit", "code_assistant", "incident", "jokes", "triage"]

OPEN_GATE = GATED.replace("workflow: gated", "workflow: regate").replace(
    ', approvers: [alice, "role:admin"]', "")

# a loop whose `max` refuses the third pass
LOOPED = '''
workflow: looped
input: [n]
nodes:
  first: {call: snodes:first, writes: [first]}
  last: {call: snodes:last, writes: [last]}
edges:
  - {from: START, to: first}
  - {from: first, to: last}
  - {from: last, to: first, when: 'last > 0', max: 2}
  - {from: last, to: END, otherwise: true}
'''

# a node that sends itself back (review 42: its label was clipped at the canvas's edge)
SELF_LOOP = '''
workflow: selfloop
input: [n]
nodes:
  step: {call: snodes:first, writes: [first]}
edges:
  - {from: START, to: step}
  - {from: step, to: step, when: 'n < 3', max: 5}
  - {from: step, to: END, otherwise: true}
'''

# a join one of whose sources never ran (its `when` was false): settled with the other
PARTIAL = '''
workflow: partial
input: [n]
nodes:
  split: snodes:first
  never: snodes:last
  side: {call: snodes:counted, writes: [counted]}
  joined: {call: snodes:counted, writes: [counted]}
edges:
  - {from: START, to: split}
  - {from: split, to: never, when: 'first > 100'}
  - {from: split, to: side}
  - {from: [never, side], to: joined}
'''

# a join into a gate; v2 (migrated onto while the gate waits) puts an edge first, so that
# every edge index of v1 names another edge in v2
JOINED = '''
workflow: joined
input: [n]
nodes:
  split: snodes:first
  p: snodes:last
  q: {call: snodes:counted, writes: [counted]}
  gate: {approval: {show: [first]}}
edges:
  - {from: START, to: split}
  - {from: split, to: [p, q]}
  - {from: [p, q], to: gate}
'''
JOINED_V2 = JOINED.replace("  gate:", "  after: snodes:first\n  gate:").replace(
    "edges:\n", "edges:\n  - {from: gate, to: after}\n")

# what the run page's graph shows: each arrow's state and each node's, in a stable order
PICTURE = """() => ({
  routes: [...document.querySelectorAll("svg.graph .route")].map((r) =>
    `${r.dataset.source}→${r.dataset.target} ${r.dataset.state}`).sort(),
  nodes: [...document.querySelectorAll("svg.graph [data-node]")].map((n) =>
    `${n.dataset.node} ${n.dataset.state}`).sort(),
})"""

# every drawn path sampled every 2 px against every node's box (shrunk by 1 px): the
# (path, node) pairs that meet
THROUGH = """() => {
  const svg = document.querySelector("svg.graph");
  const boxes = [...svg.querySelectorAll("[data-node] > rect")].map((r) => {
    const b = r.getBBox();
    return { name: r.parentNode.dataset.node, x0: b.x + 1, y0: b.y + 1,
             x1: b.x + b.width - 1, y1: b.y + b.height - 1 };
  });
  const bad = [];
  let paths = 0;
  for (const path of svg.querySelectorAll(".edge-line")) {
    paths++;
    const route = path.parentNode;
    const length = path.getTotalLength();
    for (let at = 0; at <= length; at += 2) {
      const p = path.getPointAtLength(at);
      for (const b of boxes) {
        if (p.x > b.x0 && p.x < b.x1 && p.y > b.y0 && p.y < b.y1) {
          bad.push(`${route.dataset.source}→${route.dataset.target} through ${b.name}`);
        }
      }
    }
  }
  return { paths, bad: [...new Set(bad)] };
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("graph")
    (root / "snodes.py").write_text(NODES)
    (root / "examples").symlink_to(REPO / "examples")
    flows = root / "flows"
    flows.mkdir()
    for name in EXAMPLES:
        shutil.copy(REPO / "examples" / name / "workflow.yaml", flows / f"{name}.yaml")
    (flows / "regate.yaml").write_text(textwrap.dedent(OPEN_GATE))
    (flows / "looped.yaml").write_text(textwrap.dedent(LOOPED))
    (flows / "partial.yaml").write_text(textwrap.dedent(PARTIAL))
    (flows / "selfloop.yaml").write_text(textwrap.dedent(SELF_LOOP))
    (flows / "joined.yaml").write_text(textwrap.dedent(JOINED))
    for name in ("INTERLOCK_STORE", "INTERLOCK_LOG_KEY"):
        os.environ.pop(name, None)
    served = Served(root)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def page(server: Served) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(WAIT)
        errors: list[str] = []
        ctx.on("weberror", lambda e: errors.append(str(e.error)))
        yield ctx.new_page()
        browser.close()
        assert not errors, f"uncaught errors in the page: {errors}"


def workflow_names(server: Served) -> list[str]:
    with server.client() as c:
        return [w["name"] for w in c.get("/api/workflows").json()]


def test_no_edge_passes_through_a_node_in_any_example(server: Served, page: Any) -> None:
    names = workflow_names(server)
    assert len(names) == len(EXAMPLES) + 5, names
    for name in names:
        page.goto(f"{server.url}/workflows/{name}")
        expect(page.locator("svg.graph [data-node]").first).to_be_visible()
        with server.client() as c:
            graph = c.get(f"/api/workflows/{name}").json()["graph"]
        result = page.evaluate(THROUGH)
        assert result["paths"] == len(graph["layout"]["edges"]), name
        assert result["bad"] == [], name


def test_audit_labels_and_reentry(server: Served, page: Any) -> None:
    page.goto(f"{server.url}/workflows/audit-engagement")
    svg = page.locator("svg.graph")
    reentry = svg.locator('[data-reentry="approval→risk"]')
    expect(reentry).to_have_count(1)
    expect(reentry.locator(".route.kind-reentry .edge-line")).to_have_count(1)
    label = svg.locator('.edge-label-box[data-source="reviewer"][data-target="evidence"]')
    expect(label.locator("text")).to_have_text('review.verdict == "revise" · max 2')
    expect(label.locator("title")).to_contain_text("taken at most 2 times")
    expect(svg.locator('.edge-label-box[data-source="risk"][data-target="evidence"] text')
           ).to_have_text("risk.level: default")
    expect(svg.locator('.route.kind-back[data-source="reviewer"]')).to_have_count(1)


def test_a_self_loops_label_is_whole_inside_the_graph(server: Served, page: Any) -> None:
    """Review 42: a self-loop's label was cut at the graph's right edge (`n < 3 · ı`)."""
    page.goto(f"{server.url}/workflows/selfloop")
    label = page.locator('svg.graph .edge-label-box.kind-self[data-source="step"]')
    expect(label.locator("text")).to_have_text("n < 3 · max 5")
    inside = page.evaluate("""() => {
      const svg = document.querySelector("svg.graph");
      const t = svg.querySelector(".edge-label-box.kind-self text").getBBox();
      const n = svg.querySelector('[data-node="step"] > rect').getBBox();
      const view = svg.viewBox.baseVal;
      return { inside: t.x >= 0 && t.x + t.width <= view.width,
               clear: t.x >= n.x + n.width };
    }""")
    assert inside == {"inside": True, "clear": True}


def test_a_modify_reentry_is_drawn_taken(server: Served, page: Any) -> None:
    with server.client() as c:
        r = c.post("/api/workflows/regate/runs", json={"input": {"n": 1}, "run_id": "re-1"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/re-1")
    gate = page.locator('svg.graph [data-node="gate"]')
    expect(gate).to_have_attribute("data-state", "waiting")
    with server.client() as c:
        r = c.post("/api/runs/re-1/decisions",
                   json={"decision": "modify", "node": "gate", "patch": {"n": 5}, "by": "bo"})
        assert r.status_code == 200, r.text
    reentry = page.locator('svg.graph [data-reentry="gate→first"] .route')
    expect(reentry).to_have_attribute("data-state", "taken")
    # first ran twice (the re-entry's visit), shown on its box
    expect(page.locator('svg.graph [data-node="first"]')).to_have_attribute("data-visits", "2")
    expect(page.locator('svg.graph [data-node="first"] .tally text')).to_have_text("2×")
    assert page.evaluate(THROUGH)["bad"] == []


def test_max_reached_is_said_in_the_decisions(server: Served, page: Any) -> None:
    with server.client() as c:
        r = c.post("/api/workflows/looped/runs", json={"input": {"n": 1}, "run_id": "loop-1"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/loop-1")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    expect(page.locator('svg.graph [data-node="first"]')).to_have_attribute("data-visits", "3")
    back = page.locator('svg.graph .route.kind-back[data-source="last"]')
    expect(back).to_have_attribute("data-state", "taken")
    # the otherwise edge, implied by the `when` edge's record (log format 2): lit too
    expect(route(page, "last", "END")).to_have_attribute("data-state", "taken")
    page.locator('svg.graph [data-edge="2"] .edge-hit').first.dispatch_event("click")
    decisions = page.locator("#inspector ol.decisions > li")
    expect(decisions).to_have_count(3)
    expect(decisions.nth(2)).to_contain_text("not taken")
    expect(decisions.nth(2).locator(".reason")).to_have_text("max 2 reached")


def test_a_map_nodes_items_are_counted_on_its_box(server: Served, page: Any) -> None:
    with server.client() as c:
        r = c.post("/api/workflows/jokes/runs", json={"input": {"topic": "animals"},
                                                      "run_id": "map-1"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/map-1")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    joke = page.locator('svg.graph [data-node="joke"]')
    expect(joke).to_have_attribute("data-items", "5")  # one visit per subject
    expect(joke.locator(".tally text")).to_have_text("5 items")
    expect(page.locator('svg.graph [data-node="best"] .tally text')).to_have_text("1×")
    label = page.locator('svg.graph .edge-label-box[data-source="plan"] text')
    expect(label).to_have_text("map subjects")


def route(page: Any, source: str, target: str) -> Any:
    return page.locator(f'svg.graph .route[data-source="{source}"][data-target="{target}"]')


def replayed(page: Any, server: Served, run_id: str) -> dict[str, list[str]]:
    """The page reloaded, once it has read the run's log up to its last record: what its
    graph shows."""
    with server.client() as c:
        last = c.get(f"/api/runs/{run_id}/records").json()[-1]["seq"]
    page.reload()
    expect(page.locator(f'#timeline tr[data-seq="{last}"]').first).to_be_attached()
    picture: dict[str, list[str]] = page.evaluate(PICTURE)
    return picture


def decide(server: Served, run_id: str, gate: str) -> None:
    with server.client() as c:
        r = c.post(f"/api/runs/{run_id}/decisions",
                   json={"decision": "approve", "node": gate, "by": "bo"})
        assert r.status_code == 200, r.text


def test_the_incident_run_lights_every_arrow_it_took_live_and_replayed(
        server: Served, page: Any) -> None:
    """Review 39: the join's arrows retrieval → rca and rag → rca (an ``edge.taken`` from
    ``*`` with ``arrived``) stayed grey; code_fix, which no edge leaves, had no arrow to
    END. Every arrow the run took is lit, those log format 2 implies too (intake's fan-out,
    rca → recommend: no record of their own), as the records arrive and the same on a
    reload mid-run and after the run."""
    event = (REPO / "examples" / "incident" / "events" / "checkout-500.json").read_text()
    with server.client() as c:
        r = c.post("/api/workflows/incident-response/runs",
                   json={"input": json.loads(event), "run_id": "inc-1"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/inc-1")
    expect(page.locator('svg.graph [data-node="approval"]')).to_have_attribute(
        "data-state", "waiting")
    for source, target in (("START", "intake"), ("intake", "retrieval"), ("intake", "rag"),
                           ("retrieval", "rca"), ("rag", "rca"), ("rca", "recommend"),
                           ("recommend", "approval")):
        expect(route(page, source, target)).to_have_attribute("data-state", "taken")
    end = page.locator('svg.graph [data-implicit="code_fix"] .route.kind-implicit')
    expect(end).to_have_attribute("data-state", "idle")
    live = page.evaluate(PICTURE)
    assert replayed(page, server, "inc-1") == live

    decide(server, "inc-1", "approval")
    expect(page.locator('svg.graph [data-node="code_fix"]')).to_have_attribute(
        "data-state", "waiting")  # confirm: true asks again
    expect(route(page, "approval", "code_fix")).to_have_attribute("data-state", "taken")
    expect(route(page, "approval", "END")).to_have_attribute("data-state", "skipped")
    decide(server, "inc-1", "code_fix")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    expect(end).to_have_attribute("data-state", "taken")
    expect(page.locator('svg.graph [data-node="END"]')).to_have_attribute(
        "data-state", "reached")
    live = page.evaluate(PICTURE)
    assert [r for r in live["routes"] if not r.endswith(" taken")] == ["approval→END skipped"]
    assert replayed(page, server, "inc-1") == live


def test_a_join_settled_without_a_source_lights_the_arrow_that_arrived_only(
        server: Served, page: Any) -> None:
    with server.client() as c:
        r = c.post("/api/workflows/partial/runs", json={"input": {"n": 1}, "run_id": "part-1"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/part-1")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    expect(route(page, "side", "joined")).to_have_attribute("data-state", "taken")
    expect(route(page, "never", "joined")).to_have_attribute("data-state", "skipped")
    expect(route(page, "split", "never")).to_have_attribute("data-state", "skipped")
    expect(route(page, "joined", "END")).to_have_attribute("data-state", "taken")
    live = page.evaluate(PICTURE)
    assert replayed(page, server, "part-1") == live


def test_an_edge_log_format_2_implies_is_lit_live(server: Served, page: Any) -> None:
    """``last → END`` has no record of its own (log format 2: last's completion implies
    it): lit as the completion arrives on the open page, and the same on a reload."""
    with server.client() as c:
        r = c.post("/api/workflows/regate/runs", json={"input": {"n": 1}, "run_id": "re-2"})
        assert r.status_code == 201, r.text
    page.goto(f"{server.url}/runs/re-2")
    expect(page.locator('svg.graph [data-node="gate"]')).to_have_attribute("data-state",
                                                                          "waiting")
    expect(route(page, "last", "END")).to_have_attribute("data-state", "idle")
    decide(server, "re-2", "gate")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    expect(route(page, "gate", "last")).to_have_attribute("data-state", "taken")
    expect(route(page, "last", "END")).to_have_attribute("data-state", "taken")
    with server.client() as c:
        records = c.get("/api/runs/re-2/records").json()
    assert not [r for r in records if r["type"] == "edge.taken" and r.get("from") == "last"]
    assert [i["to"] for r in records for i in r.get("implies") or []
            if i.get("from") == "last"] == [["END"]]
    live = page.evaluate(PICTURE)
    assert replayed(page, server, "re-2") == live


def test_a_join_before_a_migration_is_lit_by_the_names_of_the_sources_that_arrived(
        server: Served, page: Any) -> None:
    """The join's record (edge 2 of v1: ``*`` → gate, arrived p and q) names another edge
    in v2: its arrows are lit by name, from the sources that arrived."""
    with server.client() as c:
        r = c.post("/api/workflows/joined/runs", json={"input": {"n": 1}, "run_id": "mj-1"})
        assert r.status_code == 201, r.text
        wait_status(c, "mj-1", "WAITING_APPROVAL")
        moved = c.post("/api/runs/mj-1/migrate", json={
            "definition": yaml.safe_load(JOINED_V2), "by": "ops"})
        assert moved.status_code == 200, moved.text
    page.goto(f"{server.url}/runs/mj-1")
    expect(page.locator("#migrated")).to_be_visible()
    expect(page.locator('svg.graph [data-node="gate"]')).to_have_attribute("data-state",
                                                                          "waiting")
    for source in ("p", "q"):
        expect(route(page, source, "gate")).to_have_attribute("data-state", "taken")
    expect(page.locator('svg.graph [data-edge="2"]')).to_have_attribute("data-state", "idle")
    decide(server, "mj-1", "gate")
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "closed")
    expect(route(page, "gate", "after")).to_have_attribute("data-state", "taken")
    expect(route(page, "after", "END")).to_have_attribute("data-state", "taken")
