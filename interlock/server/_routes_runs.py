"""The runs endpoints: the runs list, a run, its graph, visits, records and live events,
resume and cancel."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

import interlock
from interlock.support import (
    TERMINAL_TYPES,
    MigrationRefused,
    RunRow,
    export_run,
    load_run,
    migrate_run,
    node_visits,
    parse_definition,
    run_json,
    trace_pages,
)

from ._deps import Existing, Operator, Reader, Srv, _plain
from ._guard import Problemed
from ._models import (
    CancelIn,
    ForkIn,
    Graph,
    MigrateIn,
    MigrationOut,
    Record,
    ResumeIn,
    RunObject,
    RunPage,
    VerificationOut,
    Visit,
)
from ._reads import CURSOR, BadCursor, cursor_key, page_cursor, records_body
from ._routes_workflows import graph_off_loop
from ._service import Server, refuse_unkeyed_resume

TERMINAL_STATUSES = frozenset(TERMINAL_TYPES.values())

router = APIRouter()


async def _last_event_id(last_event_id: Annotated[str | None, Header()] = None
                         ) -> int | None:
    """The seq a reconnecting stream saw last (refused before the stream starts)."""
    seen = (last_event_id or "").strip()
    if not seen:
        return None
    if not (seen.isascii() and seen.isdigit() and len(seen) <= 18):
        raise Problemed(400, "Bad Request", f"Last-Event-ID must be the seq of an event of "
                        f"this stream (ASCII digits), got {seen[:40]!r}")
    return int(seen)


@router.get("/api/runs", response_model=RunPage)
async def runs(server: Srv, who: Reader, status: str | None = None,
               workflow: str | None = None,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               cursor: Annotated[str | None, Query(max_length=1200,
                                                   pattern=CURSOR)] = None,
               q: Annotated[str | None, Query(max_length=200)] = None,
               input: Annotated[str | None, Query(max_length=1000,
                                                  pattern=r"^[^=]+=[\s\S]*$")] = None,
               since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
               until: Annotated[float | None, Query(ge=0, le=1e11)] = None
               ) -> dict[str, object]:
    """One page: the runs after ``cursor`` (the ``next`` of the page before), newest
    first; a run created meanwhile shifts no page (keyset paging). A search narrows
    it: ``q`` (a part of the run id), ``input`` (``field=value``: the input's field
    equal to the value read as JSON, or as the text), ``since``/``until`` (created
    between these Unix times)."""
    try:
        before = cursor_key(cursor) if cursor else None
    except BadCursor:
        raise Problemed(400, "Bad Request", "the cursor is not one this server gave: "
                        "pass a page's next as it is, or no cursor for the first "
                        "page") from None
    if not _plain(status or "") or not _plain(workflow or ""):
        return {"runs": [], "next": None}  # no run has such a name (the store is spared)
    if q or input or since is not None or until is not None:
        return await _search(server, status=status and status.upper(), workflow=workflow,
                             limit=limit, before=before, q=q or "", field=input,
                             since=since, until=until)
    rows = await server.st.list_page(status=status and status.upper(),
                                     workflow=workflow, limit=limit + 1, before=before)
    page = rows[:limit]
    return {"runs": [run_json(r) for r in page],
            "next": page_cursor(page[-1]) if len(rows) > limit else None}


SEARCH_SCAN = 2000  # runs a search reads per page at most (then `next` goes on from there)
_BATCH = 200
_ABSENT = object()


async def _search(server: Server, *, status: str | None, workflow: str | None, limit: int,
                  before: tuple[float, str] | None, q: str, field: str | None,
                  since: float | None, until: float | None) -> dict[str, object]:
    """A searched page, from the store's pages newest first, filtered here: no store
    has an index on an input's fields, so a search reads at most `SEARCH_SCAN` runs
    per page (an input field costs one read of each candidate's row) and says so."""
    name, want_text, want = "", "", _ABSENT
    if field is not None:
        name, eq, want_text = field.partition("=")
        if not eq or not name:
            raise Problemed(400, "Bad Request", f"input={field[:80]!r}: search an input field "
                            "as FIELD=VALUE, e.g. input=ticket=INC-7 or input=n=4")
        try:
            want = orjson.loads(want_text)
        except orjson.JSONDecodeError:
            want = _ABSENT
    if not _plain(q) or not _plain(status or "") or not _plain(workflow or ""):
        return {"runs": [], "next": None, "scanned": 0}
    if until is not None and (before is None or before[0] > until):
        before = (until, "\U0010ffff")  # newest first: start at the range's end
    found: list[RunRow] = []
    scanned, ended, last = 0, False, None
    while not ended and len(found) <= limit and scanned < SEARCH_SCAN:
        rows = await server.st.list_page(status=status, workflow=workflow, limit=_BATCH,
                                         before=before)
        ended = len(rows) < _BATCH
        for row in rows:
            scanned += 1
            before, last = (row.created_at, row.run_id), row
            if since is not None and row.created_at < since:
                ended = True  # older than the range: so is every run after it
                break
            if q and q not in row.run_id:
                continue
            if field is not None:
                value = (await server.st.get_run(row.run_id)).input.get(name, _ABSENT)
                if value is _ABSENT or not (value == want or (isinstance(value, str)
                                                               and value == want_text)):
                    continue
            found.append(row)
            if len(found) > limit or scanned >= SEARCH_SCAN:
                break
    page = found[:limit]
    if len(found) > limit:
        nxt: str | None = page_cursor(page[-1])
    elif not ended and last is not None:
        nxt = page_cursor(last)  # the scan's budget ran out: go on from where it stopped
    else:
        nxt = None
    return {"runs": [run_json(r) for r in page], "next": nxt, "scanned": scanned}

@router.get("/api/runs/{run_id}", response_model=RunObject)
async def run(run_id: str, server: Srv, who: Reader) -> dict[str, object]:
    return await server.run_object(run_id)

# run -> (its row's created_at, the seq its log was read up to, its last run.migrated):
# a run's log is read once for its migrations, then only the records appended since
_MIGRATED: weakref.WeakKeyDictionary[Server, OrderedDict[
    str, tuple[float, int, dict[str, Any] | None]]] = weakref.WeakKeyDictionary()
_MIGRATED_KEPT = 1024  # runs remembered per server (the least recently drawn forgotten)


async def _last_migration(server: Server, row: RunRow) -> dict[str, Any] | None:
    """The run's last ``run.migrated`` record, or None. Only the records after the ones
    read for an earlier request are read (by type, not decoded unless a migration): a
    run's graph is asked for at every visit of its page, its log may be long."""
    kept = _MIGRATED.setdefault(server, OrderedDict())
    known = kept.pop(row.run_id, None)
    if known is not None and known[0] == row.created_at and known[1] <= row.summary.last_seq:
        _, seen, last = known
    else:  # never read, or another run under that id since (deleted, created again)
        seen, last = 0, None
    async for entries in server.st.iter_entries(row.run_id, after=seen):
        for entry in entries:
            if entry.type == "run.migrated":  # (interlock._log.RUN_MIGRATED)
                last = entry.record()
            seen = max(seen, entry.seq)
    kept[row.run_id] = (row.created_at, seen, last)
    while len(kept) > _MIGRATED_KEPT:
        kept.popitem(last=False)
    return last


@router.get("/api/runs/{run_id}/graph", response_model=Graph)
async def run_graph(run_id: str, server: Srv, row: Existing) -> Graph:
    """The graph of the definition the run is on (a run keeps it, whatever is registered
    now): the one it started with, or the one its last ``run.migrated`` moved it onto
    (then ``migrated`` says so). Edge ``i`` is the ``edge: i`` of its edge records --
    after the migration only: the records before it number the old definition's edges."""
    moved = await _last_migration(server, row)
    if moved is None or not isinstance(moved.get("definition"), dict):
        return await graph_off_loop(parse_definition(row.definition))
    graph = await graph_off_loop(parse_definition(moved["definition"]))
    graph.migrated = {k: moved.get(k) for k in ("seq", "from_hash", "to_hash", "by",
                                                "at_node")}
    return graph

@router.get("/api/runs/{run_id}/visits", response_model=list[Visit])
async def run_visits(run_id: str, server: Srv, who: Reader) -> Response:
    """Each node visit: its input (the state it read when it started, from the
    fold), update, error, tokens and duration. (The fold gives the event loop back
    every few hundred records, and the answer is not validated again: a long run's
    visits do not stall the other requests.)"""
    return Response(orjson.dumps(await node_visits(run_id, store=server.st,
                                                   share_loop=True)),
                    media_type="application/json")

@router.get("/api/runs/{run_id}/verify", response_model=VerificationOut)
async def verify(run_id: str, server: Srv, row: Existing) -> dict[str, object]:
    """`interlock verify` of the run (and its child runs) in the server's store, with
    the server's INTERLOCK_LOG_KEY: ``interlock verify RUN_ID --server URL``. A log
    that is not keyed, on a server with a key, is checked as a plain chain (the server
    cannot unset its key): intact, it is not ok, with ``seq`` null and the records
    counted. (The check reads and checks a few hundred records at a time, giving the
    event loop back between them: a long log does not stall the other requests and
    streams.)"""
    return dataclasses.asdict(await interlock.verify(run_id, store=server.st, plain=True,
                                                     share_loop=True))

@router.get("/api/runs/{run_id}/export", response_class=StreamingResponse,
            responses={200: {"content": {"application/jsonl": {}},
                             "description": "the run as `interlock export` writes it: a "
                                            "header line (its definition and summary, "
                                            "with the last chain hash), then every "
                                            "record as stored, then each child run the "
                                            "same way -- for `interlock verify --file`"}})
async def export(run_id: str, server: Srv, row: Existing) -> StreamingResponse:
    """``interlock export RUN_ID --server URL``: evidence an auditor checks with no store
    and no server (`interlock verify --file`, with the key where the log is keyed).
    Streamed a page of records at a time: a long log is never held whole."""
    return StreamingResponse(export_run(run_id, store=server.st),
                             media_type="application/jsonl")

@router.get("/api/runs/{run_id}/state",
            responses={200: {"description": "`{run_id, seq, status, state, input}`: the "
                                            "fold of the records 1..seq (the state as it "
                                            "stood just after record `seq`)"}})
async def state_at(run_id: str, server: Srv, row: Existing,
                   at: Annotated[int | None, Query(ge=1)] = None) -> Response:
    """The run's state as it stood after record ``at`` (default: the last): the fold
    of its records up to there, as ``interlock fork --at`` would start from."""
    last = row.summary.last_seq
    if at is not None and at > last:
        raise Problemed(422, "Unprocessable Content", f"run {run_id} has records "
                        f"1..{last}; there is no state at record {at}")
    loaded = await load_run(server.st, run_id, upto=at if at is not None else last)
    view = loaded.view
    body = {"run_id": run_id, "seq": view.seq, "status": view.status,
            "state": view.state, "input": row.input}
    return Response(orjson.dumps(body, default=str), media_type="application/json")

@router.get("/api/runs/{run_id}/records", response_class=StreamingResponse,
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

@router.get("/api/runs/{run_id}/events", response_class=EventSourceResponse,
         responses={200: {"description": "one event per log record: event = its type, "
                                         "id = its seq, data = the record (JSON)"}})
async def events(run_id: str, server: Srv, row: Existing,
                 after: Annotated[int | None, Query(ge=0)] = None,
                 seen: Annotated[int | None, Depends(_last_event_id)] = None
                 ) -> AsyncIterator[ServerSentEvent]:
    seq = seen if seen is not None else after or 0
    async for event in follow(server, run_id, seq):
        yield event

@router.post("/api/runs/{run_id}/resume", response_model=RunObject)
async def resume(run_id: str, server: Srv, who: Operator,
                 body: ResumeIn) -> dict[str, object]:
    row = await server.st.get_run(run_id)
    await refuse_unkeyed_resume(server, run_id)  # (409)
    config = body.config or None
    async with server.lock(run_id):
        try:
            await server.launch(
                f"resume of run {run_id}", run_id, row.workflow,
                lambda listen, st: interlock.resume(
                    run_id, store=st, config=config,
                    workflow=server.workflows.get(row.workflow), listener=listen,
                    detach=server.records_only))
        except interlock.UsageError as exc:
            # a run that ended is no request's mistake: the run's state conflicts (as
            # a decision on it does)
            if (await server.st.get_run(run_id)).summary.status in _ENDED:
                raise Problemed(409, "Conflict", str(exc)) from None
            raise
    return await server.run_object(run_id)

_ENDED = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})

@router.post("/api/runs/{run_id}/fork", response_model=RunObject, status_code=201)
async def fork(run_id: str, server: Srv, who: Operator, body: ForkIn) -> dict[str, object]:
    """A new run from the state at record ``at`` of this one (as ``interlock fork``):
    records 1..at copied, then ``run.forked`` with the patch; the original is not
    touched. Executed by this server (a server with ``--workers 0`` refuses: fork
    with the CLI, where the code is)."""
    row = await server.st.get_run(run_id)
    if server.records_only:
        raise Problemed(409, "Conflict", "this server executes no runs (--workers 0): fork "
                        f"run {run_id} with `interlock fork {run_id} --at {body.at}` where "
                        "the workflow's code is")
    if body.at > row.summary.last_seq:
        raise Problemed(422, "Unprocessable Content", f"run {run_id} has records "
                        f"1..{row.summary.last_seq}; cannot fork at {body.at}")
    server.refuse_unkeyed(row.workflow, "the fork was not started")  # (409)
    new_id = body.run_id or interlock.make_run_id()
    if await _exists(server, new_id):
        raise Problemed(409, "Conflict", f"a run with id {new_id!r} already exists; "
                        "choose another run_id")
    config = body.config or None
    try:
        await server.launch(
            f"fork of run {run_id} at {body.at}", new_id, row.workflow,
            lambda listen, st: interlock.fork(
                run_id, body.at, store=st, config=config, patch=body.patch,
                new_run_id=new_id, workflow=server.workflows.get(row.workflow),
                listener=listen))
    except interlock.UsageError as exc:
        raise Problemed(422, "Unprocessable Content", f"cannot fork run {run_id} at "
                        f"{body.at}: {exc}") from None
    return await server.run_object(new_id)


async def _exists(server: Server, run_id: str) -> bool:
    try:
        await server.st.get_run(run_id)
    except interlock.RunNotFound:
        return False
    return True


@router.post("/api/runs/{run_id}/migrate", response_model=MigrationOut)
async def migrate(run_id: str, server: Srv, who: Operator,
                  body: MigrateIn) -> dict[str, object]:
    """Move a waiting, failed or pending run onto another definition, as
    ``interlock migrate`` does: nothing is executed; refused (409) with every reason,
    nothing recorded."""
    row = await server.st.get_run(run_id)
    if body.definition is not None:
        try:
            spec = interlock.load(body.definition).spec
        except interlock.WorkflowError as exc:
            raise Problemed(422, "Unprocessable Content", "the definition is not a valid "
                            "workflow: " + "; ".join(str(d) for d in exc.diagnostics)) from None
    else:
        registered = server.workflows.get(row.workflow)
        if registered is None:
            raise Problemed(409, "Conflict", f"this server has no workflow {row.workflow!r} "
                            "registered (--workflows): send the definition to migrate onto")
        spec = registered.spec
    by = who.name if who.authenticated else (body.by or "local")
    async with server.lock(run_id):
        try:
            found = await migrate_run(run_id, spec, store=server.st, at=body.at, by=by,
                                      comment=body.comment, dry_run=body.dry_run)
        except MigrationRefused as exc:  # (its findings too, as `interlock migrate` prints)
            raise Problemed(409, "Conflict", str(exc),
                            extra={"migration": exc.migration.to_json()}) from None
    if found.recorded is not None:
        server.hub.changed(run_id)
    return found.to_json()


@router.post("/api/runs/{run_id}/cancel", response_model=RunObject)
async def cancel(run_id: str, server: Srv, who: Operator,
                 body: CancelIn) -> dict[str, object]:
    """The body is ``{}``, sent as JSON: a page of another site cannot send that
    without asking first (see `Guard`)."""
    async with server.lock(run_id):
        result = await interlock.cancel(run_id, by=who.name, store=server.st)
    return result.to_json()


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
    with server.polls.following(run_id, seq) as me, server.hub.tokens(run_id) as pieces:
        while True:
            waiter = server.hub.waiter(run_id)  # before reading: a commit after it wakes us
            last_type = None
            # a reply as it streams: an event of its own, not a record, sent once the
            # records committed before it are (each piece carries the seq of the last)
            while pieces and pieces[0][0] <= seq:
                yield ServerSentEvent(event="chat.token", data=pieces.popleft()[1])
            async for page in trace_pages(run_id, store=server.st, after=seq):
                for rec in page:
                    while pieces and pieces[0][0] < rec["seq"]:  # (streamed before it)
                        yield ServerSentEvent(event="chat.token", data=pieces.popleft()[1])
                    yield ServerSentEvent(event=rec["type"], id=str(rec["seq"]), data=rec)
                    seq, last_type = rec["seq"], rec["type"]
                    ended = ended or last_type in TERMINAL_TYPES
            while pieces and pieces[0][0] <= seq:
                yield ServerSentEvent(event="chat.token", data=pieces.popleft()[1])
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

