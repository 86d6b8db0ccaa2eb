// The dashboard: runs, a run (graph, timeline, node visits, edge decisions), the
// approvals inbox, workflows. Everything from a run is user data: it is put in the page
// as text (textContent, Element.append of strings), never parsed as HTML.

import { api, ApiError, follow, token } from "./api.js";
import { edgeCondition, renderGraph, setCount, targets } from "./graph.js";
import { checkJson } from "./schema.js";
import { conversationPage, conversationsPage } from "./chat.js";

const POLL_MS = 1000;
const VISITS_SHOWN = 50; // a node's visits drawn in the inspector (the latest)
const STATUSES = ["RUNNING", "WAITING_APPROVAL", "WAITING_INPUT", "RETRYING", "PENDING", "COMPLETED", "FAILED",
  "REJECTED", "CANCELLED"];
const TERMINAL = { "run.completed": "COMPLETED", "run.failed": "FAILED", "run.rejected": "REJECTED",
  "run.cancelled": "CANCELLED" };

/** An element: ``attrs`` are attributes (``on*`` functions become listeners), children
 * are nodes or strings (strings become text). */
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== undefined && child !== null && child !== false) node.append(child);
  }
  return node;
}

const present = (children) => children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
/** Append to the page's main element (null, undefined and false are left out). */
const put = (...children) => main.append(...present(children));
/** Replace ``node``'s children (null, undefined and false are left out). */
const fill = (node, ...children) => node.replaceChildren(...present(children));
const json = (v) => JSON.stringify(v, null, 2);
const short = (v, n = 120) => {
  const text = typeof v === "string" ? v : JSON.stringify(v);
  return text === undefined ? "" : text.length > n ? `${text.slice(0, n - 1)}…` : text;
};
const when = (t) => {
  if (t === null || t === undefined) return "";
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString();
};
// hour, minute and second with milliseconds ("14:03:07.372"): fractionalSecondDigits
// alone would print the milliseconds only
const clock = (t) => {
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  return Number.isNaN(d.getTime()) ? String(t ?? "") : d.toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3 });
};
const seconds = (t) => (typeof t === "number" ? t : new Date(t).getTime() / 1000);
/** A duration in seconds, for people: "850 ms", "12.4 s", "3 min 05 s", "2 h 07 min". */
const span = (s) => {
  if (!Number.isFinite(s)) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
};
const badge = (status) => h("span", { class: `badge status-${String(status).toLowerCase()}`, "data-status": status }, status);
const link = (href, text, attrs = {}) => h("a", { href, "data-link": true, ...attrs }, text);
const runHref = (id) => `/runs/${encodeURIComponent(id)}`;

function problemBox(error) {
  const box = h("div", { class: "problem", role: "alert" });
  if (error instanceof ApiError) {
    box.dataset.status = String(error.status);
    box.append(h("strong", {}, `${error.status} ${error.title}`), ": ", error.detail);
  } else {
    box.append(h("strong", {}, "The request failed"), ": ", String(error?.message || error));
  }
  return box;
}

// -- the shell: routing, the token, who is signed in ----------------------------------

const main = document.getElementById("main");
let cleanup = () => {};

const routes = [
  [/^\/$/, runsPage, "runs"],
  [/^\/approvals$/, approvalsPage, "approvals"],
  [/^\/runs\/([^/]+)$/, runPage, "runs"],
  [/^\/workflows$/, workflowsPage, "workflows"],
  [/^\/workflows\/([^/]+)$/, workflowPage, "workflows"],
  [/^\/schedules$/, schedulesPage, "schedules"],
  [/^\/workers$/, workersPage, "workers"],
  [/^\/conversations$/, (ctx) => conversationsPage(ctx, kit()), "conversations"],
  [/^\/conversations\/([^/]+)$/, (ctx, id) => conversationPage(ctx, id, kit()), "conversations"],
];
// what chat.js (conversations) uses of this module
const kit = () => ({ h, put, link, badge, when, short, problemBox, approvalCard, runGates, whoAmI, every, api, ApiError, follow });

function navigate(href) {
  history.pushState(null, "", href);
  render();
}

function render() {
  cleanup();
  const controller = new AbortController();
  const stops = [() => controller.abort()];
  cleanup = () => stops.splice(0).forEach((stop) => stop());
  const ctx = { signal: controller.signal, onStop: (fn) => stops.push(fn) };
  const path = location.pathname;
  for (const [pattern, page, nav] of routes) {
    const m = path.match(pattern);
    if (!m) continue;
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
    main.replaceChildren();
    const args = m.slice(1).map(decodeURIComponent);
    page(ctx, ...args).catch((error) => {
      if (!(error instanceof ApiError && error.status === 401) && !controller.signal.aborted) {
        put(problemBox(error));
      }
    });
    return;
  }
  main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, link("/", "the runs")));
}

document.addEventListener("click", (event) => {
  const a = event.target.closest?.("a[data-link]");
  if (!a || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
  event.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", render);

function askForToken(reason) {
  cleanup();
  cleanup = () => {};
  const input = h("input", { type: "password", id: "token-input", autocomplete: "off", spellcheck: "false", required: true, "aria-label": "token" });
  const form = h("form", { id: "token-form", class: "card" },
    h("h1", {}, "This server needs a token"),
    h("p", {}, reason),
    h("label", {}, "Token ", input),
    h("button", { type: "submit" }, "Use token"),
    h("p", { class: "muted" }, "Kept in this tab's sessionStorage only and sent as ",
      h("code", {}, "Authorization: Bearer"), "; closing the tab forgets it."));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!input.value.trim()) return;
    token.set(input.value.trim());
    showWho();
    render();
  });
  main.replaceChildren(form);
  input.focus();
}

let asking = false;
window.addEventListener("interlock:unauthorized", (event) => {
  // a 401 only clears the token it was sent with: one for a token the user has since
  // replaced (or forgotten) is old news, whatever order the answers come back in
  if ((event.detail?.token ?? null) !== (token.get() ?? null)) return;
  if (asking || (!token.get() && document.getElementById("token-form"))) return; // asked
  asking = true;
  queueMicrotask(() => { asking = false; });
  const had = token.get();
  token.clear();
  showWho();
  askForToken(had ? "The token was refused (it is not one this server knows). Enter another."
    : "The server runs with --auth: enter your token to see runs and decide approvals.");
});

let meCache = null;
/** Who the token is (GET /api/me), asked once per token; null when it cannot be read. */
function whoAmI() {
  const key = token.get() || "";
  if (!meCache || meCache.key !== key) meCache = { key, me: api("/api/me").catch(() => null) };
  return meCache.me;
}

/** Whether ``me`` may decide (approver or admin; the server checks it again). */
const mayDecide = (me) => !me || me.roles.includes("approver") || me.roles.includes("admin");

/** Whether ``me`` may start, cancel, resume or fork runs (operator or admin). */
const mayOperate = (me) => !me || me.roles.includes("operator") || me.roles.includes("admin");

/** A JSON object typed in a textarea: ``{}`` when empty, else the object or an Error
 * that names ``what`` and why. */
function jsonObject(text, what) {
  if (!text.trim()) return {};
  let value;
  try { value = JSON.parse(text); } catch (e) { return new Error(`${what} is not JSON: ${e.message}`); }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return new Error(`${what} must be a JSON object, like {"field": 1}`);
  return value;
}

async function showWho() {
  const who = document.getElementById("who");
  const forget = document.getElementById("forget-token");
  const asked = token.get();
  forget.hidden = !asked;
  let text = "";
  try {
    const me = await api("/api/me");
    text = me.authenticated ? `${me.name} (${me.roles.join(", ")})` : "";
  } catch { /* unknown: shown as nobody */ }
  if (token.get() === asked) who.textContent = text; // a late answer for an old token: not shown
}

document.getElementById("forget-token").addEventListener("click", () => {
  token.clear();
  showWho();
  render();
});

/** Call ``fn`` now and every ``ms`` until the page changes (not while one is running;
 * not while the tab is hidden: it reads again as soon as it is shown). */
function every(ctx, ms, fn) {
  let timer = null;
  const tick = async () => {
    if (document.hidden) {
      document.addEventListener("visibilitychange", tick, { once: true });
      return;
    }
    try { await fn(); } catch (error) {
      if (error instanceof ApiError && error.status === 401) return; // the token page is up
    }
    if (!ctx.signal.aborted) timer = setTimeout(tick, ms);
  };
  ctx.onStop(() => clearTimeout(timer));
  return tick();
}

// -- the runs list -------------------------------------------------------------------

async function runsPage(ctx) {
  const params = new URLSearchParams(location.search);
  const status = h("select", { id: "filter-status", "aria-label": "status" },
    h("option", { value: "" }, "any status"), STATUSES.map((s) => h("option", { value: s }, s)));
  const workflow = h("select", { id: "filter-workflow", "aria-label": "workflow" }, h("option", { value: "" }, "any workflow"));
  status.value = params.get("status") || "";
  let cursor = params.get("cursor");  // the API's opaque keyset cursor (its page's next)
  let from = Number(params.get("from")) || 0;  // how many newer runs the pages before held
  const pageHref = (at, n) => {
    const q = new URLSearchParams(location.search);
    if (at) { q.set("cursor", at); q.set("from", String(n)); } else { q.delete("cursor"); q.delete("from"); }
    return q.toString() ? `/?${q}` : "/";
  };
  const search = h("input", { type: "search", id: "filter-q", placeholder: "run id contains", "aria-label": "run id", value: params.get("q") || "" });
  const inputQ = h("input", { type: "search", id: "filter-input", placeholder: "input field=value", "aria-label": "input field", value: params.get("input") || "" });
  const localValue = (t) => { if (!t) return ""; const d = new Date(Number(t) * 1000); return Number.isNaN(d.getTime()) ? "" : new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19); };
  const since = h("input", { type: "datetime-local", step: 1, id: "filter-since", "aria-label": "created since", value: localValue(params.get("since")) });
  const until = h("input", { type: "datetime-local", step: 1, id: "filter-until", "aria-label": "created until", value: localValue(params.get("until")) });
  const epoch = (el) => (el.value ? String(new Date(el.value).getTime() / 1000) : "");
  const searching = () => Boolean(search.value.trim() || inputQ.value.trim() || since.value || until.value);
  let loadedKey = null; // a search is read once per query (and paging), not every second
  const tbody = h("tbody", { id: "runs" });
  const footer = h("p", { class: "muted", id: "runs-footer" });
  const error = h("div");
  put(h("h1", {}, "Runs"),
    h("div", { class: "filters" }, "Status ", status, " Workflow ", workflow, h("span", { class: "live", id: "runs-live", title: "refreshed every second" }, "live")),
    h("form", { class: "filters", id: "runs-search", onsubmit: (e) => { e.preventDefault(); onFilter(); } },
      search, " ", inputQ, " created from ", since, " to ", until, " ", h("button", { type: "submit", id: "search-runs" }, "Search"),
      " ", h("button", { type: "button", id: "clear-search", onclick: () => { search.value = inputQ.value = since.value = until.value = ""; onFilter(); } }, "Clear")),
    error,
    h("table", { class: "runs" }, h("thead", {}, h("tr", {},
      ["run", "workflow", "status", "steps", "tokens", "waiting at", "created", "duration"].map((c) => h("th", {}, c)))), tbody),
    footer);
  const onFilter = () => {
    cursor = null;
    from = 0;
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (workflow.value) q.set("workflow", workflow.value);
    if (search.value.trim()) q.set("q", search.value.trim());
    if (inputQ.value.trim()) q.set("input", inputQ.value.trim());
    if (since.value) q.set("since", epoch(since));
    if (until.value) q.set("until", epoch(until));
    history.replaceState(null, "", q.toString() ? `/?${q}` : "/");
    loadedKey = null;
    refresh().catch((e) => { if (!(e instanceof ApiError && e.status === 401)) error.replaceChildren(problemBox(e)); });
  };
  status.addEventListener("change", onFilter);
  workflow.addEventListener("change", onFilter);
  try {
    const flows = await api("/api/workflows", { signal: ctx.signal });
    const names = new Set(flows.map((f) => f.name));
    if (params.get("workflow")) names.add(params.get("workflow"));
    for (const n of [...names].sort()) workflow.append(h("option", { value: n }, n));
    workflow.value = params.get("workflow") || "";
  } catch (e) { if (e instanceof ApiError && e.status === 401) throw e; }
  const refresh = async () => {
    const q = new URLSearchParams({ limit: "100" });
    if (status.value) q.set("status", status.value);
    if (workflow.value) q.set("workflow", workflow.value);
    if (cursor) q.set("cursor", cursor);
    if (search.value.trim()) q.set("q", search.value.trim());
    if (inputQ.value.trim()) q.set("input", inputQ.value.trim());
    if (since.value) q.set("since", epoch(since));
    if (until.value) q.set("until", epoch(until));
    document.getElementById("runs-live").hidden = searching();
    if (searching() && loadedKey === q.toString()) return;
    const page = await api(`/api/runs?${q}`, { signal: ctx.signal });
    loadedKey = q.toString();
    error.replaceChildren();
    tbody.replaceChildren(...page.runs.map((r) => h("tr", { dataset: { run: r.run_id } },
      h("td", {}, link(runHref(r.run_id), r.run_id)),
      h("td", {}, link(`/workflows/${encodeURIComponent(r.workflow)}`, r.workflow)),
      h("td", {}, badge(r.status)),
      h("td", { class: "num" }, String(r.steps)),
      h("td", { class: "num" }, String(r.tokens)),
      h("td", {}, r.waiting?.node ? link(`/approvals?run_id=${encodeURIComponent(r.run_id)}`, r.waiting.node) : ""),
      h("td", {}, when(r.created_at)),
      h("td", { class: "num duration", title: `updated ${when(r.updated_at)}` }, runDuration(r)))));
    const pages = [];
    if (cursor) pages.push(link(pageHref(null, 0), "← newest"));
    if (page.next) pages.push(link(pageHref(page.next, from + page.runs.length), "older →"));
    fill(footer, page.runs.length ? `runs ${from + 1}–${from + page.runs.length}, newest first ` : "no runs match ",
      page.scanned !== undefined ? h("span", { id: "runs-scanned" }, `(searched ${page.scanned} run(s)${page.next ? "; older ones on the next page" : ""}) `) : null, pages);
  };
  await every(ctx, POLL_MS, async () => {
    try { await refresh(); } catch (e) {
      if (!(e instanceof ApiError && e.status === 401)) error.replaceChildren(problemBox(e));
      throw e;
    }
  });
}

/** A run's duration in the list: created to its last change when it ended, else how
 * long it has been going (a waiting run: since it was created). */
function runDuration(r) {
  const ended = ["COMPLETED", "FAILED", "REJECTED", "CANCELLED"].includes(r.status);
  const end = ended ? r.updated_at : Date.now() / 1000;
  const text = span(end - r.created_at);
  return ended ? text : `${text} so far`;
}

// -- a run ---------------------------------------------------------------------------

/** A record's one-line detail for the timeline. */
function detail(rec) {
  switch (rec.type) {
    case "run.started": return `workflow ${rec.workflow}  input ${short(rec.input)}`;
    case "node.started": return `visit ${rec.visit ?? 1}${rec.item !== undefined && rec.item !== null ? `, item ${rec.item}` : ""}, attempt ${rec.attempt ?? 1}`;
    case "node.completed": return rec.update ? `update ${short(rec.update)}` : "";
    case "node.visited": return `visit ${rec.visit ?? 1}, started and completed${rec.update ? `  update ${short(rec.update)}` : ""}`;
    case "node.failed": case "node.retrying": return short(rec.error);
    case "edge.taken": case "edge.skipped": {
      const parts = [`edge ${rec.edge}: ${rec.from} → ${(rec.to || []).join(", ") || "—"}`];
      if (rec.expr) parts.push(`${rec.expr} = ${short(rec.value, 30)}`);
      if (rec.reads) parts.push(`reads ${Object.entries(rec.reads).map(([k, v]) => `${k}=${short(v, 40)}`).join(", ")}`);
      if (rec.arrived) parts.push(`joined ${rec.arrived.join(", ")}`);
      if (rec.reason) parts.push(`(${rec.reason})`);
      // (log format 3: a `when` decision carried by its node's node.visited has its expr)
      if (rec.implied) parts.push(rec.expr && rec.expr !== "otherwise"
        ? "(carried by the visit's record: not a record of its own)"
        : "(implied by the definition: not a record of its own)");
      return parts.join("  ");
    }
    case "approval.requested": return `${rec.kind}: decisions ${(rec.decisions || []).join(", ")}`;
    case "approval.decided": return `${rec.decision} by ${rec.by ?? "?"}${rec.comment ? `: ${rec.comment}` : ""}`;
    case "run.waiting": return `for a decision at ${rec.waiting?.node}`;
    case "run.resumed": return rec.by ? `by ${rec.by}` : "";
    case "state.patched": return `patch ${short(rec.patch)}`;
    case "child.started": return ["child run ", link(runHref(rec.run_id), rec.run_id), ` (${rec.workflow})`];
    case "run.failed": case "run.rejected": case "run.cancelled": return short(rec.error ?? rec.message ?? rec.reason ?? "");
    default: {
      const skip = new Set(["seq", "type", "at", "node", "visit", "attempt", "duration_ms", "tokens", "error", "hash"]);
      return short(Object.fromEntries(Object.entries(rec).filter(([k, v]) => !skip.has(k) && v !== null)));
    }
  }
}

const NODE_STATE = { "node.started": "running", "node.completed": "completed", "node.visited": "completed", "node.failed": "failed",
  "node.retrying": "retrying", "approval.requested": "waiting", "approval.decided": "running" };

async function runPage(ctx, runId) {
  const run = await api(`/api/runs/${encodeURIComponent(runId)}`, { signal: ctx.signal });
  const graph = await api(`/api/runs/${encodeURIComponent(runId)}/graph`, { signal: ctx.signal });
  const status = h("span", { id: "run-status" }, badge(run.status));
  const facts = h("span", { id: "run-facts", class: "muted" });
  const streamState = h("span", { id: "stream-state", class: "live" }, "connecting");
  const gateBox = h("div", { id: "run-gate" });
  const actions = h("div", { id: "run-actions", class: "actions" });
  const codeNotice = h("div", { id: "code-changed" });
  const side = h("aside", { id: "inspector", class: "card" }, h("p", { class: "muted" }, "Click a node for its visits (input, update, tokens, duration, error), or an edge for its decisions."));
  const timeline = h("tbody", { id: "timeline" });
  // the panels: input, the state at a record (or the final state), the error, timings
  const times = h("span", { id: "run-times", class: "muted" });
  const inputPre = h("pre", { id: "run-input" }, "");
  const statePre = h("pre", { id: "run-state" }, "");
  const stateTitle = h("h3", { id: "state-title" }, "State");
  const stateAt = h("input", { type: "number", id: "state-at", min: 1, step: 1, "aria-label": "state at record", placeholder: "record seq" });
  const stateBtn = h("button", { type: "button", id: "show-state" }, "State at record");
  const errorBox = h("div", { id: "run-error" });
  const timingBody = h("tbody", { id: "node-timing" });
  const panels = h("div", { class: "panels" },
    h("section", { class: "card panel" }, h("h3", {}, "Input"), inputPre),
    h("section", { class: "card panel" }, stateTitle, h("p", {}, stateAt, " ", stateBtn, " ", h("button", { type: "button", id: "show-final", onclick: () => showState(null) }, "Latest")), statePre),
    h("section", { class: "card panel" }, h("h3", {}, "Node timings"),
      h("table", { class: "timing" }, h("thead", {}, h("tr", {}, ["node", "visits", "total", "longest", ""].map((c) => h("th", {}, c)))), timingBody)),
    errorBox);
  const records = [];
  let selected = null;
  let finished = false;
  let current = run; // the run object last read: what it waits for, if anything
  // inspect()'s ticket, declared before anything can call inspect() (a click on the graph
  // while the page is still loading): a `let` used before its line is a TDZ error
  let inspecting = 0;
  const svg = renderGraph(graph, (what) => { selected = what; inspect(); });
  const nodeEl = (name) => svg.querySelector(`[data-node="${CSS.escape(name)}"]`);
  const edgeEl = (i) => svg.querySelector(`[data-edge="${i}"]`);
  // a migrated run: the graph is the definition it is on now; the edge records
  // before the last run.migrated number the edges of the one it was on before
  const beforeMigration = (rec) => Boolean(graph.migrated) && rec.seq < graph.migrated.seq;
  const migratedNotice = graph.migrated ? h("p", { id: "migrated", class: "card notice" },
    `This run was migrated at record ${graph.migrated.seq}${graph.migrated.by ? ` by ${graph.migrated.by}` : ""} `,
    `(${String(graph.migrated.from_hash).slice(0, 12)} → ${String(graph.migrated.to_hash).slice(0, 12)}): `,
    "the graph is the definition it is on now; the decisions recorded before the migration are lit only where this graph has an arrow between the same nodes.") : null;
  put(
    h("h1", {}, "Run ", h("code", {}, runId), " ", status),
    h("p", {}, "workflow ", link(`/workflows/${encodeURIComponent(run.workflow)}`, run.workflow), " · ", facts, " · ", streamState),
    h("p", {}, times),
    actions,
    migratedNotice,
    codeNotice,
    gateBox,
    h("div", { class: "run-layout" }, h("div", { class: "graph-box card" }, svg), side),
    panels,
    h("h2", {}, "Timeline"),
    h("table", { class: "timeline" }, h("thead", {}, h("tr", {}, ["seq", "at", "type", "node", "", "detail"].map((c) => h("th", {}, c)))), timeline));
  let stateShown = null; // the seq whose state is shown, null: the latest
  const showError = (err) => {
    if (!err) { errorBox.replaceChildren(); return; }
    const top = typeof err === "object" ? err : { message: String(err) };
    const e = { ...(top.details || {}), ...top }; // a node's error: exception, mro, traceback in details
    errorBox.replaceChildren(h("section", { class: "card panel error-panel", role: "alert" },
      h("h3", {}, "Error", e.node ? ` in ${e.node}` : ""),
      h("p", { class: "error-message" }, e.message ?? json(e)),
      e.exception ? h("p", { class: "muted" }, e.exception, e.mro?.length ? ` (${e.mro.join(" → ")})` : "") : null,
      e.traceback ? h("details", { open: true }, h("summary", {}, "Traceback"), h("pre", { class: "traceback" }, e.traceback)) : null));
  };
  async function showState(seq) {
    stateShown = seq;
    try {
      const q = seq === null ? "" : `?at=${seq}`;
      const r = await api(`/api/runs/${encodeURIComponent(runId)}/state${q}`, { signal: ctx.signal });
      if (stateShown !== seq) return;
      stateTitle.textContent = seq === null ? `State (latest, record ${r.seq})` : `State after record ${r.seq}`;
      statePre.textContent = json(r.state);
      statePre.dataset.seq = String(r.seq);
    } catch (error) {
      statePre.replaceChildren(problemBox(error));
    }
  }
  stateBtn.addEventListener("click", () => {
    const at = Number(stateAt.value);
    if (Number.isInteger(at) && at >= 1) showState(at);
  });
  const timing = new Map(); // node -> {visits, total, longest} (ms, from the log)
  const drawTiming = () => {
    const rows = [...timing.entries()].sort((a, b) => b[1].total - a[1].total);
    const most = rows.length ? rows[0][1].total || 1 : 1;
    timingBody.replaceChildren(...rows.map(([node, t]) => h("tr", { dataset: { node } },
      h("td", {}, h("code", {}, node)), h("td", { class: "num" }, String(t.visits)),
      h("td", { class: "num" }, span(t.total / 1000)), h("td", { class: "num" }, span(t.longest / 1000)),
      h("td", {}, h("span", { class: "bar", dataset: { pct: String(Math.round((100 * t.total) / most)) } })))));
    for (const bar of timingBody.querySelectorAll(".bar")) bar.style.width = `${bar.dataset.pct}%`;
  };
  const setTimes = () => {
    if (!records.length) return;
    const first = seconds(records[0].at);
    const endRec = finished ? records[records.length - 1] : null;
    const end = endRec ? seconds(endRec.at) : Date.now() / 1000;
    times.textContent = `started ${when(records[0].at)}` + (endRec ? ` · ended ${when(endRec.at)}` : "") + ` · ${endRec ? "took" : "running for"} ${span(end - first)}`;
    times.dataset.seconds = String(end - first);
    const w = current.waiting;
    if (!endRec && w && (current.status === "WAITING_APPROVAL" || current.status === "WAITING_INPUT")) {
      // a waiting run is not running: what it waits for, and since when
      const what = w.kind === "message" ? "waiting for the next message" : `waiting for a decision at ${w.node}`;
      const since = typeof w.requested_at === "number" ? ` for ${span(Date.now() / 1000 - w.requested_at)}` : "";
      times.textContent = `started ${when(records[0].at)} · ${what}${since}`;
    }
  };
  const setFacts = (r) => {
    current = r;
    setTimes();
    facts.textContent = `${r.steps} step(s), ${r.tokens} token(s)` + (r.error ? ` · error: ${short(r.error.message ?? r.error)}` : "");
    showError(r.error);
    if (stateShown === null) statePre.textContent = json(r.state);
    status.replaceChildren(badge(r.status));
    // nodes still to run whose code changed since the run started (or migrated)
    codeNotice.replaceChildren(...(r.code_changed?.length ? [h("p", { class: "card notice" },
      "The code of ", r.code_changed.map((n) => h("code", {}, n)).flatMap((c, i) => (i ? [", ", c] : [c])),
      " changed since this run started: it will continue on the code deployed now (recorded as run.code_changed), or be refused where --strict-code is on. ",
      "Accept that code on the record with ", h("code", {}, `interlock migrate ${runId} --to FILE`), " (FILE: the definition the run is on).")] : []));
  };
  const me = await whoAmI();
  const operate = mayOperate(me);
  const actionOut = h("div", { id: "action-result", "aria-live": "polite" });
  const act = async (button, path, body, then) => {
    button.disabled = true;
    actionOut.replaceChildren();
    try {
      const r = await api(path, { method: "POST", body });
      then(r);
    } catch (error) {
      actionOut.replaceChildren(problemBox(error));
    } finally { button.disabled = false; }
  };
  const runPath = `/api/runs/${encodeURIComponent(runId)}`;
  const cancelBtn = h("button", { type: "button", id: "cancel-run", hidden: true,
    onclick: () => { if (confirm(`Cancel run ${runId}?`)) act(cancelBtn, `${runPath}/cancel`, {}, (r) => setFactsAll(r)); } }, "Cancel run");
  const resumeBtn = h("button", { type: "button", id: "resume-run", hidden: true,
    onclick: () => act(resumeBtn, `${runPath}/resume`, {}, (r) => { setFactsAll(r); navigate(runHref(runId)); }) }, "Resume");
  const forkAt = h("input", { type: "number", id: "fork-at", min: 1, step: 1, "aria-label": "fork at record", placeholder: "record seq" });
  const forkPatch = h("textarea", { id: "fork-patch", rows: 1, placeholder: 'state patch (JSON, optional) {"field": "value"}', "aria-label": "fork patch" });
  const forkBtn = h("button", { type: "button", id: "fork-run", onclick: () => {
    const at = Number(forkAt.value);
    const patch = jsonObject(forkPatch.value, "the patch");
    if (!Number.isInteger(at) || at < 1) { actionOut.replaceChildren(problemBox(new Error("choose the record to fork from: its seq (click a timeline row)"))); return; }
    if (patch instanceof Error) { actionOut.replaceChildren(problemBox(patch)); return; }
    act(forkBtn, `${runPath}/fork`, Object.keys(patch).length ? { at, patch } : { at }, (r) => navigate(runHref(r.run_id)));
  } }, "Fork");
  if (operate) {
    actions.append(cancelBtn, resumeBtn,
      h("span", { class: "fork" }, "Fork a new run from record ", forkAt, " ", forkPatch, " ", forkBtn), actionOut);
  }
  const showActions = (s) => {
    cancelBtn.hidden = !operate || ["COMPLETED", "FAILED", "REJECTED", "CANCELLED"].includes(s);
    resumeBtn.hidden = !operate || s !== "FAILED";
  };
  const setFactsOnly = setFacts;
  const setFactsAll = (r) => { setFactsOnly(r); showActions(r.status); };
  setFactsAll(run);

  const showGate = runGates(gateBox, runId, ctx.signal);
  showGate(run).catch(() => {}); // (the next record looks again)

  let refreshing = null;
  const refreshRun = () => {
    if (refreshing) return;
    refreshing = setTimeout(async () => {
      refreshing = null;
      try {
        const r = await api(`/api/runs/${encodeURIComponent(runId)}`, { signal: ctx.signal });
        setFactsAll(r);
        await showGate(r);
      } catch { /* the next record retries */ }
    }, 150);
  };
  ctx.onStop(() => clearTimeout(refreshing));

  let timingDirty = false;
  let pendingRows = [];
  let rowFrame = 0;
  const flushRows = () => {
    rowFrame = 0;
    const rows = pendingRows;
    pendingRows = [];
    timeline.append(...rows);
  };
  ctx.onStop(() => cancelAnimationFrame(rowFrame));
  const rejected = new Set(); // gates whose last decision rejected them
  const counts = new Map(); // node -> its visits and map items so far
  const apply = (rec) => {
    records.push(rec);
    let state = NODE_STATE[rec.type];
    if (rec.type === "approval.decided") {
      if (rec.decision === "rejected" || rec.decision === "timed_out") rejected.add(rec.node);
      else rejected.delete(rec.node);
    }
    if (rejected.has(rec.node) && (rec.type === "approval.decided" || rec.type === "node.completed")) state = "rejected";
    if (rec.type === "run.rejected" && rec.node) state = "rejected";
    if (state && rec.node) nodeEl(rec.node)?.setAttribute("data-state", state);
    if (TERMINAL[rec.type]) {
      // what was still in flight when the run ended (cancelled, failed elsewhere)
      for (const g of svg.querySelectorAll('[data-state="running"], [data-state="waiting"], [data-state="retrying"]')) {
        if (g.dataset.node !== rec.node) g.setAttribute("data-state", "stopped");
      }
    }
    if (rec.type === "run.migrated" && rec.seq > (graph.migrated?.seq ?? 0)) {
      location.reload(); // moved onto another definition while shown: draw that one
      return;
    }
    if ((rec.type === "edge.taken" || rec.type === "edge.skipped") && beforeMigration(rec)) {
      // numbered by the definition the run was on before (docs/versions.md): only the
      // arrows between the same nodes in this graph are lit, by name, never by index
      if (rec.type === "edge.taken") {
        for (const source of rec.from === "*" ? rec.arrived || [] : [rec.from]) {
          for (const r of svg.querySelectorAll(`.route[data-source="${CSS.escape(source)}"]`)) {
            if ((rec.to || []).includes(r.dataset.target)) r.setAttribute("data-state", "taken");
          }
        }
      }
    } else if (rec.type === "edge.taken" || rec.type === "edge.skipped") {
      const e = edgeEl(rec.edge);
      if (rec.type === "edge.taken") e?.setAttribute("data-state", "taken");
      else if (e && e.dataset.state !== "taken") e.setAttribute("data-state", "skipped");
      // each arrow of the edge from this source (a join's, from "*": from each of its
      // sources, taken from those that arrived): taken to the targets it went to only
      const join = rec.from === "*";
      for (const r of e ? e.querySelectorAll(".route") : []) {
        if (!join && r.dataset.source !== rec.from) continue;
        const came = !join || !rec.arrived || rec.arrived.includes(r.dataset.source);
        if (came && (rec.to || []).includes(r.dataset.target)) r.setAttribute("data-state", "taken");
        else if (r.dataset.state !== "taken") r.setAttribute("data-state", "skipped");
      }
      if (rec.type === "edge.taken" && (rec.to || []).includes("END")) nodeEl("END")?.setAttribute("data-state", "reached");
    }
    // a node no edge leaves, completed (not a map item's, not a rejected gate, not a
    // re-entry): its path went on to END
    if ((rec.type === "node.completed" || rec.type === "node.visited") && rec.node
        && (rec.item === undefined || rec.item === null) && !rec.reenter && !rejected.has(rec.node)) {
      const end = svg.querySelector(`[data-implicit="${CSS.escape(rec.node)}"]`);
      for (const r of end ? end.querySelectorAll(".route") : []) r.setAttribute("data-state", "taken");
      if (end) { end.setAttribute("data-state", "taken"); nodeEl("END")?.setAttribute("data-state", "reached"); }
    }
    if (rec.type === "approval.decided" && rec.reenter) {
      const r = svg.querySelector(`[data-reentry="${CSS.escape(`${rec.node}→${rec.reenter}`)}"]`);
      r?.setAttribute("data-state", "taken");
      for (const route of r ? r.querySelectorAll(".route") : []) route.setAttribute("data-state", "taken");
    }
    if ((rec.type === "node.started" || rec.type === "node.visited") && rec.node) {
      const c = counts.get(rec.node) || { visits: new Set(), items: new Set() };
      counts.set(rec.node, c);
      c.visits.add(rec.visit ?? 1);
      if (rec.item !== undefined && rec.item !== null) c.items.add(`${rec.visit ?? 1}/${rec.item}`);
      setCount(svg, rec.node, c.items.size ? `${c.items.size} item${c.items.size > 1 ? "s" : ""}` : `${c.visits.size}×`);
      nodeEl(rec.node)?.setAttribute("data-visits", String(c.visits.size));
      if (c.items.size) nodeEl(rec.node)?.setAttribute("data-items", String(c.items.size));
    }
    if (rec.type === "run.started") {
      nodeEl("START")?.setAttribute("data-state", "reached");
      inputPre.textContent = json(rec.input ?? {});
    }
    if ((rec.type === "node.completed" || rec.type === "node.visited" || rec.type === "node.failed") && rec.node && typeof rec.duration_ms === "number") {
      const t = timing.get(rec.node) || { visits: 0, total: 0, longest: 0 };
      t.visits += 1;
      t.total += rec.duration_ms;
      t.longest = Math.max(t.longest, rec.duration_ms);
      timing.set(rec.node, t);
      timingDirty = true;
    }
    if (rec.type === "run.waiting") {
      status.replaceChildren(badge("WAITING_APPROVAL"));
      if (rec.node) nodeEl(rec.node)?.setAttribute("data-state", "waiting");
    }
    if (TERMINAL[rec.type]) { finished = true; status.replaceChildren(badge(TERMINAL[rec.type])); showActions(TERMINAL[rec.type]); }
    if (rec.type === "run.completed") nodeEl("END")?.setAttribute("data-state", "reached");
    const full = h("pre", { class: "record", hidden: true }, json(rec));
    // (a record log format 2 implies has the seq of the record that implies it: marked)
    const row = h("tr", { dataset: { seq: String(rec.seq), type: rec.type, ...(rec.implied ? { implied: "true" } : {}) }, class: `rec rec-${rec.type.replace(".", "-")}` },
      h("td", { class: "num" }, String(rec.seq)),
      h("td", { title: when(rec.at) }, clock(rec.at)),
      h("td", {}, rec.type),
      h("td", {}, rec.node ?? ""),
      h("td", { class: "num" }, rec.duration_ms !== null && rec.duration_ms !== undefined ? `${rec.duration_ms} ms` : ""),
      h("td", {}, detail(rec), full));
    row.addEventListener("click", () => { full.hidden = !full.hidden; forkAt.value = String(rec.seq); stateAt.value = String(rec.seq); });
    // rows are added once per frame: a long run's records arrive by the thousand
    pendingRows.push(row);
    if (!rowFrame) rowFrame = requestAnimationFrame(flushRows);
  };

  // after new records: the run object again (debounced), and the inspector if they
  // concern what it shows -- a node's visits are read again at most twice a second
  let touched = false;
  let inspectTimer = null;
  let panelTimer = null;
  ctx.onStop(() => clearTimeout(panelTimer));
  const changed = (rec) => {
    refreshRun();
    if (!panelTimer) {
      panelTimer = setTimeout(() => {
        panelTimer = null;
        setTimes();
        if (timingDirty) { timingDirty = false; drawTiming(); }
      }, 100);
    }
    if (selected && (selected.edge !== undefined ? rec.edge === selected.edge : rec.node === selected.node)) touched = true;
    if (!touched || inspectTimer) return;
    inspectTimer = setTimeout(() => { inspectTimer = null; touched = false; inspect(); }, selected?.edge !== undefined ? 50 : 500);
  };
  ctx.onStop(() => clearTimeout(inspectTimer));

  // each record, then those log format 2 implies (``implies``: the edges the definition takes)
  const each = (rec) => { apply(rec); changed(rec); for (const r of rec.implies || []) { apply(r); changed(r); } };
  follow(`/api/runs/${encodeURIComponent(runId)}/events`, (event) => each(event.data), {
    signal: ctx.signal,
    finished: () => finished,
    onState: (s, error) => {
      streamState.textContent = { open: "live", reconnecting: "reconnecting…", closed: "finished", refused: "stream refused" }[s] || s;
      streamState.dataset.state = s;
      if (s === "refused" && error) put(problemBox(error));
    },
  });

  async function inspect() {
    const ticket = ++inspecting;
    if (selected?.edge !== undefined) {
      const edge = graph.edges[selected.edge];
      const decisions = records.filter((r) => (r.type === "edge.taken" || r.type === "edge.skipped") && r.edge === selected.edge && !beforeMigration(r));
      fill(side, h("h2", {}, `Edge ${selected.edge}`),
        h("p", {}, `${edge.from.join(", ")} → ${targets(edge).join(", ")}`),
        h("p", {}, h("code", {}, edgeCondition(edge))),
        decisions.length ? h("ol", { class: "decisions" }, decisions.map((r) => h("li", { dataset: { seq: String(r.seq) } },
          h("strong", {}, r.type === "edge.taken" ? "taken" : "not taken"), ` (record ${r.seq})`,
          r.reason ? h("div", { class: "reason" }, h("strong", {}, r.reason)) : null,
          r.expr ? h("div", {}, h("code", {}, r.expr), " → ", h("code", {}, JSON.stringify(r.value))) : null,
          r.to?.length ? h("div", {}, `to ${r.to.join(", ")}`) : null,
          r.arrived ? h("div", {}, `joined ${r.arrived.join(", ")}`) : null,
          r.reads ? h("table", { class: "reads" }, h("tbody", {}, Object.entries(r.reads).map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, h("pre", {}, json(v))))))) : null)))
          : h("p", { class: "muted" }, "not decided yet in this run"));
      return;
    }
    if (!selected?.node) return;
    const visits = await api(`/api/runs/${encodeURIComponent(runId)}/visits`, { signal: ctx.signal });
    if (ticket !== inspecting) return;
    const mine = visits.filter((v) => v.node === selected.node);
    const spec = graph.nodes.find((n) => n.name === selected.node) || {};
    const prices = spec.agent ? await pricesOnce() : {};
    if (ticket !== inspecting) return;
    fill(side, h("h2", {}, selected.node),
      h("p", { class: "muted" }, spec.call ? `call ${spec.call}` : spec.approval ? "approval gate" : spec.agent ? "agent" : spec.workflow ? `workflow ${spec.workflow}` : ""),
      mine.length > VISITS_SHOWN ? h("p", { class: "muted visits-cut" }, `the last ${VISITS_SHOWN} of ${mine.length} visits`) : null,
      mine.length ? mine.slice(-VISITS_SHOWN).map((v) => h("section", { class: "visit", dataset: { visit: String(v.visit), status: v.status } },
        h("h3", {}, `visit ${v.visit}${v.item !== null ? ` item ${v.item}` : ""} `, badge(v.status)),
        h("p", { class: "muted" }, [`${v.attempts} attempt(s)`, v.duration_ms !== null ? `${v.duration_ms.toFixed(1)} ms` : null, `${v.tokens} token(s)`, v.decision ? `decision: ${v.decision}` : null].filter(Boolean).join(" · ")),
        h("h4", {}, "input"), h("pre", { class: "visit-input" }, json(v.input)),
        v.update ? [h("h4", {}, "update"), h("pre", { class: "visit-update" }, json(v.update))] : null,
        v.error ? [h("h4", {}, "error"), h("pre", { class: "visit-error" }, json(v.error))] : null,
        spec.agent ? messagesView(records.filter((r) => r.node === selected.node && (r.visit ?? 1) === v.visit && (v.item === null || r.item === undefined || r.item === null || r.item === v.item)), prices) : null))
        : h("p", { class: "muted" }, "not run yet"));
  }
}

// -- an agent's conversation ---------------------------------------------------------

let pricesCache = null;
/** The price table (``GET /api/prices``, from INTERLOCK_PRICES): {} when none. */
function pricesOnce() {
  if (!pricesCache) pricesCache = api("/api/prices").catch(() => ({}));
  return pricesCache;
}

/** An agent call's cost in USD from ``usage`` and the table's price for ``model``
 * (per million tokens), or null when the table has no price for it. */
function costOf(usage, model, prices) {
  const price = model ? prices[model] : null;
  if (!price || !usage) return null;
  const prompt = usage.prompt_tokens ?? 0;
  const completion = usage.completion_tokens ?? 0;
  if (!prompt && !completion && usage.total_tokens) return null; // no split: no honest price
  return (prompt * (price.input ?? 0) + completion * (price.output ?? 0)) / 1e6;
}
const usd = (x) => `$${x < 0.01 ? x.toFixed(6) : x.toFixed(4)}`;

/** A visit's conversation from its records: system and user (the first request's
 * rendered prompt), each reply (text, tool calls, usage, cost), each tool's answer. */
function messagesView(recs, prices) {
  const items = [];
  let provider = null;
  let model = null;
  let tokens = 0;
  let cost = 0;
  let priced = false;
  const msg = (role, ...body) => h("li", { class: `msg msg-${role}`, dataset: { role } }, h("span", { class: "role" }, role), ...body);
  for (const r of recs) {
    if (r.type === "agent.request") {
      provider = r.provider ?? provider;
      model = r.model ?? model;
      if (r.system) items.push(msg("system", h("pre", {}, typeof r.system === "string" ? r.system : json(r.system))));
      if (r.prompt) items.push(msg("user", h("pre", {}, typeof r.prompt === "string" ? r.prompt : json(r.prompt))));
      if (r.repair) items.push(msg("user", h("span", { class: "muted" }, "repair: "), h("pre", {}, typeof r.repair === "string" ? r.repair : json(r.repair))));
    } else if (r.type === "agent.reply") {
      const u = r.usage || {};
      const t = u.total_tokens ?? ((u.prompt_tokens ?? 0) + (u.completion_tokens ?? 0));
      tokens += t;
      const c = costOf(u, r.model ?? model, prices);
      if (c !== null) { cost += c; priced = true; }
      items.push(msg("assistant",
        r.reply !== null && r.reply !== undefined ? h("pre", {}, typeof r.reply === "string" ? r.reply : json(r.reply)) : null,
        (r.tool_calls || []).map((call) => h("div", { class: "tool-call", dataset: { tool: call.name } }, "calls ", h("code", {}, call.name), " ", h("code", {}, short(call.arguments, 300)))),
        h("div", { class: "muted usage" }, [r.model ?? model, t ? `${t} token(s)` : null, u.prompt_tokens !== undefined ? `${u.prompt_tokens} in / ${u.completion_tokens ?? 0} out` : null, c !== null ? usd(c) : null, r.duration_ms !== undefined && r.duration_ms !== null ? `${r.duration_ms} ms` : null].filter(Boolean).join(" · "))));
    } else if (r.type === "tool.called" || r.type === "tool.rejected") {
      const answer = r.type === "tool.rejected" ? `rejected${r.comment ? `: ${r.comment}` : ""}`
        : r.error ? `${r.error.type}: ${r.error.message}` : r.problem ? `refused: ${r.problem}` : short(r.result, 2000);
      items.push(msg("tool", h("code", {}, r.tool ?? "?"), " → ", h("pre", {}, answer)));
    }
  }
  if (!items.length) return null;
  return h("section", { class: "messages" },
    h("h4", {}, "messages"),
    h("p", { class: "muted agent-facts" }, [provider ? `provider ${provider}` : null, model ? `model ${model}` : null, `${tokens} token(s)`,
      priced ? `cost ${usd(cost)}` : "cost: no price for this model (INTERLOCK_PRICES)"].filter(Boolean).join(" · ")),
    h("ol", { class: "conversation" }, items));
}

// -- approvals -----------------------------------------------------------------------

/** A waiting gate with its decision form. The patch (modify) and the data (an approval's
 * input: schema) are checked against what the server says the gate accepts before they
 * are sent; the server's refusal (problem+json) is shown as it is. */
function approvalCard(gate, me = null) {
  const out = h("div", { class: "result", "aria-live": "polite" });
  const comment = h("textarea", { class: "comment", rows: 2, placeholder: "comment (optional)", "aria-label": "comment" });
  const data = gate.input ? h("textarea", { class: "data", rows: 3, placeholder: `data (JSON) for ${short(gate.input, 200)}`, "aria-label": "data" }) : null;
  // an unknown outcome: approve runs the action AGAIN, or records the outcome checked by hand
  const outcome = gate.outcome ? outcomeField(gate.outcome) : null;
  const patch = gate.modify ? h("textarea", { class: "patch", rows: 3, placeholder: '{"field": "new value"}', "aria-label": "patch" }) : null;
  const at = gate.modify && gate.modify.at.length > 1
    ? h("select", { class: "at", "aria-label": "re-enter at" }, gate.modify.at.map((n) => h("option", { value: n }, n))) : null;
  const buttons = [];
  const send = async (decision) => {
    const body = { decision };
    if (comment.value.trim()) body.comment = comment.value.trim();
    const problems = [];
    if (decision === "modify") {
      const checked = checkJson(patch.value || "", gate.modify.patch_schema, "the patch");
      problems.push(...checked.problems);
      if (!problems.length && (typeof checked.value !== "object" || checked.value === null || Array.isArray(checked.value) || !Object.keys(checked.value).length)) {
        problems.push("the patch is a JSON object of the state fields to replace");
      }
      body.patch = checked.value;
      if (at) body.at = at.value;
    } else if (outcome && outcome.field.value.trim()) {
      const checked = outcome.check(decision);
      problems.push(...checked.problems);
      body.data = checked.value;
    } else if (data && !data.value.trim() && decision === "approve") {
      problems.push(`this gate asks for data with an approval: JSON that satisfies ${short(gate.input, 300)}`);
    } else if (data && data.value.trim()) {
      const checked = checkJson(data.value, gate.input, "the data");
      problems.push(...checked.problems);
      body.data = checked.value;
    }
    if (problems.length) {
      out.replaceChildren(h("div", { class: "problem local", role: "alert", "data-status": "local" },
        h("strong", {}, "Not sent"), ": ", problems.join("; ")));
      return;
    }
    buttons.forEach((b) => { b.disabled = true; });
    out.replaceChildren(h("p", { class: "muted" }, "sending…"));
    try {
      const run = await api(`/api/runs/${encodeURIComponent(gate.run_id)}/decisions`, { method: "POST", body: { ...body, node: gate.node, via: "dashboard", requested_at: gate.since } });
      card.dataset.decided = decision;
      out.replaceChildren(h("p", { class: "ok" }, `${decision} recorded; the run is ${run.status}`));
    } catch (error) {
      buttons.forEach((b) => { b.disabled = false; });
      out.replaceChildren(problemBox(error));
    }
  };
  const allowed = mayDecide(me);
  for (const d of allowed ? gate.decisions : []) {
    buttons.push(h("button", { type: "button", class: `decide decide-${d}`, "data-decision": d, onclick: () => send(d) }, outcome ? outcome.label(d) : d));
  }
  if (!allowed) {
    buttons.push(h("p", { class: "muted not-allowed" }, `${me.name} (${me.roles.join(", ")}) may not decide: an approver or an admin decides this gate`));
  }
  const card = h("article", { class: "card gate", dataset: { run: gate.run_id, node: gate.node } },
    h("h3", {}, link(runHref(gate.run_id), gate.run_id), ` · ${gate.workflow} · `, h("code", {}, gate.node), ` (${gate.kind || "approval"})`),
    h("p", { class: "muted" }, [`waiting since ${when(gate.since)}`, gate.deadline ? `deadline ${when(gate.deadline)}` : null,
      gate.approvers.length ? `approvers: ${gate.approvers.join(", ")}` : "any approver"].filter(Boolean).join(" · ")),
    Object.keys(gate.show).length ? h("dl", { class: "show" }, Object.entries(gate.outcome ? { ...gate.show, started_at: gate.outcome.started_at } : gate.show).map(([k, v]) => [h("dt", {}, k), h("dd", {}, shown(v))])) : null,
    outcome ? outcome.note : null,
    allowed ? comment : null,
    allowed && outcome ? h("label", {}, "the outcome checked by hand (approve records it, without running the action again) ", outcome.field) : null,
    allowed && data ? h("label", {}, "data for the gate's input schema ", data) : null,
    allowed && patch ? h("label", {}, "modify: the state fields to replace ", patch, at ? [" re-enter at ", at] : null) : null,
    h("div", { class: "buttons" }, buttons),
    out);
  return card;
}

/** Whether ``v`` is, or holds, a string of several lines. */
const hasLines = (v) => (typeof v === "string" ? v.includes("\n")
  : v !== null && typeof v === "object" && Object.values(v).some(hasLines));

/** A value a gate shows, for a person to read: JSON, but a string of several lines (a
 * diff, a report) as its text, preformatted (as text, never HTML), and a structure that
 * holds one as its fields (or items), each shown so. */
function shown(v) {
  if (typeof v === "string" && v.includes("\n")) return h("pre", { class: "text" }, v);
  if (!hasLines(v)) return h("pre", {}, json(v));
  if (Array.isArray(v)) return h("ol", { class: "fields", start: 0 }, v.map((item) => h("li", {}, shown(item))));
  return h("dl", { class: "fields" }, Object.entries(v).map(([k, item]) => [h("dt", {}, k), h("dd", {}, shown(item))]));
}

/** An ``unknown_outcome`` gate's part of its card (``info``: the approval row's
 * ``outcome``): a note saying the process died while the action ran, when it started,
 * its arguments and what each decision does; a field for the outcome checked by hand
 * (``{"result": ...}``), which an approve records instead of running the action again;
 * the buttons' labels, which say so as the field is filled in. */
function outcomeField(info) {
  const field = h("textarea", { class: "data outcome-data", rows: 2, placeholder: json(info.data_example), "aria-label": "outcome checked by hand" });
  const labels = [];
  const label = (d) => {
    const text = () => (d !== "approve" ? (d === "reject" ? "reject: it was not done" : d)
      : field.value.trim() ? "approve: record this outcome" : "approve: run it AGAIN");
    const span = h("span", {}, text());
    labels.push(() => { span.textContent = text(); });
    return span;
  };
  field.addEventListener("input", () => labels.forEach((f) => f()));
  const check = (decision) => {
    if (decision !== "approve") return { value: undefined, problems: ["the outcome checked by hand goes with approve; reject records the action as not done: empty the field"] };
    const checked = checkJson(field.value, { type: "object", required: ["result"] }, "the outcome");
    if (checked.problems.length || Object.keys(checked.value).length !== 1) {
      checked.problems.push(`the outcome checked by hand is {"result": ...} alone, e.g. ${json(info.data_example)}`);
    }
    return checked;
  };
  const note = h("div", { class: "outcome-unknown", role: "note" },
    h("strong", {}, `Outcome unknown: ${info.action}, started ${info.started_at}`),
    h("ul", {}, info.explain.map((line) => h("li", {}, line))));
  return { field, label, check, note };
}

/** Keep ``box`` showing one decision card per gate of ``gates`` (objects of
 * /api/approvals), each deciding its own ``node``: a new gate gets a card, a card stays
 * as it is (what was typed in it too) while its gate waits, and one whose gate waits no
 * more is marked and kept until dismissed (``mark``: the inbox) or dropped (a run's own
 * page, whose graph and timeline show the decision). ``cards``: the caller's Map, kept
 * between calls. */
function placeGates(box, cards, gates, me, mark) {
  const keys = new Set();
  for (const gate of gates) {
    const key = `${gate.run_id}\n${gate.node}\n${gate.since}`;
    keys.add(key);
    if (!cards.get(key)?.isConnected) {
      const card = approvalCard(gate, me);
      cards.set(key, card);
      box.append(card);
    }
  }
  for (const [key, card] of cards) {
    if (keys.has(key) || card.classList.contains("gone")) continue;
    if (!mark || !card.isConnected) {
      card.remove();
      cards.delete(key);
      continue;
    }
    // decided (here or elsewhere) or the run moved on: kept, marked, until dismissed
    card.classList.add("gone");
    card.querySelectorAll("button.decide").forEach((b) => { b.disabled = true; });
    card.append(h("p", { class: "muted gone-note" }, card.dataset.decided ? "decided" : "no longer waiting (decided elsewhere, or the run moved on) ",
      h("button", { type: "button", onclick: () => { card.remove(); cards.delete(key); } }, "dismiss")));
  }
}

/** A run's own gates in ``box`` (the run page's, a conversation's): the function returned
 * is called with each new run object, and shows a card per gate its ``waiting.pending``
 * lists (several gates wait at once in parallel branches, map items, child runs), each
 * deciding its own gate, in any order. */
function runGates(box, runId, signal) {
  const cards = new Map();
  let shown = null;
  return async (r) => {
    const w = r.waiting && r.waiting.kind !== "message" ? r.waiting : null;
    const pending = w ? (w.pending?.length ? w.pending : [w]) : [];
    const key = pending.map((g) => `${g.node}@${g.requested_at}`).join("\n");
    if (key === shown) return;
    shown = key;
    let gates = [];
    try {
      if (pending.length) gates = await api(`/api/approvals?run_id=${encodeURIComponent(runId)}`, { signal });
    } catch (error) {
      shown = null; // looked at again with the next run object
      throw error;
    }
    const me = await whoAmI();
    if (shown === key) placeGates(box, cards, gates, me, false);
  };
}

async function approvalsPage(ctx) {
  const only = new URLSearchParams(location.search).get("run_id");
  const list = h("div", { id: "inbox" });
  const error = h("div");
  const empty = h("p", { class: "muted", id: "inbox-empty" }, "Nothing is waiting for a decision.");
  put(h("h1", {}, "Approvals"),
    only ? h("p", {}, "Run ", h("code", {}, only), " only · ", link("/approvals", "all")) : null,
    error, list, empty);
  const cards = new Map();
  await every(ctx, POLL_MS, async () => {
    const me = await whoAmI();
    let gates;
    try {
      // (a run's own: a child run's gates are its parent's rows in the whole list)
      gates = await api(only ? `/api/approvals?run_id=${encodeURIComponent(only)}` : "/api/approvals",
        { signal: ctx.signal });
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 401)) error.replaceChildren(problemBox(e));
      throw e;
    }
    error.replaceChildren();
    const mine = only ? gates.filter((g) => g.run_id === only) : gates;
    placeGates(list, cards, mine, me, true);
    empty.hidden = mine.length > 0;
  });
}

async function inboxCount() {
  const count = document.getElementById("inbox-count");
  if (document.getElementById("token-form")) return;
  try {
    const gates = await api("/api/approvals");
    count.textContent = gates.length ? String(gates.length) : "";
  } catch { count.textContent = ""; }
}

// -- workflows -----------------------------------------------------------------------

async function workflowsPage(ctx) {
  const flows = await api("/api/workflows", { signal: ctx.signal });
  put(h("h1", {}, "Workflows"),
    flows.length ? h("table", {}, h("thead", {}, h("tr", {}, ["workflow", "description", "hash"].map((c) => h("th", {}, c)))),
      h("tbody", {}, flows.map((f) => h("tr", {}, h("td", {}, link(`/workflows/${encodeURIComponent(f.name)}`, f.name)), h("td", {}, f.description), h("td", {}, h("code", {}, f.hash.slice(0, 12)))))))
      : h("p", { class: "muted" }, "No workflow is registered: start the server with --workflows PATH."));
}

async function workflowPage(ctx, name) {
  const wf = await api(`/api/workflows/${encodeURIComponent(name)}`, { signal: ctx.signal });
  const g = wf.graph;
  put(h("h1", {}, "Workflow ", h("code", {}, wf.name)),
    h("p", {}, wf.description, " · ", link(`/?workflow=${encodeURIComponent(wf.name)}`, "its runs"), " · hash ", h("code", {}, wf.hash.slice(0, 12))),
    mayOperate(await whoAmI()) ? startForm(wf) : null,
    h("div", { class: "graph-box card" }, renderGraph(g)),
    h("h2", {}, "Nodes"),
    h("table", {}, h("thead", {}, h("tr", {}, ["node", "what", "reads", "writes"].map((c) => h("th", {}, c)))),
      h("tbody", {}, g.nodes.map((n) => h("tr", {}, h("td", {}, h("code", {}, n.name)),
        h("td", {}, n.call ? `call ${n.call}${n.confirm ? " (confirm)" : ""}` : n.approval ? "approval" : n.agent ? "agent" : n.workflow ? `workflow ${n.workflow}` : ""),
        h("td", {}, (n.reads || []).join(", ")), h("td", {}, (n.writes || []).join(", ")))))),
    h("h2", {}, "Edges"),
    h("table", {}, h("thead", {}, h("tr", {}, ["#", "from", "to", "condition"].map((c) => h("th", {}, c)))),
      h("tbody", {}, g.edges.map((e, i) => h("tr", {}, h("td", {}, String(i)), h("td", {}, e.from.join(", ")), h("td", {}, targets(e).join(", ")), h("td", {}, h("code", {}, edgeCondition(e))))))),
    h("details", {}, h("summary", {}, "Mermaid"), h("pre", {}, g.mermaid)));
}

/** The form that starts a run: one field per name of the workflow's ``input:`` (a
 * value that parses as JSON is sent as that, else as the text typed), the config (a
 * JSON object) and an optional run id. */
function startForm(wf) {
  const names = Array.isArray(wf.definition?.input) ? wf.definition.input : [];
  const fields = names.map((n) => [n, h("input", { type: "text", name: n, class: "input-field", "data-field": n, "aria-label": n, placeholder: "JSON or text" })]);
  const config = h("textarea", { id: "start-config", rows: 2, placeholder: "config (JSON object, optional)", "aria-label": "config" });
  const runId = h("input", { type: "text", id: "start-run-id", placeholder: "run id (optional)", "aria-label": "run id" });
  const out = h("div", { class: "result", "aria-live": "polite" });
  const button = h("button", { type: "submit", id: "start-run" }, "Start run");
  const form = h("form", { id: "start-form", class: "card" },
    h("h2", {}, "Start a run"),
    fields.length ? h("table", { class: "reads" }, h("tbody", {}, fields.map(([n, input]) => h("tr", {}, h("th", {}, h("label", {}, n)), h("td", {}, input)))))
      : h("p", { class: "muted" }, "This workflow declares no input: fields."),
    h("p", {}, config), h("p", {}, runId, " ", button), out);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = {};
    for (const [n, el] of fields) {
      if (el.value === "") continue;
      try { input[n] = JSON.parse(el.value); } catch { input[n] = el.value; }
    }
    const cfg = jsonObject(config.value, "the config");
    if (cfg instanceof Error) { out.replaceChildren(problemBox(cfg)); return; }
    const body = { input, config: cfg };
    if (runId.value.trim()) body.run_id = runId.value.trim();
    button.disabled = true;
    try {
      const r = await api(`/api/workflows/${encodeURIComponent(wf.name)}/runs`, { method: "POST", body });
      navigate(runHref(r.run_id));
    } catch (error) {
      out.replaceChildren(problemBox(error));
      button.disabled = false;
    }
  });
  return form;
}

// -- schedules and workers -------------------------------------------------------------

/** "in 3 min 05 s" / "12.0 s ago" from a Unix time. */
const fromNow = (t) => { const d = t - Date.now() / 1000; return d >= 0 ? `in ${span(d)}` : `${span(-d)} ago`; };

async function schedulesPage(ctx) {
  const tbody = h("tbody", { id: "schedules" });
  const note = h("p", { class: "muted", id: "schedules-note" });
  put(h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "The triggers of the workflows this server registered (it fires them); read again every 5 seconds."),
    h("table", {}, h("thead", {}, h("tr", {}, ["workflow", "trigger", "kind", "what", "input", "next fire (UTC)", "", "last run"].map((c) => h("th", {}, c)))), tbody), note);
  await every(ctx, 5000, async () => {
    const list = await api("/api/schedules", { signal: ctx.signal });
    tbody.replaceChildren(...list.map((t) => h("tr", { dataset: { workflow: t.workflow, trigger: t.id ?? "" } },
      h("td", {}, link(`/workflows/${encodeURIComponent(t.workflow)}`, t.workflow)),
      h("td", {}, h("code", {}, t.id ?? "")),
      h("td", {}, t.kind),
      h("td", {}, t.error ? h("span", { class: "problem" }, t.error) : h("code", {}, t.what ?? "")),
      h("td", {}, t.input ? h("code", {}, short(t.input)) : ""),
      h("td", { class: "next-fire", title: t.next ? when(t.next) : "" }, t.next_utc ?? ""),
      h("td", { class: "muted" }, t.next ? fromNow(t.next) : ""),
      h("td", { class: "last-run" }, t.last_run ? [link(runHref(t.last_run.run_id), t.last_run.run_id), " ", badge(t.last_run.status), " ", h("span", { class: "muted" }, when(t.last_run.created_at))] : h("span", { class: "muted" }, "never fired")))));
    note.textContent = list.length ? "" : "No registered workflow has triggers: (schedule:, every: or poll:).";
  });
}

async function workersPage(ctx) {
  const body = h("div", { id: "workers" });
  put(h("h1", {}, "Workers"),
    h("p", { class: "muted" }, "Who holds which run now (the store's claims: workers, servers, CLI runs), and each lease's time left; read again every 2 seconds. An expired lease's run may be taken over."),
    body);
  await every(ctx, 2000, async () => {
    const got = await api("/api/workers", { signal: ctx.signal });
    if (!got.workers.length) { body.replaceChildren(h("p", { class: "muted", id: "no-workers" }, "No run is held by anyone now.")); return; }
    body.replaceChildren(...got.workers.map((w) => h("section", { class: "card worker", dataset: { owner: w.owner } },
      h("h2", {}, h("code", {}, w.owner), " ", w.gone ? h("span", { class: "badge status-failed" }, "process gone") : null,
        h("span", { class: "muted" }, ` ${w.runs.length} run(s)`)),
      h("table", {}, h("thead", {}, h("tr", {}, ["run", "workflow", "status", "lease until", "lease"].map((c) => h("th", {}, c)))),
        h("tbody", {}, w.runs.map((r) => h("tr", { dataset: { run: r.run_id } },
          h("td", {}, link(runHref(r.run_id), r.run_id)), h("td", {}, r.workflow), h("td", {}, badge(r.status)),
          h("td", {}, r.lease_until ? when(r.lease_until) : "—"),
          h("td", { class: "lease-left" }, r.lease_left === null ? "no lease" : r.lease_left >= 0 ? `${span(r.lease_left)} left` : `expired ${span(-r.lease_left)} ago`))))))));
  });
}

// -- start ---------------------------------------------------------------------------

showWho();
render();
setInterval(inboxCount, 3000);
inboxCount();
