// A workflow's graph as SVG, laid out in layers from the API's nodes and edges:
// a node's layer is its longest path from START once the edges that close a loop are
// set aside (found as interlock/_definition/_graph.py finds them: depth first from START, in
// declaration order); a loop's closing edge is drawn back up along the right.

const SVG = "http://www.w3.org/2000/svg";
const ROW = 78;
const BOX_H = 34;
const GAP = 28;
const CHAR = 7.4;

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

function layout(graph) {
  const names = ["START", ...graph.nodes.map((n) => n.name)];
  const pairs = [];
  graph.edges.forEach((edge, index) => {
    for (const from of edge.from) for (const to of targets(edge)) pairs.push({ from, to, index, edge });
  });
  if (pairs.some((p) => p.to === "END")) names.push("END");
  const known = new Set(names);
  const adj = new Map(names.map((n) => [n, []]));
  for (const p of pairs) if (known.has(p.from) && known.has(p.to)) adj.get(p.from).push(p);
  // back edges: depth first from START (then any node not reached), declaration order
  const state = new Map();
  const back = new Set();
  for (const root of names) {
    if (state.has(root)) continue;
    state.set(root, 1);
    const stack = [[root, 0]];
    while (stack.length) {
      const top = stack[stack.length - 1];
      const out = adj.get(top[0]);
      if (top[1] < out.length) {
        const p = out[top[1]++];
        const s = state.get(p.to);
        if (s === 1) back.add(p);
        else if (s === undefined) { state.set(p.to, 1); stack.push([p.to, 0]); }
      } else { state.set(top[0], 2); stack.pop(); }
    }
  }
  // longest path over the forward edges (a topological order by Kahn's algorithm)
  const layer = new Map(names.map((n) => [n, 0]));
  const indegree = new Map(names.map((n) => [n, 0]));
  for (const p of pairs) if (!back.has(p) && known.has(p.to) && known.has(p.from)) indegree.set(p.to, indegree.get(p.to) + 1);
  const queue = names.filter((n) => indegree.get(n) === 0);
  while (queue.length) {
    const n = queue.shift();
    for (const p of adj.get(n)) {
      if (back.has(p)) continue;
      layer.set(p.to, Math.max(layer.get(p.to), layer.get(n) + 1));
      indegree.set(p.to, indegree.get(p.to) - 1);
      if (indegree.get(p.to) === 0) queue.push(p.to);
    }
  }
  if (known.has("END")) layer.set("END", Math.max(...[...layer.values()]) + (layer.get("END") === 0 ? 1 : 0));
  const rows = [];
  for (const n of names) (rows[layer.get(n)] ||= []).push(n);
  // order each row by its predecessors' mean position (one pass: fewer crossings)
  const order = new Map();
  rows.forEach((row, r) => {
    if (r > 0) {
      const mean = (n) => {
        const preds = pairs.filter((p) => p.to === n && !back.has(p) && order.has(p.from));
        return preds.length ? preds.reduce((s, p) => s + order.get(p.from), 0) / preds.length : 1e9;
      };
      const keyed = row.map((n, i) => [mean(n), i, n]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
      row.splice(0, row.length, ...keyed.map((k) => k[2]));
    }
    row.forEach((n, i) => order.set(n, i));
  });
  const width = (n) => Math.max(70, n.length * CHAR + 26);
  const rowWidths = rows.map((row) => row.reduce((s, n) => s + width(n), 0) + GAP * (row.length - 1));
  const total = Math.max(...rowWidths, 200);
  const pos = new Map();
  rows.forEach((row, r) => {
    let x = (total - rowWidths[r]) / 2 + 70;
    for (const n of row) {
      pos.set(n, { x, y: 20 + r * ROW, w: width(n), h: BOX_H });
      x += width(n) + GAP;
    }
  });
  return { pos, pairs, back, layer, width: total + 160, height: rows.length * ROW + 10 };
}

/**
 * The graph as an <svg>: each node a <g data-node=NAME data-state=...>, each drawn edge
 * a <g data-edge=INDEX data-state=...>. ``onSelect({node} | {edge})`` on a click.
 */
export function renderGraph(graph, onSelect = () => {}) {
  const { pos, pairs, back, layer, width, height } = layout(graph);
  let detours = 0;
  const kinds = new Map(graph.nodes.map((n) => [n.name, n.approval ? "gate" : n.confirm ? "confirm" : n.agent ? "agent" : n.workflow ? "subflow" : "call"]));
  const svg = el("svg", { class: "graph", viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  svg.append(el("title", {}, `graph of ${graph.nodes.length} nodes`));
  const defs = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(el("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
  defs.append(marker);
  svg.append(defs);
  const edgesLayer = el("g", { class: "edges" });
  const groups = new Map();
  for (const p of pairs) {
    const a = pos.get(p.from);
    const b = pos.get(p.to);
    if (!a || !b) continue;
    let group = groups.get(p.index);
    if (!group) {
      group = el("g", { class: "edge", "data-edge": p.index, "data-state": "idle", tabindex: 0 });
      group.append(el("title", {}, `edge ${p.index}: ${p.edge.from.join(", ")} → ${targets(p.edge).join(", ")} — ${edgeCondition(p.edge)}`));
      group.addEventListener("click", () => onSelect({ edge: p.index }));
      groups.set(p.index, group);
      edgesLayer.append(group);
    }
    let d;
    let lx;
    let ly;
    if (back.has(p) || b.y <= a.y) {
      const x1 = a.x + a.w;
      const y1 = a.y + a.h / 2;
      const x2 = b.x + b.w;
      const y2 = b.y + b.h / 2;
      const out = Math.max(x1, x2) + 40;
      d = `M ${x1} ${y1} C ${out} ${y1}, ${out} ${y2}, ${x2 + 2} ${y2}`;
      lx = out - 8;
      ly = (y1 + y2) / 2;
    } else if (layer.get(p.to) - layer.get(p.from) > 1) {
      // past the layers between: around them on the left, so no node hides it
      const x1 = a.x;
      const y1 = a.y + a.h / 2;
      const x2 = b.x - 2;
      const y2 = b.y + b.h / 2;
      const out = Math.max(Math.min(x1, x2) - 40 - 14 * (detours++ % 3), 6);
      d = `M ${x1} ${y1} C ${out} ${y1}, ${out} ${y2}, ${x2} ${y2}`;
      lx = out - 30;
      ly = (y1 + y2) / 2;
    } else {
      const x1 = a.x + a.w / 2;
      const y1 = a.y + a.h;
      const x2 = b.x + b.w / 2;
      const y2 = b.y - 2;
      const mid = (y1 + y2) / 2;
      d = `M ${x1} ${y1} C ${x1} ${mid}, ${x2} ${mid}, ${x2} ${y2}`;
      lx = (x1 + x2) / 2;
      ly = mid;
    }
    group.append(el("path", { d, class: "edge-line", "marker-end": "url(#arrow)" }));
    group.append(el("path", { d, class: "edge-hit" }));
    const label = edgeLabel(p.edge);
    if (label) group.append(el("text", { x: lx + 4, y: ly - 3, class: "edge-label" }, label));
  }
  svg.append(edgesLayer);
  const nodesLayer = el("g", { class: "nodes" });
  for (const [name, p] of pos) {
    const terminal = name === "START" || name === "END";
    const g = el("g", { class: `node kind-${terminal ? "terminal" : kinds.get(name)}`, "data-node": name, "data-state": terminal ? "idle" : "pending", tabindex: 0 });
    g.append(el("title", {}, name));
    g.append(el("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: terminal ? 17 : 6 }));
    g.append(el("text", { x: p.x + p.w / 2, y: p.y + p.h / 2 + 4, "text-anchor": "middle" }, name));
    if (!terminal) g.addEventListener("click", () => onSelect({ node: name }));
    nodesLayer.append(g);
  }
  svg.append(nodesLayer);
  return svg;
}
