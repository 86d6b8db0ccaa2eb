"""A workflow graph's drawing, computed by the server: node boxes and edge routes from a
layered (Sugiyama) layout by grandalf, so the dashboard draws what is laid out and routes
nothing itself.

Correct by construction: every edge runs from its source's bottom to its target's top
through the layers between them, where grandalf's layout holds a place for it (a
*dummy* vertex, kept apart from the nodes of that layer like any vertex). Inside a layer's
band an edge is vertical (at its own vertex's x); it turns only in the gaps between layers,
where there are no boxes. A labelled edge passes through a vertex of its label's size (so
labels never overlap a node either), a loop's closing edge (the one the engine's own
depth-first search from START sets aside, interlock/_definition/_graph.py) and an
approval's ``on_modify`` re-entry are laid out reversed and drawn upwards, an edge from a
node to itself is drawn in a place reserved beside its box (its label's box right of the
loop, as much room kept left of the box so that the node's other edges still meet it), and
a node no edge leaves gets an arrow to END (``kind: implicit``), as ``interlock graph``
draws it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grandalf is untyped: its names document what a value is
    from grandalf.graphs import Edge, Graph, Vertex

CHAR = 7.2  # px: the width of a character of the dashboard's 12 px node font
LABEL_CHAR = 6.2  # px: of the 11 px label font
BOX_H = 34.0
LABEL_H = 16.0
LOOP_W = 30.0  # px reserved right of a box for an edge from the node to itself
LABEL_MAX = 28  # characters of a label (the whole condition is in its title)
MARGIN = 24.0


@dataclass
class _Box:
    w: float
    h: float
    xy: tuple[float, float] = (0.0, 0.0)


@dataclass(eq=False)
class _Pair:
    """One arrow: an edge's (source, target), or (edge None) a gate's re-entry or a node's
    implicit arrow to END."""

    source: str
    target: str
    edge: int | None
    kind: str  # "forward", "back", "reentry", "implicit"
    label: str
    title: str
    parts: list[Edge] = field(default_factory=list)  # grandalf edges, source to target


def shorten(text: str, limit: int = LABEL_MAX) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def targets(edge: dict[str, Any]) -> list[str]:
    """An edge's targets in every form (as the dashboard's graph.js lists them)."""
    out = list(edge.get("to") or [])
    out += list((edge.get("cases") or {}).values())
    if edge.get("default"):
        out.append(edge["default"])
    out += list(edge.get("choose") or [])
    return list(dict.fromkeys(out))


def condition(edge: dict[str, Any]) -> str:
    """An edge's whole condition, in words (a label's hover text)."""
    if edge.get("when"):
        text = f"when {edge['when']}"
    elif edge.get("otherwise"):
        text = "otherwise (no other edge of its source was taken)"
    elif edge.get("switch"):
        cases = ", ".join(f"{k} → {v}" for k, v in (edge.get("cases") or {}).items())
        text = f"switch {edge['switch']}: {cases}" + (
            f"; default → {edge['default']}" if edge.get("default") else "")
    elif edge.get("router"):
        text = f"router {edge['router']}"
    elif edge.get("choose"):
        text = f"the node chooses one of {', '.join(edge['choose'])}"
    elif edge.get("map"):
        text = f"map {edge['map']}" + (f" as {edge['as']}" if edge.get("as") else "")
    elif edge.get("on_error"):
        caught = edge["on_error"]
        text = "on error: " + ("any error" if caught is True else ", ".join(caught))
    else:
        text = "always"
    if edge.get("max"):
        text += f" (taken at most {edge['max']} times per run)"
    return text


def label(edge: dict[str, Any], target: str) -> str:
    """The short text on an edge's arrow to ``target``: the condition, the case, ``max N``."""
    if edge.get("when"):
        text = shorten(edge["when"])
    elif edge.get("otherwise"):
        text = "otherwise"
    elif edge.get("switch"):
        cases = [k for k, v in (edge.get("cases") or {}).items() if v == target]
        if edge.get("default") == target:
            cases.append("default")
        text = shorten(f"{edge['switch']} = {' | '.join(cases)}" if cases != ["default"]
                       else f"{edge['switch']}: default")
    elif edge.get("router"):
        text = shorten(f"router {edge['router'].rpartition(':')[2]}")
    elif edge.get("choose"):
        text = "chosen"
    elif edge.get("map"):
        text = shorten(f"map {edge['map']}")
    elif edge.get("on_error"):
        caught = edge["on_error"]
        text = shorten("on error" if caught is True else f"on {', '.join(caught)}")
    else:
        text = ""
    if edge.get("max"):
        text = f"{text} · max {edge['max']}" if text else f"max {edge['max']}"
    return text


def _pairs(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> list[_Pair]:
    out: list[_Pair] = []
    for index, edge in enumerate(edges):
        title = f"edge {index}: {', '.join(edge['from'])} → {', '.join(targets(edge))} — " \
                f"{condition(edge)}"
        for source in edge["from"]:
            for target in targets(edge):
                out.append(_Pair(source, target, index, "forward", label(edge, target), title))
    # a node no edge leaves (its error edges aside) ends its path at END when it completes:
    # drawn as `interlock graph` draws it (interlock/_definition/_render.py)
    exits = {s for edge in edges if not edge.get("on_error") for s in edge["from"]}
    for node in nodes:
        if node["name"] not in exits:
            out.append(_Pair(node["name"], "END", None, "implicit", "",
                             f"{node['name']} → END: no edge leaves {node['name']}, so its "
                             "path ends when it completes"))
    for node in nodes:
        for target in (node.get("approval") or {}).get("on_modify") or []:
            out.append(_Pair(node["name"], target, None, "reentry", "on modify",
                             f"{node['name']} → {target}: a 'modify' decision patches the "
                             f"state and re-enters the graph at {target}"))
    return out


def _back(names: list[str], pairs: list[_Pair]) -> None:
    """Mark the arrows that close a cycle: depth first from START (then from any node not
    reached), in declaration order -- the edges first, the re-entries after them."""
    adj: dict[str, list[_Pair]] = {n: [] for n in names}
    for p in pairs:
        adj[p.source].append(p)
    state: dict[str, int] = {}
    for root in names:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[str, Iterator[_Pair]]] = [(root, iter(adj[root]))]
        while stack:
            node, it = stack[-1]
            q = next(it, None)
            if q is None:
                state[node] = 2
                stack.pop()
                continue
            seen = state.get(q.target)
            if seen == 1 and q.source != q.target:
                q.kind = "reentry-back" if q.kind == "reentry" else "back"
            elif seen is None:
                state[q.target] = 1
                stack.append((q.target, iter(adj[q.target])))


def _text_w(text: str, char: float) -> float:
    return len(text) * char


def layout(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, Any]:
    """The drawing of a graph (the API's ``layout``): ``nodes`` [{name, x, y, w, h}] (the
    box's top left), ``edges`` [{edge, source, target, kind, points, label, title,
    label_box}] (``edge`` None for a re-entry and an implicit arrow to END; ``points`` from
    the source's box to the target's, the last one on the target), ``width``, ``height``."""
    key = json.dumps([nodes, edges], sort_keys=True)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        hit = _layout(nodes, edges)  # (on the server's threads: see graph_off_loop)
        with _LOCK:
            _CACHE[key] = hit
            while len(_CACHE) > CACHED:
                del _CACHE[next(iter(_CACHE))]
    return hit


CACHED = 64  # drawings kept (the graphs of the registered workflows and of recent runs)
_CACHE: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


def _layout(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = _pairs(nodes, edges)
    names = ["START", *(n["name"] for n in nodes)]
    if any(p.target == "END" for p in pairs):
        names.append("END")
    known = set(names)
    pairs = [p for p in pairs if p.source in known and p.target in known]
    _back(names, pairs)
    looped = _looped(pairs)
    graph, vertex, labels = _graph(names, pairs, looped)
    boxes, routes, height = _place(graph)

    out_nodes = []
    for n in names:
        box = boxes[vertex[n]]
        side = looped.get(n, 0.0)  # its loop's label's room, each side of the box
        w = round(box.w - (LOOP_W + 2 * side if n in looped else 0.0), 1)
        out_nodes.append({"name": n, "x": round(box.xy[0] - box.w / 2 + side + MARGIN, 1),
                          "y": round(box.xy[1] - box.h / 2 + MARGIN, 1), "w": w, "h": box.h})
    place = {n["name"]: n for n in out_nodes}
    out_edges = [_drawn(p, place, boxes, routes, labels) for p in pairs]
    width = max((n["x"] + n["w"] + LOOP_W for n in out_nodes), default=0) + MARGIN
    for e in out_edges:  # a self-loop's label is right of its loop
        if isinstance(lb := e["label_box"], dict):
            width = max(width, lb["x"] + lb["w"] + MARGIN)
    return {"nodes": out_nodes, "edges": out_edges, "width": round(width, 1),
            "height": round(height + 2 * MARGIN, 1)}


def _label_w(text: str) -> float:
    return _text_w(text, LABEL_CHAR) + 12


def _looped(pairs: list[_Pair]) -> dict[str, float]:
    """Each node with an edge to itself: the room its loop's labels take (0 if none)."""
    out: dict[str, float] = {}
    for p in pairs:
        if p.source == p.target:
            room = _label_w(p.label) + 2 if p.label else 0.0
            out[p.source] = max(out.get(p.source, 0.0), room)
    return out


def _graph(names: list[str], pairs: list[_Pair], looped: dict[str, float]
           ) -> tuple[Graph, dict[str, Vertex], dict[int, Vertex]]:
    """grandalf's graph: a vertex per node (wide enough for its name, and its self-loop),
    a vertex per label (so a label is laid out as a box of its own), an edge per hop."""
    from grandalf.graphs import Edge, Graph, Vertex

    vertex: dict[str, Vertex] = {}
    for n in names:
        w = max(70.0, _text_w(n, CHAR) + 26)
        if n in looped:  # the loop right of the box, its label's room on both sides
            w += LOOP_W + 2 * looped[n]
        vertex[n] = Vertex(n)
        vertex[n].view = _Box(w, BOX_H)
    labels: dict[int, Vertex] = {}  # id(pair) -> its label's vertex
    gedges: list[Edge] = []
    for p in pairs:
        if p.source == p.target:
            continue
        chain = [vertex[p.source], vertex[p.target]]
        if p.label:
            mid = labels[id(p)] = Vertex(("label", id(p)))
            mid.view = _Box(_label_w(p.label), LABEL_H)
            chain.insert(1, mid)
        for x, y in itertools.pairwise(chain):
            # laid out from the upper to the lower end: a loop's closing arrow reversed
            e = Edge(y, x) if p.kind in ("back", "reentry-back") else Edge(x, y)
            p.parts.append(e)
            gedges.append(e)
    graph = Graph(list(vertex.values()) + list(labels.values()), gedges, directed=True)
    return graph, vertex, labels


def _drawn(p: _Pair, place: dict[str, dict[str, Any]], boxes: dict[Vertex, _Box],
           routes: dict[int, list[Point]], labels: dict[int, Vertex]) -> dict[str, object]:
    """One arrow's route (and its label's box) in the page's coordinates."""
    if p.source == p.target:  # beside the box, in the room kept right of it
        n = place[p.source]
        x, y, h = n["x"] + n["w"], n["y"], n["h"]
        pts = [(x, y + 8), (x + LOOP_W - 8, y + 8), (x + LOOP_W - 8, y + h - 8),
               (x, y + h - 8)]
        label_box = None
        if p.label:  # right of the loop, level with the box's middle
            label_box = {"x": round(x + LOOP_W + 2, 1), "y": round(y + (h - LABEL_H) / 2, 1),
                         "w": _label_w(p.label), "h": LABEL_H}
        return _edge(p, pts, label_box)
    pts = []
    up = p.kind in ("back", "reentry-back")
    for e in p.parts:  # each laid out downwards: an upward arrow's reversed
        route = [(x + MARGIN, y + MARGIN) for x, y in routes[id(e)]]
        pts += route[::-1] if up else route
    label_box = None
    if id(p) in labels:
        box = boxes[labels[id(p)]]
        label_box = {"x": round(box.xy[0] - box.w / 2 + MARGIN, 1),
                     "y": round(box.xy[1] - box.h / 2 + MARGIN, 1), "w": box.w,
                     "h": box.h}
    return _edge(p, pts, label_box)


Point = tuple[float, float]


def _place(graph: Graph) -> tuple[dict[Vertex, _Box], dict[int, list[Point]], float]:
    """Each vertex's box (centre) and each grandalf edge's route, downwards; the
    connected parts of the graph side by side."""
    from grandalf.layouts import SugiyamaLayout

    boxes: dict[Vertex, _Box] = {}
    routes: dict[int, list[Point]] = {}
    offset = 0.0
    height = 0.0
    for component in graph.C:
        sug = SugiyamaLayout(component)
        sug.xspace, sug.yspace = 28, 30
        sug.dw, sug.dh = 12, 10  # a dummy vertex: an edge's place in a layer it passes
        roots = [v for v in component.sV if v.data == "START"]
        sug.init_all(roots=roots or None, inverted_edges=[])  # acyclic as built
        sug.draw(3)
        bands: list[tuple[float, float]] = []  # each layer's top and bottom
        for layer in sug.layers:
            half = max(v.view.h / 2 for v in layer)
            y = layer[0].view.xy[1]
            bands.append((y - half, y + half))
        every = [v for layer in sug.layers for v in layer]
        left = min(v.view.xy[0] - v.view.w / 2 for v in every)
        right = max(v.view.xy[0] + v.view.w / 2 for v in every)
        shift = offset - left
        for v in component.sV:
            boxes[v] = _Box(v.view.w, v.view.h, (v.view.xy[0] + shift, v.view.xy[1]))
        for e in component.sE:
            low, high = e.v
            r0, r1 = sug.grx[low].rank, sug.grx[high].rank
            ctrl = sug.ctrls.get(e, {})
            # down out of the source's band, straight through each layer between at the
            # edge's own place in it, into the target's band: turns only between bands
            ax, ay = boxes[low].xy
            pts = [(ax, ay + boxes[low].h / 2), (ax, bands[r0][1])]
            for r in range(r0 + 1, r1):
                dx = ctrl[r].view.xy[0] + shift
                pts += [(dx, bands[r][0]), (dx, bands[r][1])]
            bx, by = boxes[high].xy
            pts += [(bx, bands[r1][0]), (bx, by - boxes[high].h / 2)]
            routes[id(e)] = pts
        offset += right - left + 60
        height = max(height, bands[-1][1])
    return boxes, routes, height


def _edge(p: _Pair, pts: list[Point],
          label_box: dict[str, float] | None) -> dict[str, object]:
    clean: list[list[float]] = []
    for x, y in pts:
        point = [round(x, 1), round(y, 1)]
        if not clean or clean[-1] != point:
            clean.append(point)
    kind = "reentry" if p.kind.startswith("reentry") else "self" if p.source == p.target \
        else p.kind
    return {"edge": p.edge, "source": p.source, "target": p.target, "kind": kind,
            "points": clean, "label": p.label, "title": p.title, "label_box": label_box}
