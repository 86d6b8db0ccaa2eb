// Conversations: the runs of chat: workflows, listed apart from workflow runs,
// and a conversation's page -- its transcript from the run's event stream (messages,
// replies, tool calls folded, child runs linked), each model reply growing as its
// chat.token events arrive, a message box (POST /api/runs/{id}/messages) and a child run's gate decided in
// place, through the parent. Everything from a run is put in the page as text.
//
// app.js passes its helpers as ``kit``: h, put, link, badge, when, short, problemBox,
// approvalCard, runGates, whoAmI, every, api, ApiError, follow.

const TERMINAL = { "run.completed": "COMPLETED", "run.failed": "FAILED", "run.rejected": "REJECTED",
  "run.cancelled": "CANCELLED" };

export const conversationHref = (id) => `/conversations/${encodeURIComponent(id)}`;

/** Whether ``me`` may send a message (operator or admin; the server checks it again). */
const maySend = (me) => !me || me.roles.includes("operator") || me.roles.includes("admin");

export async function conversationsPage(ctx, kit) {
  const { h, put, link, badge, when, short, problemBox, api, ApiError, every } = kit;
  const tbody = h("tbody", { id: "conversations" });
  const footer = h("p", { class: "muted", id: "conversations-footer" });
  const error = h("div");
  put(h("h1", {}, "Conversations"),
    h("p", { class: "muted" }, "The runs of conversation workflows (", h("code", {}, "chat:"),
      "); the other runs are under ", link("/", "Runs"), ". ",
      h("span", { class: "live", title: "refreshed every second" }, "live")),
    error,
    h("table", { class: "runs" }, h("thead", {}, h("tr", {},
      ["conversation", "workflow", "status", "last reply", "tokens", "created", "updated"].map((c) => h("th", {}, c)))), tbody),
    footer);
  const flows = await api("/api/workflows", { signal: ctx.signal });
  const chats = flows.filter((f) => f.kind === "chat").map((f) => f.name);
  await every(ctx, 1000, async () => {
    let rows = [];
    try {
      for (const name of chats) {
        const page = await api(`/api/runs?${new URLSearchParams({ workflow: name, limit: "100" })}`, { signal: ctx.signal });
        rows.push(...page.runs);
      }
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 401)) error.replaceChildren(problemBox(e));
      throw e;
    }
    error.replaceChildren();
    rows = rows.sort((a, b) => String(b.created_at).localeCompare(String(a.created_at))).slice(0, 100);
    tbody.replaceChildren(...rows.map((r) => h("tr", { dataset: { run: r.run_id } },
      h("td", {}, link(conversationHref(r.run_id), r.run_id)),
      h("td", {}, link(`/workflows/${encodeURIComponent(r.workflow)}`, r.workflow)),
      h("td", {}, badge(r.status)),
      h("td", {}, short(r.waiting?.show?.last_reply ?? "", 80)),
      h("td", { class: "num" }, String(r.tokens)),
      h("td", {}, when(r.created_at)),
      h("td", {}, when(r.updated_at)))));
    footer.textContent = !chats.length ? "No conversation workflow is registered (a file with chat: AGENT_NODE)."
      : rows.length ? `${rows.length} conversation(s), newest first` : "no conversations yet";
  });
}

export async function conversationPage(ctx, runId, kit) {
  const { h, put, link, badge, short, problemBox, runGates, whoAmI, api, follow } = kit;
  const enc = encodeURIComponent(runId);
  const run = await api(`/api/runs/${enc}`, { signal: ctx.signal });
  const me = await whoAmI();
  const status = h("span", { id: "chat-status" }, badge(run.status));
  const streamState = h("span", { id: "stream-state", class: "live" }, "connecting");
  const transcript = h("ol", { id: "transcript", class: "transcript", "aria-live": "polite" });
  const gateBox = h("div", { id: "chat-gate" });
  const text = h("textarea", { id: "message-text", rows: 2, placeholder: "Your message (/end ends the conversation)", "aria-label": "message" });
  const sendButton = h("button", { type: "submit", id: "message-send" }, "Send");
  const sent = h("div", { class: "result", id: "message-result" });
  const form = h("form", { id: "message-form", class: "card message-form" }, text, sendButton, sent);
  let finished = false;
  let status_ = run.status;
  put(h("h1", {}, "Conversation ", h("code", {}, runId), " ", status),
    h("p", {}, "workflow ", link(`/workflows/${encodeURIComponent(run.workflow)}`, run.workflow), " · ",
      link(`/runs/${enc}`, "as a run (graph, timeline)"), " · ", streamState),
    transcript, gateBox,
    maySend(me) ? form : h("p", { class: "muted not-allowed" }, `${me.name} (${me.roles.join(", ")}) may not send messages: an operator or an admin does`));

  const setStatus = (s) => {
    status_ = s;
    status.replaceChildren(badge(s));
    const open = s === "WAITING_INPUT";
    text.disabled = !open;
    sendButton.disabled = !open;
    form.dataset.open = String(open);
  };
  setStatus(run.status);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = text.value.trim();
    if (!message || status_ !== "WAITING_INPUT") return;
    sendButton.disabled = true;
    sent.replaceChildren(h("p", { class: "muted" }, "sending…"));
    try {
      const before = looks;
      const r = await api(`/api/runs/${enc}/messages`, { method: "POST", body: { text: message } });
      text.value = "";
      sent.replaceChildren();
      // (the stream may have told of the turn's gate or reply first: that status stands)
      if (looks === before && !finished) setStatus(r.status === "WAITING_INPUT" ? "RUNNING" : r.status);
    } catch (error) {
      sendButton.disabled = false;
      sent.replaceChildren(problemBox(error));
    }
  });

  // the transcript: one <li> per message and model reply, in the stream's order (the
  // server sends a model call's chat.token pieces after its agent.request and before its
  // agent.reply); a reply that also calls tools ("let me look") is shown, its tool
  // calls folded below it
  let chatNode = null;  // the conversation's agent node (its chat.message records')
  let growing = null;   // the model call's reply being streamed (chat.token)
  let growingTurn = null; // that model call (the pieces' and agent.reply's `turn`)
  let said = null;      // the turn's last model reply shown: the chat.reply it is takes it
  let tools = null;     // the tool calls since that reply, folded
  const reply = (streaming) => {
    const li = h("li", { class: streaming ? "msg assistant streaming" : "msg assistant", dataset: { role: "assistant" } },
      h("div", { class: "who" }, "assistant"), h("div", { class: "text" }));
    transcript.append(li);
    tools = null;  // this reply's tool calls go below it
    return li;
  };
  const settle = (text) => {  // the streamed model call ended: its text as recorded
    growing.classList.remove("streaming");
    if (typeof text === "string" && text) growing.querySelector(".text").replaceChildren(text);
    said = growing;
    growing = growingTurn = null;
  };
  const toolsOf = () => {
    if (!tools) {
      tools = h("details", { class: "tools" }, h("summary", {}, "tool calls"));
      transcript.append(h("li", { class: "msg tool-calls", dataset: { role: "tools" } }, tools));
    }
    return tools;
  };

  const showGates = runGates(gateBox, runId, ctx.signal); // a card per waiting gate
  // a look at the run after a record that may change its gates: the last look wins (an
  // earlier one answered late does not undo it), and a look that fails is tried again --
  // the run may wait with no record after it to look once more
  let looks = 0;
  const showGate = async () => {
    const mine = ++looks;
    for (let attempt = 0; ; attempt++) {
      try {
        const r = await api(`/api/runs/${enc}`, { signal: ctx.signal });
        if (mine !== looks) return;
        setStatus(r.status);
        await showGates(r);
        return;
      } catch (error) {
        if (ctx.signal.aborted || mine !== looks || attempt >= 5) throw error;
        await new Promise((ok) => setTimeout(ok, 200 * 2 ** attempt));
      }
    }
  };

  const apply = (event) => {
    const rec = event.data;
    if (event.type === "chat.token") {
      if (rec.run_id && rec.run_id !== runId) return;  // a child run's agent
      if (growing && growingTurn !== rec.turn) settle(null);  // the next model call's
      if (!growing) {
        growing = reply(true);
        growingTurn = rec.turn;
      }
      growing.querySelector(".text").append(String(rec.text ?? ""));
      return;
    }
    switch (rec.type) {
      case "chat.message": {
        tools = said = null;
        chatNode = rec.node ?? chatNode;
        const li = h("li", { class: "msg user", dataset: { role: "user", seq: String(rec.seq) } },
          h("div", { class: "who" }, rec.by ? `user · ${rec.by}` : "user"), h("div", { class: "text" }, String(rec.text ?? "")));
        if (growing) growing.before(li);  // (pieces before their message: kept below it)
        else transcript.append(li);
        break;
      }
      case "agent.reply": {
        if (rec.agent_tool || (rec.run_id && rec.run_id !== runId)) break;  // another agent's
        if (growing && growingTurn === rec.turn) settle(rec.reply);
        else if (!growing && rec.node === chatNode && rec.reply && rec.tool_calls?.length) {  // not streamed
          said = reply(false);
          said.querySelector(".text").append(String(rec.reply));
        }
        break;
      }
      case "chat.reply": {
        // a turn that failed on a limit of its own: its error is its reply
        const text = rec.turn_error ? `the turn failed: ${rec.turn_error}` : String(rec.reply ?? "");
        let li = growing;  // (streamed, its agent.reply not seen)
        if (li) li.classList.remove("streaming");
        else if (said && said.querySelector(".text").textContent === text) li = said;
        else li = reply(false);
        li.dataset.seq = String(rec.seq);
        li.querySelector(".text").replaceChildren(text);
        growing = growingTurn = said = tools = null;
        chatNode = rec.node ?? chatNode;
        break;
      }
      case "tool.called": case "tool.rejected": {
        if (rec.tool === "end_conversation") break;
        const out = rec.type === "tool.rejected" ? "rejected" : rec.result ?? rec.error ?? rec.problem;
        const box = toolsOf();
        box.append(h("div", { class: "tool", dataset: { tool: String(rec.tool) } },
          h("code", {}, `${rec.tool}(${short(rec.arguments ?? {}, 200)})`), " → ", h("pre", {}, JSON.stringify(out, null, 2))));
        box.querySelector("summary").textContent = `tool calls (${box.querySelectorAll(".tool").length})`;
        break;
      }
      case "child.started":
        toolsOf().append(h("div", { class: "child", dataset: { child: rec.run_id } }, "child run ",
          link(`/runs/${encodeURIComponent(rec.run_id)}`, rec.run_id), ` (${rec.workflow})`));
        break;
      case "approval.requested":
        if (rec.kind !== "message") transcript.append(h("li", { class: "msg gate-note muted" },
          `waiting for a decision at ${rec.path ?? rec.node}`));
        break;
      case "approval.decided":
        if (rec.kind !== "message") transcript.append(h("li", { class: "msg gate-note muted" },
          `${rec.path ?? rec.node}: ${rec.decision} by ${rec.by ?? "?"}`));
        break;
      default:
        break;
    }
    if (rec.type === "run.waiting" || rec.type === "run.resumed" || rec.type === "approval.decided") {
      showGate().catch(() => {});
    }
    if (TERMINAL[rec.type]) {
      finished = true;
      setStatus(TERMINAL[rec.type]);
      gateBox.replaceChildren();
    }
  };

  follow(`/api/runs/${enc}/events`, apply, {
    signal: ctx.signal,
    finished: () => finished,
    onState: (s, error) => {
      streamState.textContent = { open: "live", reconnecting: "reconnecting…", closed: "finished", refused: "stream refused" }[s] || s;
      streamState.dataset.state = s;
      if (s === "refused" && error) put(problemBox(error));
    },
  });
}
