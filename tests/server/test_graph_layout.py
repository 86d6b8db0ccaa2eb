"""The graph's drawing as the server lays it out (interlock/server/_layout.py): for every
example and the tricky shapes of issue 33, no drawn edge passes through a node's box, no
label overlaps a box, loops and re-entries are drawn upwards as such, and labels carry the
condition, the case and ``max N``. The same geometry in Chromium: test_dashboard_graph.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import interlock

pytest.importorskip("grandalf", reason="the graph's layout needs the server extra")

from interlock._definition._render import layout as cli_layout
from interlock.server._layout import layout
from interlock.server._routes_workflows import graph_of

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*/workflow*.yaml"))

Box = tuple[float, float, float, float]  # x, y, w, h


def _crosses(p: tuple[float, float], q: tuple[float, float], box: Box, inset: float = 1.0
             ) -> bool:
    """Whether the segment p-q meets the inside of ``box`` (shrunk by ``inset``): the
    Liang-Barsky clip of the segment against the rectangle."""
    x0, y0 = box[0] + inset, box[1] + inset
    x1, y1 = box[0] + box[2] - inset, box[1] + box[3] - inset
    dx, dy = q[0] - p[0], q[1] - p[1]
    lo, hi = 0.0, 1.0
    for d, start, low, high in ((dx, p[0], x0, x1), (dy, p[1], y0, y1)):
        if d == 0:
            if not low < start < high:
                return False
            continue
        t0, t1 = (low - start) / d, (high - start) / d
        lo, hi = max(lo, min(t0, t1)), min(hi, max(t0, t1))
        if lo >= hi:
            return False
    return True


def through(drawing: dict[str, Any]) -> list[str]:
    """Every (edge, node) where an edge's line passes through a node's box, and every label
    that overlaps a box or another label."""
    boxes = {n["name"]: (n["x"], n["y"], n["w"], n["h"]) for n in drawing["nodes"]}
    bad = []
    for e in drawing["edges"]:
        pts = [tuple(p) for p in e["points"]]
        for p, q in itertools.pairwise(pts):
            for name, box in boxes.items():
                if _crosses(p, q, box):  # type: ignore[arg-type]
                    bad.append(f"edge {e['edge']} {e['source']}→{e['target']} through {name}")
    labels = [(e["label_box"], e["label"]) for e in drawing["edges"] if e["label_box"]]
    for i, (lb, text) in enumerate(labels):
        rect = (lb["x"], lb["y"], lb["w"], lb["h"])
        for name, box in boxes.items():
            if _overlap(rect, box):
                bad.append(f"label {text!r} over {name}")
        for other, text2 in labels[i + 1:]:
            if _overlap(rect, (other["x"], other["y"], other["w"], other["h"])):
                bad.append(f"label {text!r} over label {text2!r}")
    return bad


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] \
        and b[1] < a[1] + a[3]


def draw(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    graph = graph_of(interlock.load(source).spec)  # type: ignore[arg-type]
    assert graph.layout is not None
    return graph.layout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_example_edge_passes_through_a_node(path: Path) -> None:
    drawing = draw(path)
    assert through(drawing) == []
    # every declared edge is drawn, to each of its targets
    spec = interlock.load(path).spec
    drawn = {e["edge"] for e in drawing["edges"]}
    assert drawn >= set(range(len(spec.edges)))


def cli_arrows(spec: interlock.WorkflowSpec) -> set[tuple[str, str]]:
    """The (source, target) pairs ``interlock graph`` draws, a join point's arcs read as
    an arrow from each of its sources to each of its targets."""
    lay = cli_layout(spec)
    names = {v.id: v.label for v in lay.vertices.values()}
    joins = {v.id for v in lay.vertices.values() if v.kind == "join"}
    into = {j: [names[a.source] for a in lay.arcs if a.target == j] for j in joins}
    return {(s, names[a.target]) for a in lay.arcs if a.target not in joins
            for s in (into[a.source] if a.source in joins else [names[a.source]])}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_dashboard_draws_the_arrows_interlock_graph_draws(path: Path) -> None:
    """Review 39: a node no edge leaves (incident's code_fix) had no arrow to END on the
    dashboard, while ``interlock graph`` draws one. The same arrows in both (the
    dashboard's ``on_modify`` re-entries aside: the CLI does not draw them)."""
    spec = interlock.load(path).spec
    drawing = draw(path)
    drawn = {(e["source"], e["target"]) for e in drawing["edges"] if e["kind"] != "reentry"}
    assert drawn == cli_arrows(spec)


def test_a_node_no_edge_leaves_has_an_implicit_arrow_to_end() -> None:
    drawing = draw(REPO / "examples" / "incident" / "workflow.yaml")
    end = [e for e in drawing["edges"] if e["source"] == "code_fix"]
    assert [(e["target"], e["kind"], e["edge"], e["label"]) for e in end] == \
        [("END", "implicit", None, "")]
    assert "no edge leaves code_fix" in end[0]["title"]
    assert end[0]["points"][0][1] < end[0]["points"][-1][1]  # downwards, into END's top
    # an error edge is no exit: a node that succeeds ends there too (map's merge and work)
    drawing = layout(*_graph(SHAPES["map"]))
    implicit = {e["source"] for e in drawing["edges"] if e["kind"] == "implicit"}
    assert implicit == {"merge"}
    nodes, edges = _graph([{"from": "START", "to": "a"},
                           {"from": "a", "on_error": True, "to": "b"}])
    implicit = {e["source"] for e in layout(nodes, edges)["edges"] if e["kind"] == "implicit"}
    assert implicit == {"a", "b"}


def test_audit_default_and_reentry_and_loop() -> None:
    """Issue 33's audit: the switch default ``risk → evidence`` is not routed through
    ``escalate`` (nor any node), the ``on_modify`` re-entry ``approval → risk`` is drawn
    upwards, the revise loop is a back edge labelled with its condition and ``max 2``."""
    drawing = draw(REPO / "examples" / "audit" / "workflow.yaml")
    edges = {(e["source"], e["target"], e["kind"]): e for e in drawing["edges"]}
    default = edges["risk", "evidence", "forward"]
    assert default["label"] == "risk.level: default"
    assert "default → evidence" in default["title"]
    assert edges["risk", "approval", "forward"]["label"] == "risk.level = HIGH"
    reentry = edges["approval", "risk", "reentry"]
    assert reentry["edge"] is None and reentry["label"] == "on modify"
    assert reentry["points"][0][1] > reentry["points"][-1][1]  # drawn upwards
    loop = edges["reviewer", "evidence", "back"]
    assert loop["label"] == 'review.verdict == "revise" · max 2'
    assert loop["points"][0][1] > loop["points"][-1][1]
    assert "at most 2 times" in loop["title"]
    assert edges["reviewer", "report", "forward"]["label"] == "otherwise"
    assert through(drawing) == []


def test_code_assistant_retry_loop_not_through_answer() -> None:
    drawing = draw(REPO / "examples" / "code_assistant" / "workflow.yaml")
    backs = [e for e in drawing["edges"] if e["kind"] == "back"]
    assert backs, drawing["edges"]
    assert through(drawing) == []


def _flow(edges: list[dict[str, Any]], nodes: dict[str, Any] | None = None) -> dict[str, Any]:
    names = {t for e in edges for k in ("from", "to", "choose") for t in
             ([e[k]] if isinstance(e.get(k), str) else e.get(k) or [])}
    names |= {t for e in edges for t in (e.get("cases") or {}).values()}
    names |= {e["default"] for e in edges if e.get("default")}
    names -= {"START", "END"}
    spec_nodes = {n: {"call": "tests.nodes:noop"} for n in sorted(names)}
    spec_nodes.update(nodes or {})
    return {"workflow": "shape", "nodes": spec_nodes, "edges": edges}


SHAPES = {
    # a default that skips a layer beside a node that runs only on the other branch
    "skip": [{"from": "START", "to": "a"},
             {"from": "a", "switch": "x", "cases": {"y": "b"}, "default": "d"},
             {"from": "b", "to": "c"}, {"from": "c", "to": "d"}, {"from": "d", "to": "END"}],
    # a retry loop around two nodes with an exit in between
    "retry": [{"from": "START", "to": "gen"}, {"from": "gen", "to": "check"},
              {"from": "check", "to": "answer", "when": "ok"},
              {"from": "check", "to": "note", "otherwise": True},
              {"from": "note", "to": "gen", "max": 3}, {"from": "answer", "to": "END"}],
    # a node that sends itself back, a fan-out, a join and a two-way cycle
    "self-and-join": [{"from": "START", "to": ["a", "b"]},
                      {"from": "a", "to": "a", "when": "again", "max": 2},
                      {"from": ["a", "b"], "to": "c"},
                      {"from": "c", "to": "b", "when": "more"},
                      {"from": "c", "to": "END", "otherwise": True}],
    # long edges over many layers, both ways
    "long": [{"from": "START", "to": "n1"}, {"from": "n1", "to": "n2"},
             {"from": "n2", "to": "n3"}, {"from": "n3", "to": "n4"},
             {"from": "n1", "to": "n4", "when": "short_cut"},
             {"from": "n4", "to": "n1", "when": "again", "max": 5},
             {"from": "n2", "to": "END", "when": "stop"}, {"from": "n4", "to": "END"}],
    # a map and an error edge
    "map": [{"from": "START", "to": "split"},
            {"from": "split", "map": "items", "as": "item", "to": "work", "collect": "out"},
            {"from": "work", "to": "merge"},
            {"from": "work", "on_error": True, "to": "fallback"},
            {"from": "fallback", "to": "merge"}],
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_tricky_shapes(name: str) -> None:
    drawing = layout(*_graph(SHAPES[name]))
    assert through(drawing) == []


def _graph(edges: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A shape as graph_of gives it, without loading a definition (no callables to
    import)."""
    flow = _flow(edges)
    nodes = [{"name": n, **spec} for n, spec in flow["nodes"].items()]
    norm = []
    for e in edges:
        e = dict(e)
        for k in ("from", "to", "choose"):
            if isinstance(e.get(k), str):
                e[k] = [e[k]]
        norm.append(e)
    return nodes, norm


def test_self_loop_is_drawn_beside_its_box() -> None:
    drawing = layout(*_graph(SHAPES["self-and-join"]))
    loop = next(e for e in drawing["edges"] if e["kind"] == "self")
    box = next(n for n in drawing["nodes"] if n["name"] == "a")
    assert loop["label"] == "again · max 2"
    assert all(x >= box["x"] + box["w"] for x, _ in loop["points"])


@pytest.mark.parametrize("edges", [
    [{"from": "START", "to": "step"}, {"from": "step", "to": "step", "when": "n < 3", "max": 5},
     {"from": "step", "to": "END", "otherwise": True}],
    SHAPES["self-and-join"]], ids=["one-node-loop", "self-and-join"])
def test_a_self_loops_label_has_a_box_inside_the_canvas(edges: list[dict[str, Any]]) -> None:
    """Review 42: the label of an edge from a node to itself had no box, and the canvas
    ended right of the loop (the dashboard clipped `n < 3 · max 5` to `n < 3 · ı`). Its box
    is right of its loop, inside the canvas, over no node and no other label."""
    drawing = layout(*_graph(edges))
    loop = next(e for e in drawing["edges"] if e["kind"] == "self")
    box = next(n for n in drawing["nodes"] if n["name"] == loop["source"])
    lb = loop["label_box"]
    assert lb is not None, loop
    assert lb["x"] >= max(x for x, _ in loop["points"])  # right of the loop
    assert lb["w"] >= len(loop["label"]) * 6.2  # room for the whole label
    assert lb["x"] + lb["w"] <= drawing["width"] and lb["y"] >= 0
    assert lb["y"] + lb["h"] <= drawing["height"]
    assert box["y"] <= lb["y"] and lb["y"] + lb["h"] <= box["y"] + box["h"]  # beside it
    assert through(drawing) == []


def test_reentry_to_a_fixer_reached_only_that_way() -> None:
    nodes, edges = _graph([{"from": "START", "to": "work"}, {"from": "work", "to": "gate"},
                           {"from": "fixer", "to": "gate"}, {"from": "gate", "to": "END"}])
    for n in nodes:
        if n["name"] == "gate":
            n.pop("call")
            n["approval"] = {"on_modify": ["fixer", "work"]}
    drawing = layout(nodes, edges)
    kinds = {(e["source"], e["target"]): e["kind"] for e in drawing["edges"]}
    assert kinds["gate", "fixer"] == kinds["gate", "work"] == "reentry"
    assert through(drawing) == []


def test_the_check_sees_a_line_through_a_box() -> None:
    """The check itself: a route straight through a box is found (as the old hand-written
    routing drew audit's default through escalate), one that runs beside it is not."""
    nodes = [{"name": "a", "x": 0, "y": 0, "w": 50, "h": 30},
             {"name": "b", "x": 0, "y": 100, "w": 50, "h": 30},
             {"name": "c", "x": 0, "y": 200, "w": 50, "h": 30}]
    edge = {"edge": 0, "source": "a", "target": "c", "kind": "forward", "label": "",
            "title": "", "label_box": None}
    drawing = {"nodes": nodes, "edges": [{**edge, "points": [[25, 30], [25, 200]]}]}
    assert through(drawing) == ["edge 0 a→c through b"]
    drawing["edges"] = [{**edge, "points": [[25, 30], [60, 60], [60, 170], [25, 200]]}]
    assert through(drawing) == []
