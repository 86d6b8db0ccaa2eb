// The API from the page: JSON requests with the token, problem+json errors, and the
// event stream read with fetch (so it carries the Authorization header like every
// other request: the token never appears in a URL, where access logs would keep it).

const TOKEN_KEY = "interlock.token";

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/** A refused request: the server's problem+json (status, title, detail). */
export class ApiError extends Error {
  constructor(status, title, detail) {
    super(`${status} ${title}: ${detail}`);
    this.status = status;
    this.title = title;
    this.detail = detail;
  }
}

/** The headers of a request, and the token they carry (null: none). */
function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const t = token.get();
  if (t) out.Authorization = `Bearer ${t}`;
  return [out, t];
}

/** The ApiError of a refused answer. A 401 tells the page (``interlock:unauthorized``)
 * with the token the request was SENT with: a late 401 for a token already replaced
 * (a slow request from before the user typed a new one) must not clear the new one. */
async function problemOf(res, sent) {
  let title = res.statusText || "Error";
  let detail = "";
  try {
    const body = await res.json();
    title = typeof body.title === "string" ? body.title : title;
    detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body);
  } catch {
    detail = "(the answer was not problem+json)";
  }
  const error = new ApiError(res.status, title, detail);
  if (res.status === 401) {
    window.dispatchEvent(new CustomEvent("interlock:unauthorized", { detail: { token: sent ?? null } }));
  }
  return error;
}

/** GET (or ``method``) ``path``; the parsed JSON answer, or an ApiError. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const [sent, t] = headers();
  const init = { method, signal, cache: "no-store", headers: sent };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (!res.ok) throw await problemOf(res, t);
  return res.json();
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});

/**
 * Follow an SSE endpoint: ``onEvent({type, id, data})`` for each event (data parsed as
 * JSON). Reconnects after an error or an early close with ``Last-Event-ID`` (the last id
 * seen), so no record is missed or repeated; stops when ``signal`` aborts, on a 401, 403
 * or 404, or when the server closes the stream and ``finished()`` says it is done.
 * ``onState(state, error)``: "open", "reconnecting", "closed", "refused".
 */
export function follow(path, onEvent, { signal, finished = () => true, onState = () => {} }) {
  let lastId = null;
  (async () => {
    let delay = 250;
    while (!signal.aborted) {
      try {
        const extra = { Accept: "text/event-stream" };
        if (lastId !== null) extra["Last-Event-ID"] = lastId;
        const [sent, t] = headers(extra);
        const res = await fetch(path, { headers: sent, signal, cache: "no-store" });
        if (!res.ok) {
          const error = await problemOf(res, t);
          if ([401, 403, 404].includes(res.status)) { onState("refused", error); return; }
          throw error;
        }
        onState("open");
        delay = 250;
        await readEvents(res.body, (event) => {
          if (event.id !== null) lastId = event.id;
          onEvent(event);
        });
        if (finished()) { onState("closed"); return; }
        onState("reconnecting");
      } catch (error) {
        if (signal.aborted) return;
        onState("reconnecting", error);
        await sleep(delay, signal);
        delay = Math.min(delay * 2, 3000);
      }
    }
  })();
}

// The event-stream format (WHATWG HTML, "server-sent events"): lines of "field: value",
// an event ends at an empty line, lines starting with ":" are comments (keepalives).
async function readEvents(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "message", id: null, data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      let line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (event.data.length) {
          dispatch({ type: event.type, id: event.id, data: JSON.parse(event.data.join("\n")) });
        }
        event = { type: "message", id: null, data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "event") event.type = text;
      else if (field === "data") event.data.push(text);
      else if (field === "id") event.id = text;
    }
  }
}
