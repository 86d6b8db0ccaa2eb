"""Drawing a workflow: a `WorkflowSpec` as Mermaid or Graphviz DOT text.

Both formats share one walk over the definition (`layout`), so they always
agree on what is drawn:

- every declared node, plus START and END (and, for a file that names a node
  it never declares, that name too, so the mistake is visible);
- one small *join point* per join edge: ``from: [a, b]`` is drawn as
  ``a -> (join) <- b`` and ``(join) -> target``, so a reader sees the barrier;
- one arc per (source, target) of every edge, labelled with what guards it:
  the ``when`` expression, ``otherwise``, a switch's ``expr == value`` (or
  ``expr in [...]``, ``default``), the router's ``module:function``,
  ``choose``, a map's ``map EXPR as ITEM, collect FIELD``, and ``max N``. Guarded
  arcs are dashed, plain ones solid; error edges (``on_error``) are dashed and red,
  labelled ``on error`` (and the class names they catch);
- a node without outgoing edges gets an arc to END: that is what it means
  ("a node with no outgoing edges is terminal").

Approval nodes are hexagons, agent nodes rounded, joins small circles.
The functions are pure: text in the format, nothing printed, nothing imported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._edge import EdgeSpec
from ._model import END, START, WorkflowSpec
from ._values import NAME_RE

VertexKind = Literal["start", "end", "call", "approval", "agent", "workflow", "join", "unknown"]


@dataclass(frozen=True, slots=True)
class Vertex:
    id: str  # safe in both formats: [A-Za-z0-9_]
    label: str
    kind: VertexKind


@dataclass(frozen=True, slots=True)
class Arc:
    source: str  # vertex ids
    target: str
    label: str = ""  # "" for an unconditional arc
    guarded: bool = False  # drawn dashed: taken only under a condition
    error: bool = False  # an error edge (on_error): drawn dashed and red


@dataclass(slots=True)
class Layout:
    """What to draw, in a stable order (declaration order of the file)."""

    title: str
    vertices: dict[str, Vertex] = field(default_factory=dict)  # name (or join key) -> vertex
    arcs: list[Arc] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)  # sub-workflow nodes, drawn inside

    def vertex(self, name: str) -> str:
        """The id of node ``name``, adding an undeclared name as an ``unknown`` vertex."""
        v = self.vertices.get(name)
        if v is None:
            vid = f"n_{name}" if NAME_RE.match(name) else f"x{len(self.vertices)}"
            v = self.vertices[name] = Vertex(vid, name, "unknown")
        return v.id


@dataclass(slots=True)
class Cluster:
    """A sub-workflow node drawn as a box holding its child's graph: the arcs into the
    node reach the child's START, the arcs out of it leave from the child's END."""

    id: str  # the node's vertex id, which the child's ids are prefixed with
    label: str
    inside: Layout


def layout(spec: WorkflowSpec, prefix: str = "") -> Layout:
    """The vertices and arcs of ``spec`` (see the module docstring); ``prefix``: of every
    id, for a child's graph drawn inside its parent's."""
    out = Layout(spec.workflow)
    out.vertices[START] = Vertex(f"{prefix}START", START, "start")
    for name, node in spec.nodes.items():
        out.vertices[name] = Vertex(f"{prefix}n_{name}", name, node.kind)
    for index, edge in enumerate(spec.edges):
        _add_edge(out, index, edge, prefix)
    _add_terminals(out, spec, prefix)
    out.vertices[END] = Vertex(f"{prefix}END", END, "end")
    for name, node in spec.nodes.items():
        if node.workflow is not None:
            _add_cluster(out, name, node.workflow.definition, node.workflow.file)
    return out


def _add_cluster(out: Layout, name: str, definition: dict[str, Any], file: str | None) -> None:
    from ._spec import parse

    vid = out.vertices.pop(name).id
    try:
        child = parse(definition)
    except Exception:  # a stored definition that no longer parses: the node alone
        out.vertices[name] = Vertex(vid, name, "call")
        return
    inside = layout(child, prefix=f"{vid}__")
    enter, leave = inside.vertices[START].id, inside.vertices[END].id
    out.arcs = [replace(a, source=leave if a.source == vid else a.source,
                        target=enter if a.target == vid else a.target) for a in out.arcs]
    label = f"{name}: workflow {child.workflow}" + (f" ({file})" if file else "")
    out.clusters.append(Cluster(vid, label, inside))


def _add_edge(out: Layout, index: int, edge: EdgeSpec, prefix: str = "") -> None:
    if edge.is_join:
        join_id = f"{prefix}j{index}"
        out.vertices[f"#join{index}"] = Vertex(join_id, "join", "join")
        for source in edge.source:
            out.arcs.append(Arc(out.vertex(source), join_id))
        source_id = join_id
    else:
        source_id = out.vertex(edge.source[0])
    for target, label in _labels(edge):
        # a map edge is always taken (once, with all its items): drawn solid
        guarded = (bool(label) and edge.kind != "map") or edge.max is not None
        label = ", ".join(p for p in (label, _max(edge)) if p)
        out.arcs.append(Arc(source_id, _target_id(out, target, prefix), label, guarded,
                            edge.catches is not None))


def _target_id(out: Layout, name: str, prefix: str = "") -> str:
    """A target's vertex id; END is this graph's own END (a child's, inside its parent's
    cluster, not the parent's)."""
    return f"{prefix}END" if name == END else out.vertex(name)


def _max(edge: EdgeSpec) -> str:
    return f"max {edge.max}" if edge.max is not None else ""


def _labels(edge: EdgeSpec) -> list[tuple[str, str]]:
    """(target, condition label) for each target of ``edge``, in declaration order."""
    match edge.kind:
        case "switch":
            return _switch_labels(edge)
        case "router":
            return [(t, f"router {edge.router}") for t in edge.targets]
        case "choose":
            return [(t, "choose") for t in edge.targets]
        case "map":  # once per item: what it maps over, the item's name, where they go
            label = f"map {edge.map} as {edge.item_name}"
            if edge.collect is not None:
                label += f", collect {edge.collect}"
            return [(edge.targets[0], label)]
        case _ if edge.catches is not None:
            names = ": " + ", ".join(edge.catches) if edge.catches else ""
            return [(t, f"on error{names}") for t in edge.targets]
        case _:
            label = edge.when or ("otherwise" if edge.otherwise else "")
            return [(t, label) for t in edge.targets]


def _switch_labels(edge: EdgeSpec) -> list[tuple[str, str]]:
    values: dict[str, list[str]] = {}
    for value, target in (edge.cases or {}).items():
        values.setdefault(target, []).append(_case_text(value))
    if edge.default is not None:
        values.setdefault(edge.default, [])
    out = []
    for target, cases in values.items():
        parts = []
        if len(cases) == 1:
            parts.append(f"{edge.switch} == {cases[0]}")
        elif cases:
            parts.append(f"{edge.switch} in [{', '.join(cases)}]")
        if target == edge.default:
            parts.append("default")
        out.append((target, " or ".join(parts)))
    return out


_LITERAL_RE = re.compile(r"^(true|false|null|-?\d+(\.\d+)?)$")


def _case_text(value: str) -> str:
    """A case key as CEL would write it: numbers and booleans bare, strings quoted."""
    return value if _LITERAL_RE.match(value) else json.dumps(value, ensure_ascii=False)


def _add_terminals(out: Layout, spec: WorkflowSpec, prefix: str = "") -> None:
    # (an error edge is no exit: a node that succeeds without another edge ends the run)
    with_exits = {s for e in spec.edges if e.catches is None for s in e.source}
    for name in spec.nodes:
        if name not in with_exits:
            out.arcs.append(Arc(out.vertices[name].id, f"{prefix}END"))


# -- Mermaid ---------------------------------------------------------------------------

# Mermaid reads ``#name;`` / ``#123;`` as entities inside quoted labels; everything that
# could end a label, open markup or start an entity is written as one.
_MERMAID_ESCAPES = str.maketrans({
    "#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;", "|": "#124;",
    "`": "#96;", "\n": " ", "\r": " ",
})

_MERMAID_SHAPES: dict[VertexKind, tuple[str, str]] = {
    "start": ("([", "])"), "end": ("([", "])"), "call": ("[", "]"),
    "approval": ("{{", "}}"), "agent": ("(", ")"), "join": ("((", "))"),
    "unknown": ("[", "]"), "workflow": ("[[", "]]"),
}

_MERMAID_CLASSES = {
    "terminal": "fill:#eeeeee,stroke:#888888",
    "approval": "fill:#fff4d6,stroke:#b7791f,stroke-width:2px",
    "join": "fill:#333333,stroke:#333333,color:#ffffff",
    "unknown": "fill:#ffe0e0,stroke:#c53030,stroke-dasharray:4 3",
}

_MERMAID_ERROR_LINK = "stroke:#c53030,color:#c53030"

_CLASS_OF: dict[VertexKind, str] = {
    "start": "terminal", "end": "terminal", "approval": "approval", "join": "join",
    "unknown": "unknown",
}


def mermaid_text(text: str) -> str:
    """``text`` escaped for a double-quoted Mermaid label."""
    return text.translate(_MERMAID_ESCAPES)


def to_mermaid(spec: WorkflowSpec) -> str:
    """A Mermaid ``flowchart`` of ``spec``."""
    lay = layout(spec)
    lines = ["---", f"title: {json.dumps(lay.title, ensure_ascii=False)}", "---",
             "flowchart TD"]
    _mermaid_body(lay, lines, "    ")
    lines.extend(_mermaid_classes(lay))
    errors = [str(i) for i, a in enumerate(_mermaid_links(lay)) if a.error]
    if errors:  # error edges in red (a link's style is set by its index)
        lines.append(f"    linkStyle {','.join(errors)} {_MERMAID_ERROR_LINK}")
    return "\n".join(lines) + "\n"


def _mermaid_body(lay: Layout, lines: list[str], indent: str) -> None:
    for v in lay.vertices.values():
        left, right = _MERMAID_SHAPES[v.kind]
        lines.append(f'{indent}{v.id}{left}"{mermaid_text(v.label)}"{right}')
    for c in lay.clusters:  # a sub-workflow: its child's graph in a subgraph
        lines.append(f'{indent}subgraph {c.id}["{mermaid_text(c.label)}"]')
        _mermaid_body(c.inside, lines, indent + "    ")
        lines.append(f"{indent}end")
    for a in lay.arcs:
        arrow = "-.->" if a.guarded else "-->"
        label = f'|"{mermaid_text(a.label)}"|' if a.label else ""
        lines.append(f"{indent}{a.source} {arrow}{label} {a.target}")


def _mermaid_links(lay: Layout) -> list[Arc]:
    """The arcs in the order `_mermaid_body` writes them (a link's style is by index)."""
    return [*(a for c in lay.clusters for a in _mermaid_links(c.inside)), *lay.arcs]


def _all_vertices(lay: Layout) -> list[Vertex]:
    return [*lay.vertices.values(), *(v for c in lay.clusters for v in _all_vertices(c.inside))]


def _mermaid_classes(lay: Layout) -> list[str]:
    members: dict[str, list[str]] = {}
    for v in _all_vertices(lay):
        cls = _CLASS_OF.get(v.kind)
        if cls is not None:
            members.setdefault(cls, []).append(v.id)
    lines = []
    for cls, ids in members.items():
        lines.append(f"    classDef {cls} {_MERMAID_CLASSES[cls]}")
        lines.append(f"    class {','.join(ids)} {cls}")
    return lines


# -- Graphviz DOT ----------------------------------------------------------------------

_DOT_STYLE: dict[VertexKind, str] = {
    "start": 'shape=oval, style=filled, fillcolor="#eeeeee"',
    "end": 'shape=oval, style=filled, fillcolor="#eeeeee"',
    "call": 'shape=box, style=rounded',
    "approval": 'shape=hexagon, style="filled,bold", fillcolor="#fff4d6", color="#b7791f"',
    "agent": 'shape=box, style="rounded,filled", fillcolor="#e6f0ff"',
    "workflow": 'shape=box3d',
    "join": 'shape=circle, style=filled, fillcolor="#333333", fontcolor="#ffffff", '
            "fontsize=9, width=0.4, fixedsize=true",
    "unknown": 'shape=box, style="dashed,filled", fillcolor="#ffe0e0", color="#c53030"',
}


def dot_text(text: str) -> str:
    """``text`` as a DOT double-quoted string, quotes included."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\r", "").replace("\n", "\\n") + '"'


def to_dot(spec: WorkflowSpec) -> str:
    """A Graphviz ``digraph`` of ``spec``."""
    lay = layout(spec)
    lines = [f"digraph {dot_text(lay.title)} {{", "    rankdir=TB;",
             '    node [fontname="Helvetica"];',
             '    edge [fontname="Helvetica", fontsize=10];']
    _dot_body(lay, lines, "    ")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_body(lay: Layout, lines: list[str], indent: str) -> None:
    for v in lay.vertices.values():
        lines.append(f"{indent}{v.id} [label={dot_text(v.label)}, {_DOT_STYLE[v.kind]}];")
    for c in lay.clusters:  # a sub-workflow: its child's graph in a cluster
        lines.append(f"{indent}subgraph cluster_{c.id.removeprefix('n_')} {{")
        lines.append(f'{indent}    label={dot_text(c.label)}; style="rounded,dashed";')
        _dot_body(c.inside, lines, indent + "    ")
        lines.append(f"{indent}}}")
    for a in lay.arcs:
        attrs = []
        if a.label:
            attrs.append(f"label={dot_text(a.label)}")
        if a.guarded:
            attrs.append("style=dashed")
        if a.error:
            attrs.append('color="#c53030", fontcolor="#c53030"')
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        lines.append(f"{indent}{a.source} -> {a.target}{suffix};")
