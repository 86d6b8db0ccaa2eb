// A workflow's graph as SVG, drawn from the layout the server computed
// (interlock/server/_layout.py: a layered layout by grandalf): node boxes and edge routes
// are drawn where the API puts them, so an edge never crosses a node's box. A loop's
// closing edge and an approval's on_modify re-entry come drawn upwards (dashed), a node no
// edge leaves has its arrow to END, each label carries the condition, the case and `max N`
// (the whole condition on hover).

const SVG = "http://www.w3.org/2000/svg";
const CORNER = 8;
export function el(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const child of children) node.append(child);
  return node;
}

/** The targets of an edge in every form (to, a switch's cases and default, choose). */
export function targets(edge) {
  const out = [...(edge.to || [])];
  for (const t of Object.values(edge.cases || {})) out.push(t);
  if (edge.default) out.push(edge.default);
  for (const t of edge.choose || []) out.push(t);
  return [...new Set(out)];
}

/** A short word for how an edge decides (its full condition is in its title). */
export function edgeLabel(edge) {
  if (edge.when) return "when";
  if (edge.otherwise) return "otherwise";
  if (edge.switch) return "switch";
  if (edge.router) return "router";
  if (edge.choose) return "choose";
  if (edge.map) return "map";
  if (edge.on_error) return "on error";
  return "";
}

export function edgeCondition(edge) {
  if (edge.when) return `when: ${edge.when}`;
  if (edge.otherwise) return "otherwise (no other edge of its source was taken)";
  if (edge.switch) return `switch: ${edge.switch} cases: ${JSON.stringify(edge.cases || {})}` +
    (edge.default ? ` default: ${edge.default}` : "");
  if (edge.router) return `router: ${edge.router}`;
  if (edge.choose) return `choose: ${edge.choose.join(", ")}`;
  if (edge.map) return `map: ${edge.map}` + (edge.as ? ` as ${edge.as}` : "");
  if (edge.on_error) return `on_error: ${edge.on_error === true ? "any error" : edge.on_error.join(", ")}`;
  return "always";
}

/** A polyline through ``points`` with its corners rounded (the curve stays near each
 * corner, inside the channel the layout kept free). */
function pathOf(points) {
  let d = `M ${points[0][0]} ${points[0][1]}`;
  for (let i = 1; i < points.length; i++) {
    const [x, y] = points[i];
    if (i === points.length - 1) { d += ` L ${x} ${y}`; break; }
    const [px, py] = points[i - 1];
    const [nx, ny] = points[i + 1];
    const l1 = Math.hypot(x - px, y - py);
    const l2 = Math.hypot(nx - x, ny - y);
    const r = Math.min(CORNER, l1 / 2, l2 / 2);
    if (r < 0.5) { d += ` L ${x} ${y}`; continue; }
    const ax = x - ((x - px) / l1) * r;
    const ay = y - ((y - py) / l1) * r;
    const bx = x + ((nx - x) / l2) * r;
    const by = y + ((ny - y) / l2) * r;
    d += ` L ${ax.toFixed(1)} ${ay.toFixed(1)} Q ${x} ${y} ${bx.toFixed(1)} ${by.toFixed(1)}`;
  }
  return d;
}

/**
 * The graph as an <svg>: each node a <g data-node=NAME data-state=...>; each declared
 * edge a <g data-edge=INDEX data-state=...> holding one <g class="route" data-source
 * data-target data-state> per arrow (a switch's cases, a fan-out's targets); each
 * re-entry a <g class="edge reentry" data-reentry="GATE→NODE">; each node no edge leaves
 * a <g class="edge implicit" data-implicit=NODE> (its arrow to END). ``onSelect({node} |
 * {edge})`` on a click.
 */
export function renderGraph(graph, onSelect = () => {}) {
  const lay = graph.layout;
  const kinds = new Map(graph.nodes.map((n) => [n.name, n.approval ? "gate" : n.confirm ? "confirm" : n.agent ? "agent" : n.workflow ? "subflow" : "call"]));
  const svg = el("svg", { class: "graph", viewBox: `0 0 ${lay.width} ${lay.height}`, width: lay.width, height: lay.height, role: "img" });
  svg.append(el("title", {}, `graph of ${graph.nodes.length} nodes`));
  const defs = el("defs");
  for (const [id, cls] of [["arrow", "arrowhead"], ["arrow-taken", "arrowhead taken"], ["arrow-reentry", "arrowhead reentry"]]) {
    const marker = el("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerUnits: "userSpaceOnUse", markerWidth: 9, markerHeight: 9, orient: "auto-start-reverse" });
    marker.append(el("path", { d: "M 0 0 L 10 5 L 0 10 z", class: cls }));
    defs.append(marker);
  }
  svg.append(defs);
  const edgesLayer = el("g", { class: "edges" });
  const labelsLayer = el("g", { class: "edge-labels" });
  const groups = new Map();
  for (const route of lay.edges) {
    let group;
    if (route.kind === "implicit") {
      // a node no edge leaves: its path ends at END (taken when the node completes)
      group = el("g", { class: "edge implicit", "data-implicit": route.source, "data-state": "idle" });
      group.append(el("title", {}, route.title));
      edgesLayer.append(group);
    } else if (route.edge === null) {
      group = el("g", { class: "edge reentry", "data-reentry": `${route.source}→${route.target}`, "data-state": "idle" });
      group.append(el("title", {}, route.title));
      edgesLayer.append(group);
    } else {
      group = groups.get(route.edge);
      if (!group) {
        group = el("g", { class: "edge", "data-edge": route.edge, "data-state": "idle", tabindex: 0 });
        group.append(el("title", {}, route.title));
        group.addEventListener("click", () => onSelect({ edge: route.edge }));
        groups.set(route.edge, group);
        edgesLayer.append(group);
      }
    }
    const g = el("g", { class: `route kind-${route.kind}`, "data-source": route.source, "data-target": route.target, "data-state": "idle" });
    const d = pathOf(route.points);
    g.append(el("path", { d, class: "edge-line", "marker-end": `url(#${route.kind === "reentry" ? "arrow-reentry" : "arrow"})` }));
    g.append(el("path", { d, class: "edge-hit" }));
    group.append(g);
    if (route.label && route.label_box) {
      const b = route.label_box;
      const lab = el("g", { class: `edge-label-box kind-${route.kind}`, "data-label-of": route.edge ?? "", "data-source": route.source, "data-target": route.target });
      lab.append(el("title", {}, route.title));
      lab.append(el("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 3 }));
      lab.append(el("text", { x: b.x + b.w / 2, y: b.y + b.h / 2 + 4, "text-anchor": "middle", class: "edge-label" }, route.label));
      if (route.edge !== null) lab.addEventListener("click", () => onSelect({ edge: route.edge }));
      labelsLayer.append(lab);
    }
  }
  svg.append(edgesLayer);
  const nodesLayer = el("g", { class: "nodes" });
  for (const p of lay.nodes) {
    const name = p.name;
    const terminal = name === "START" || name === "END";
    const g = el("g", { class: `node kind-${terminal ? "terminal" : kinds.get(name)}`, "data-node": name, "data-state": terminal ? "idle" : "pending", tabindex: 0 });
    g.append(el("title", {}, name));
    g.append(el("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: terminal ? 17 : 6 }));
    g.append(el("text", { x: p.x + p.w / 2, y: p.y + p.h / 2 + 4, "text-anchor": "middle" }, name));
    if (!terminal) g.addEventListener("click", () => onSelect({ node: name }));
    nodesLayer.append(g);
  }
  svg.append(nodesLayer);
  svg.append(labelsLayer);
  return svg;
}

/** Show ``text`` (a node's visit and item counts) in a badge on the node's top right. */
export function setCount(svg, name, text) {
  const g = svg.querySelector(`[data-node="${CSS.escape(name)}"]`);
  if (!g) return;
  let badge = g.querySelector(".tally");
  if (!badge) {
    const rect = g.querySelector("rect");
    const x = Number(rect.getAttribute("x")) + Number(rect.getAttribute("width"));
    const y = Number(rect.getAttribute("y"));
    badge = el("g", { class: "tally" });
    badge.append(el("rect", { x: x + 4, y: y - 7, height: 14, rx: 7 }));
    badge.append(el("text", { x: x - 2, y: y + 3.5, "text-anchor": "end" }));
    g.append(badge);
  }
  const label = badge.querySelector("text");
  label.textContent = text;
  // inwards from the box's right end (the edges meet a box at its middle)
  const w = text.length * 6 + 12;
  const r = badge.querySelector("rect");
  r.setAttribute("width", String(w));
  r.setAttribute("x", String(Number(label.getAttribute("x")) + 6 - w));
}
