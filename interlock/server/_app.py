"""The FastAPI application: SPEC §8's endpoints over one store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException

import interlock
from interlock import (
    ClaimError,
    ConflictError,
    Decision,
    LogError,
    RunExists,
    RunNotFound,
    StoreError,
    UsageError,
    Workflow,
)
from interlock.support import (
    METRICS_CONTENT_TYPE,
    TERMINAL_TYPES,
    Firer,
    Metrics,
    RunRow,
    RunView,
    approvers_refuse,
    limits,
    load_workflows,
    node_visits,
    parse_definition,
    redact,
    run_json,
    to_mermaid,
    trace_pages,
)

from . import _dashboard as dashboard
from ._auth import DECIDE, LOCAL, OPERATE, READ, Identity, Tokens
from ._hub import Hub, NotifyingStore
from ._loops import RunLoops
from ._models import (
    Approval,
    DecisionIn,
    Graph,
    Health,
    Me,
    Problem,
    Record,
    ResumeIn,
    RunObject,
    RunPage,
    StartRun,
    Visit,
    WorkflowDetail,
    WorkflowInfo,
)
from ._notify import Notifier
from ._pool import Draining, Pool
from ._reads import (
    CURSOR,
    Approvals,
    BadCursor,
    Polls,
    cursor_key,
    page_cursor,
    records_body,
)

log = logging.getLogger("interlock.server")

PROBLEM = "application/problem+json"
BODY_SLACK = 64 * 1024  # a body's bytes beyond the input it carries (config, names)
TERMINAL_STATUSES = frozenset(TERMINAL_TYPES.values())


@dataclass
class ServerOptions:
    """What ``interlock serve`` takes (see `create_app`)."""

    store: str | None = None  # a URL; None: $INTERLOCK_STORE, then ./.interlock/runs.db
    workflows: Sequence[str] = ()  # files, or folders of *.yaml / *.yml / *.json
    auth: str | None = None  # the --auth YAML file
    notify: Sequence[str] = ()  # webhook URLs told of every approval.requested
    public_url: str = "http://127.0.0.1:8765"  # where the inbox link points
    workers: int = 4  # executions at a time; 0: record only, `interlock worker` executes
    poll: float = 0.25  # seconds between reads of a followed run written elsewhere
    keepalive: float = 15.0  # seconds between SSE keepalive comments
    drain: float = 10.0  # seconds a stopping server waits for its executions
    notify_attempts: int = 5
    notify_backoff: float = 0.5
    notify_scan: float = 2.0  # seconds between looks for gates requested elsewhere
    take_over: bool = True  # continue runs whose process is gone, on start


class Problemed(Exception):
    def __init__(self, status: int, title: str, detail: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.headers = status, title, detail, headers


def problem(status: int, title: str, detail: str,
            headers: dict[str, str] | None = None) -> JSONResponse:
    body = Problem(title=title, status=status, detail=detail).model_dump()
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


_PROBLEMS = {400: {"model": Problem, "description": "a malformed request, or refused"},
             401: {"model": Problem, "description": "no valid token"},
             403: {"model": Problem, "description": "the token's role or approvers: refuse"},
             404: {"model": Problem, "description": "no such run or workflow"},
             409: {"model": Problem, "description": "the run's state refuses it (or its "
                                                    "stored log is broken)"},
             413: {"model": Problem, "description": "the body is larger than is read"},
             422: {"model": Problem, "description": "the body does not fit its schema"}}
for _status, _doc in _PROBLEMS.items():
    _doc["content"] = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}


class Server:
    """What the endpoints share: the store, the workflows, the pool, the notifier."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.workflows = load_workflows(options.workflows)
        self.tokens = Tokens.load(options.auth) if options.auth else None
        self.hub = Hub()
        self.store: NotifyingStore | None = None
        self.pool: Pool | None = None
        self.notifier: Notifier | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._firing: asyncio.Task[None] | None = None  # the triggers' firer
        self.metrics = Metrics()  # the runs it executes observed; the store's read per scrape
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.loops: RunLoops | None = None  # where runs execute (None: on the API's loop)
        self._api: asyncio.AbstractEventLoop | None = None  # the API's loop
        self.approvals = Approvals()  # the inbox, kept per run at its last seq
        self.polls: Polls | None = None  # one poll per followed run (`follow`)

    @contextlib.asynccontextmanager
    async def lock(self, run_id: str) -> AsyncIterator[None]:
        """One change of a run's log at a time from this server (a decision, a note)."""
        lock, users = self._locks.setdefault(run_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[run_id]

    @property
    def st(self) -> NotifyingStore:
        assert self.store is not None, "the server has not started"
        return self.store

    @property
    def records_only(self) -> bool:
        """``--workers 0``: starts, decisions and resumes are recorded (the run PENDING)
        for workers to execute."""
        return self.options.workers == 0

    @property
    def runs(self) -> Pool:
        assert self.pool is not None, "the server has not started"
        return self.pool

    async def start(self) -> None:
        self._api = asyncio.get_running_loop()
        self.store = NotifyingStore(interlock.open_store(self.options.store), self.hub)
        if not self.records_only and not self.store.url.startswith("memory:"):
            # node bodies off the API's loop (a memory store is this loop's alone); a
            # SQLite store serves every loop, a PostgreSQL one is opened per loop
            shared = self.store.inner if self.store.url.startswith("sqlite:") else None
            self.loops = RunLoops(self.store.url, self.hub, shared=shared,
                                  stop_wait=max(self.options.drain, 1.0))
        self.pool = Pool(self.store, self.hub, self.options.workers, self.loops)
        self.polls = Polls(lambda: self.st, self.hub, self.options.poll,
                           self.runs.executing)
        self.notifier = Notifier(list(self.options.notify), self.options.public_url,
                                 self.store, self.hub, self.lock,
                                 attempts=self.options.notify_attempts,
                                 backoff=self.options.notify_backoff)
        if self.options.take_over and self.records_only:
            log.info("--workers 0: this server executes no run; `interlock worker` "
                     "processes on its store do")
        elif self.options.take_over:
            await self.pool.take_over(self.store, self.resumer)
        if self.options.notify:
            self._watcher = asyncio.get_running_loop().create_task(
                self.notifier.watch(self.options.notify_scan))
        timed = {name: wf.spec for name, wf in self.workflows.items() if wf.spec.triggers}
        if timed:  # the registered workflows' triggers: fired here (see `fire`)
            self._firing = asyncio.get_running_loop().create_task(
                Firer(timed, self.fire, self.st.inner).run(self.hub.stopping))

    async def begin(self, workflow: str, data: dict[str, Any], run_id: str | None = None,
                    config: dict[str, Any] | None = None) -> interlock.RunResult:
        """Start a run of a registered workflow, as an API start or a trigger does:
        executed here (in the pool), or recorded PENDING with ``--workers 0``; the run
        as it stands now. `RunExists` when a run has that id."""
        wf = self.workflows[workflow]
        if self.records_only:
            pending = await wf.submit(data, store=self.st, run_id=run_id, config=config)
            self.hub.changed(pending.run_id)
            return pending
        started = await wf.start(data, store=self.st, run_id=run_id, config=config)
        listener = self.listener(workflow, started.run_id)
        self.runs.submit_job(f"run {started.run_id}", started.run_id,
                             lambda st: started.execute(listener=listener, store=st))
        return started.result

    async def fire(self, workflow: str, run_id: str, data: dict[str, Any]) -> None:
        """A trigger's run (`Firer`'s start): `begin` under the slot's id."""
        await self.begin(workflow, data, run_id)

    async def stop(self) -> None:
        self.hub.stopping.set()
        if self._firing is not None:
            self._firing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._firing
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self.polls is not None:
            await self.polls.close()
        if self.pool is not None:
            await self.pool.drain(self.options.drain)
        if self.loops is not None:
            await self.loops.close(max(self.options.drain, 1.0))
        if self.notifier is not None:
            await self.notifier.close()
        if self.store is not None:
            await self.store.close()

    def listener(self, workflow: str, run_id: str) -> Any:
        """What an execution in the server reports each record to: the notifier."""
        notifier = self.notifier
        observe = self.metrics.observe  # (thread-safe: prometheus_client's)
        api = self._api

        def listen(rec: dict[str, Any], view: RunView) -> None:
            observe(rec, view)
            if rec["type"] == "approval.requested" and notifier is not None:
                if api is None or _on(api):
                    notifier.requested(workflow, run_id, rec)
                else:  # from a run loop: the notifier lives on the API's
                    api.call_soon_threadsafe(notifier.requested, workflow, run_id, rec)

        return listen

    async def launch(self, what: str, run_id: str, workflow: str,
                     call: Callable[[Any, Any], Awaitable[Any]]) -> None:
        """Execute ``call(listener, store)`` in the pool and return once its first record
        is committed (a decision, a resume): its refusals are raised here."""
        first: list[int] = []
        base = self.listener(workflow, run_id)

        def listen(rec: dict[str, Any], view: RunView) -> None:
            if not first:
                first.append(rec["seq"])
            base(rec, view)

        if self.records_only:  # recorded here and now, executed by a worker
            await call(listen, self.st)
            self.hub.changed(run_id)
            return
        task = self.runs.submit_job(what, run_id, lambda st: call(listen, st))
        await self.runs.accepted(run_id, task, first)

    def resumer(self, run_id: str) -> Any:
        """The execution that continues a run (a takeover)."""

        async def go(st: Any) -> interlock.RunResult:
            row = await st.get_run(run_id)
            return await interlock.resume(run_id, store=st,
                                          workflow=self.workflows.get(row.workflow),
                                          listener=self.listener(row.workflow, run_id))
        return self.runs.execution(run_id, go)

    def identify(self, authorization: str | None) -> Identity:
        if self.tokens is None:
            return LOCAL
        challenge = {"WWW-Authenticate": 'Bearer realm="interlock"'}
        scheme, _, token = (authorization or "").partition(" ")
        if not authorization or scheme.lower() != "bearer" or not token.strip():
            raise Problemed(401, "Unauthorized", "this server requires a token: send "
                            "'Authorization: Bearer <token>' (interlock --token / "
                            "$INTERLOCK_TOKEN)", challenge)
        who = self.tokens.identify(token.strip())
        if who is None:
            raise Problemed(401, "Unauthorized", "the token is not one this server knows "
                            "(its --auth file lists the SHA-256 digests of the valid ones)",
                            challenge)
        return who

    async def run_object(self, run_id: str) -> dict[str, Any]:
        return (await interlock.status(run_id, store=self.st)).to_json()


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _need(what: str) -> Any:
    async def dep(request: Request,
                  authorization: Annotated[str | None, Header()] = None) -> Identity:
        server: Server = request.app.state.interlock
        who = server.identify(authorization)
        if not who.may(what):
            verb = {READ: "read", OPERATE: "start, resume or cancel runs",
                    DECIDE: "decide approvals"}[what]
            needs = {READ: "any role", OPERATE: "operator or admin",
                     DECIDE: "approver or admin"}[what]
            raise Problemed(403, "Forbidden", f"{who.name} (roles: {', '.join(who.roles)}) "
                            f"may not {verb}: that needs the role {needs}")
        return who
    return Depends(dep)


Reader = Annotated[Identity, _need(READ)]
Operator = Annotated[Identity, _need(OPERATE)]
Approver = Annotated[Identity, _need(DECIDE)]


def _server(request: Request) -> Server:
    server: Server = request.app.state.interlock
    return server


Srv = Annotated[Server, Depends(_server)]


async def _existing(run_id: str, server: Srv, who: Reader) -> RunRow:
    """The run's row (404 before an event stream starts)."""
    return await server.st.get_run(run_id)


Existing = Annotated[RunRow, Depends(_existing)]


def create_app(options: ServerOptions | None = None, **kwargs: Any) -> FastAPI:
    """The API as an ASGI app (``options``, or `ServerOptions` fields as keywords).

    Workflows and the auth file are read here (a mistake raises `interlock.UsageError`
    before anything listens); the store is opened, and interrupted runs taken over,
    when the app starts (its lifespan).
    """
    opts = options or ServerOptions(**kwargs)
    server = Server(opts)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="interlock", version=interlock.__version__, lifespan=lifespan,
                  description="Runs, their logs, live events and approvals (SPEC §8).",
                  responses=_PROBLEMS)  # type: ignore[arg-type]
    app.state.interlock = server

    @app.middleware("http")
    async def _bounded(request: Request, call_next: Any) -> Any:
        # a body is read whole before it is checked: refuse one that says it is too big
        # (the input inside it is bounded again by the engine, INTERLOCK_MAX_INPUT_BYTES)
        size = request.headers.get("content-length")
        limit = limits.INPUT_BYTES.get() + BODY_SLACK
        if size is not None and size.isdigit() and int(size) > limit:
            return problem(413, "Content Too Large", f"the request body is {size} bytes; "
                           f"at most {limit} are read ({limits.INPUT_BYTES.env} bounds a "
                           "run's input)")
        return await call_next(request)

    _handlers(app)
    _routes(app)
    return app


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(Problemed)
    async def _problemed(request: Request, exc: Problemed) -> JSONResponse:
        return problem(exc.status, exc.title, exc.detail, exc.headers)

    @app.exception_handler(RunNotFound)
    async def _not_found(request: Request, exc: RunNotFound) -> JSONResponse:
        return problem(404, "Not Found", str(exc))

    @app.exception_handler(UsageError)
    async def _usage(request: Request, exc: UsageError) -> JSONResponse:
        return problem(400, "Bad Request", str(exc))

    @app.exception_handler(LogError)
    async def _broken(request: Request, exc: LogError) -> JSONResponse:
        # the store's data was changed (a broken chain, a definition that no longer
        # matches its hash): not the caller's mistake (never 400), not a race to retry
        log.error("%s %s refused: %s", request.method, request.url.path, exc)
        return problem(409, "Conflict", str(exc))

    @app.exception_handler(StoreError)
    async def _store(request: Request, exc: StoreError) -> JSONResponse:
        if isinstance(exc, ClaimError | ConflictError | RunExists):
            return problem(409, "Conflict", str(exc))
        return problem(503, "Service Unavailable", str(exc))

    @app.exception_handler(Draining)
    async def _draining(request: Request, exc: Draining) -> JSONResponse:
        return problem(503, "Service Unavailable", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ()))
            parts.append(f"{where}: {e.get('msg')}")
        return problem(422, "Unprocessable Content",
                       "the request does not fit the API: " + "; ".join(parts))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return problem(exc.status_code, _title(exc.status_code), str(exc.detail),
                       dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem(500, "Internal Server Error",
                       f"the server failed: {type(exc).__name__}: {exc} (see its log)")


def _title(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _workflow(server: Server, name: str) -> Workflow:
    wf = server.workflows.get(name)
    if wf is None:
        known = ", ".join(sorted(server.workflows)) or "none (start the server with --workflows)"
        raise Problemed(404, "Not Found", f"no workflow {name!r} is registered; registered: "
                        f"{known}")
    return wf


def graph_of(spec: Any) -> Graph:
    """A definition's graph as the API shows it: nodes, edges (in order), Mermaid."""
    nodes = [{"name": n, **ns.model_dump(mode="json", exclude_none=True,
                                          exclude_defaults=True)}
             for n, ns in spec.nodes.items()]
    edges = [e.model_dump(mode="json", by_alias=True, exclude_none=True,
                          exclude_defaults=True) for e in spec.edges]
    return Graph(nodes=nodes, edges=edges, mermaid=to_mermaid(spec))


def _routes(app: FastAPI) -> None:  # noqa: C901 - one closure per endpoint
    @app.get("/api/health", response_model=Health)
    async def health(server: Srv) -> dict[str, Any]:
        return {"status": "ok", "store": redact(server.st.url),
                "version": interlock.__version__, "workflows": len(server.workflows),
                "workers": server.options.workers, "running": server.runs.running}

    @app.get("/api/me", response_model=Me)
    async def me(who: Reader) -> dict[str, Any]:
        """Who the request's token is (``local`` without --auth): what the dashboard
        shows, and so the page knows a token is needed (401)."""
        return {"name": who.name, "roles": list(who.roles),
                "authenticated": who.authenticated}

    @app.get("/api/workflows", response_model=list[WorkflowInfo])
    async def workflows(server: Srv, who: Reader) -> list[dict[str, Any]]:
        return [{"name": n, "description": wf.spec.description or "",
                 "hash": wf.definition_hash()} for n, wf in sorted(server.workflows.items())]

    @app.get("/api/workflows/{name}", response_model=WorkflowDetail)
    async def workflow(name: str, server: Srv, who: Reader) -> dict[str, Any]:
        wf = _workflow(server, name)
        return {"name": name, "description": wf.spec.description or "",
                "hash": wf.definition_hash(), "definition": wf.definition(),
                "graph": graph_of(wf.spec)}

    @app.post("/api/workflows/{name}/runs", response_model=RunObject, status_code=201,
              responses={200: {"model": RunObject,
                               "description": "the run_id exists with the same workflow "
                                              "and input: that run"}})
    async def start(name: str, body: StartRun, response: Response, server: Srv,
                    who: Operator) -> dict[str, Any]:
        wf = _workflow(server, name)
        try:
            return (await server.begin(name, body.input, body.run_id,
                                       body.config or None)).to_json()
        except RunExists:
            assert body.run_id is not None
            row = await server.st.get_run(body.run_id)
            same = (row.workflow == name and row.definition_hash == wf.definition_hash()
                    and row.input == body.input
                    and (row.options.get("config") or {}) == body.config)
            if not same:
                raise Problemed(409, "Conflict", f"a run with id {body.run_id!r} already "
                                "exists with another workflow, input or config; choose "
                                "another run_id") from None
            response.status_code = 200
            return await server.run_object(body.run_id)

    @app.get("/api/runs", response_model=RunPage)
    async def runs(server: Srv, who: Reader, status: str | None = None,
                   workflow: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   cursor: Annotated[str | None, Query(max_length=1200,
                                                       pattern=CURSOR)] = None
                   ) -> dict[str, Any]:
        """One page: the runs after ``cursor`` (the ``next`` of the page before), newest
        first; a run created meanwhile shifts no page (keyset paging)."""
        try:
            before = cursor_key(cursor) if cursor else None
        except BadCursor:
            raise Problemed(400, "Bad Request", "the cursor is not one this server gave: "
                            "pass a page's next as it is, or no cursor for the first "
                            "page") from None
        rows = await server.st.list_page(status=status and status.upper(),
                                         workflow=workflow, limit=limit + 1, before=before)
        page = rows[:limit]
        return {"runs": [run_json(r) for r in page],
                "next": page_cursor(page[-1]) if len(rows) > limit else None}

    @app.get("/api/runs/{run_id}", response_model=RunObject)
    async def run(run_id: str, server: Srv, who: Reader) -> dict[str, Any]:
        return await server.run_object(run_id)

    @app.get("/api/runs/{run_id}/graph", response_model=Graph)
    async def run_graph(run_id: str, server: Srv, row: Existing) -> Graph:
        """The graph of the definition the run started with (a run keeps it, whatever
        is registered now): edge ``i`` is the ``edge: i`` of its edge records."""
        return graph_of(parse_definition(row.definition))

    @app.get("/api/runs/{run_id}/visits", response_model=list[Visit])
    async def run_visits(run_id: str, server: Srv, who: Reader) -> Response:
        """Each node visit: its input (the state it read when it started, from the
        fold), update, error, tokens and duration. (The fold gives the event loop back
        every few hundred records, and the answer is not validated again: a long run's
        visits do not stall the other requests.)"""
        return Response(orjson.dumps(await node_visits(run_id, store=server.st,
                                                       share_loop=True)),
                        media_type="application/json")

    @app.get("/api/runs/{run_id}/records", response_class=StreamingResponse,
             responses={200: {"model": list[Record],
                              "content": {"application/json": {}},
                              "description": "the records, as `interlock trace --json`: "
                                             "all of them after `after`, or at most "
                                             "`limit` (then `X-Next-After` names the "
                                             "`after` of the next page, when there may "
                                             "be one)"}})
    async def records(run_id: str, server: Srv, row: Existing,
                      after: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int | None, Query(ge=1, le=100_000)] = None
                      ) -> StreamingResponse:
        # sent as the store gives them (not through the model: its keys, in trace's
        # order), streamed a page at a time: a long log is never held whole
        headers = {}
        if limit is not None and row.summary.last_seq - after > limit:
            headers["X-Next-After"] = str(after + limit)
        return StreamingResponse(records_body(run_id, server.st, after, limit),
                                 media_type="application/json", headers=headers)

    @app.get("/api/runs/{run_id}/events", response_class=EventSourceResponse,
             responses={200: {"description": "one event per log record: event = its type, "
                                             "id = its seq, data = the record (JSON)"}})
    async def events(run_id: str, server: Srv, row: Existing,
                     after: Annotated[int | None, Query(ge=0)] = None,
                     last_event_id: Annotated[str | None, Header()] = None
                     ) -> AsyncIterator[ServerSentEvent]:
        seq = after or 0
        if last_event_id is not None and last_event_id.strip().isdigit():
            seq = int(last_event_id.strip())
        async for event in follow(server, run_id, seq):
            yield event

    @app.post("/api/runs/{run_id}/decisions", response_model=RunObject)
    async def decide(run_id: str, body: DecisionIn, server: Srv,
                     who: Approver) -> dict[str, Any]:
        row = await server.st.get_run(run_id)
        by = who.name if who.authenticated else (body.by or "local")
        roles = who.roles if who.authenticated else ()
        if body.decision == "modify":
            if not body.patch:
                raise UsageError("modify takes a non-empty JSON object of state fields to "
                                 "replace (patch)")
        elif body.patch is not None or body.at is not None:
            raise UsageError(f"patch and at go with modify, not {body.decision}")
        waiting = row.summary.waiting or {}
        gate = body.node or waiting.get("node")
        if row.summary.status == "WAITING_APPROVAL" and gate:
            spec = parse_definition(row.definition)
            if gate in spec.nodes:
                refused = approvers_refuse(spec, gate, by, roles)
                if refused is not None:
                    raise Problemed(403, "Forbidden", refused)
        decision = Decision(body.decision, by, body.comment, dict(body.patch or {}), body.at,
                            body.node, data=body.data, roles=tuple(roles))
        async with server.lock(run_id):
            try:
                await server.launch(
                    f"decision on run {run_id}", run_id, row.workflow,
                    lambda listen, st: interlock.resume(
                        run_id, decision, store=st,
                        workflow=server.workflows.get(row.workflow), listener=listen,
                        detach=server.records_only))
            except UsageError as exc:
                status = (await server.st.get_run(run_id)).summary.status
                if status != "WAITING_APPROVAL":
                    raise Problemed(409, "Conflict", str(exc)) from None
                raise
        return await server.run_object(run_id)

    @app.post("/api/runs/{run_id}/resume", response_model=RunObject)
    async def resume(run_id: str, server: Srv, who: Operator,
                     body: ResumeIn | None = None) -> dict[str, Any]:
        row = await server.st.get_run(run_id)
        config = (body.config if body else None) or None
        async with server.lock(run_id):
            await server.launch(
                f"resume of run {run_id}", run_id, row.workflow,
                lambda listen, st: interlock.resume(
                    run_id, store=st, config=config,
                    workflow=server.workflows.get(row.workflow), listener=listen,
                    detach=server.records_only))
        return await server.run_object(run_id)

    @app.post("/api/runs/{run_id}/cancel", response_model=RunObject)
    async def cancel(run_id: str, server: Srv, who: Operator) -> dict[str, Any]:
        async with server.lock(run_id):
            result = await interlock.cancel(run_id, by=who.name, store=server.st)
        return result.to_json()

    @app.get("/api/approvals", response_model=list[Approval])
    async def approvals(server: Srv, who: Reader) -> Response:
        """The gates waiting for a decision, from the waiting runs' summaries (each
        approval object kept per run at its last seq: no fold per request; sent as it
        is kept, not validated again)."""
        return Response(orjson.dumps(await server.approvals.list(server.st)),
                        media_type="application/json")

    @app.get("/metrics", response_class=Response, include_in_schema=False)
    async def metrics(server: Srv, who: Reader) -> Response:
        """Prometheus's text format: the store's runs and pending approvals (read now),
        and the node attempts, durations and tokens of the runs this server executed."""
        await server.metrics.refresh(server.st)
        return Response(server.metrics.text(), media_type=METRICS_CONTENT_TYPE)

    dashboard.mount(app)


async def follow(server: Server, run_id: str, seq: int) -> AsyncIterator[ServerSentEvent]:
    """The run's records after ``seq`` as events, then each new one as it is committed,
    until the run's final record. Woken by this server's own commits (`Hub`); records
    written by other processes are found by one poll of the store per run every
    ``poll`` seconds, shared by all its streams (`Polls`) -- none while this server
    executes the run (then every commit wakes us)."""
    opts = server.options
    assert server.polls is not None, "the server has not started"
    next_keepalive = time.monotonic() + opts.keepalive
    first, ended = True, False
    with server.polls.following(run_id, seq) as me:
        while True:
            waiter = server.hub.waiter(run_id)  # before reading: a commit after it wakes us
            last_type = None
            async for page in trace_pages(run_id, store=server.st, after=seq):
                for rec in page:
                    yield ServerSentEvent(event=rec["type"], id=str(rec["seq"]), data=rec)
                    seq, last_type = rec["seq"], rec["type"]
                    ended = ended or last_type in TERMINAL_TYPES
            if last_type in TERMINAL_TYPES:
                return
            if last_type is None and (first or ended):  # nothing after seq: has it ended?
                summary = (await server.st.get_run(run_id)).summary
                if summary.status in TERMINAL_STATUSES and summary.last_seq <= seq:
                    return
            first = False
            if server.hub.stopping.is_set():
                return
            now = time.monotonic()
            if now >= next_keepalive:
                yield ServerSentEvent(comment="keepalive")
                next_keepalive = now + opts.keepalive
            me.seq = seq  # what the shared poll looks after
            await server.hub.wait(waiter, max(next_keepalive - now, 0.0))


__all__ = ["ServerOptions", "create_app", "follow", "load_workflows", "redact"]
