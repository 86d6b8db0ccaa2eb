"""Executing a stored run: claim, commit, run the executor in the caller's task under a
watcher (lease, cancellation requests, a lost claim), release -- `drive`, `start`,
`continue_claimed` -- and the child runs the executor gives its sub-workflow nodes
(`_Children`, the `_subflow.ChildRuns` port).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .. import _log as L
from .._definition._digest import code_digests
from .._definition._model import DEFAULT_STEPS, WorkflowSpec
from .._definition._plan import Plan
from .._engine._context import CLAIM_GUARD
from .._engine._fold import RunResult, RunView, result_of
from .._engine._gates import running_beside
from .._engine._journal import Journal
from .._engine._runner import Runner, Stop
from .._engine._steps import Steps
from .._errors import (
    ClaimLost,
    ConflictError,
    LogError,
    RunNotFound,
    UsageError,
)
from .._json import JSONObject
from .._observe._otel import RunSpans, run_spans, tracing, with_spans
from .._plugins._subflow import CHILD_RUNS, ChildOutcome, ChildRequest
from .._store import Claim, RunRow, Store, Summary
from ._cancel import cancel
from ._children import _unblocked
from ._claims import LEASE_SECONDS, make_owner
from ._code import check_code
from ._load import RESUMABLE, TERMINAL_STATUSES, Functions, chain_options, definition_hash, load_run
from ._orphans import Closing, close_children
from ._watcher import _Watcher

log = logging.getLogger("interlock")

Listener = Callable[[L.Record, RunView], None]

def child_listener(listener: Listener | None, run_id: str, workflow: str
                   ) -> Listener | None:
    """The listener of a child run (a sub-workflow node's): what the parent's listener's
    ``child(run_id, workflow)`` gives, if it has that method (the CLI's progress shows a
    child's records as they are committed, under its parent's node); else none."""
    make = getattr(listener, "child", None)
    return make(run_id, workflow) if callable(make) else None


async def drive(plan: Plan, store: Store, run_id: str, view: RunView, writer: L.LogWriter, *,
                first: list[tuple[str, dict[str, object]]] | None = None, force: bool = False,
                listener: Listener | None = None, owner: str | None = None,
                fresh: bool = False, lease: float = LEASE_SECONDS,
                stop: Stop | None = None, execute: bool = True,
                generation: int | None = None) -> RunResult:
    """Claim the run, commit ``first`` (e.g. ``run.resumed``), execute, release.

    ``owner``: the run was created claimed by it (`Workflow.run`), or claimed by a
    worker, so there is no claim to make; ``generation`` is that claim's. The last
    append (the run's end) gives the lease up in its transaction; the release here is
    for a run that stops otherwise (waiting, an error of the store). Every append is
    made under the claim (owner and generation, where the store fences appends): once
    another owner has claimed the run, the store refuses them and this raises
    `ClaimLost` -- the run moved to another owner; nothing more of this one is stored.

    ``fresh``: ``view`` and ``writer`` were made a while ago (a run created, then
    queued for execution, as a server does): once claimed, the stored log must still end
    where the writer does, or nothing runs (`ConflictError`) -- a run cancelled while it
    was queued must not start its first node.

    The executor runs in the caller's task (`_execute`); a `_Watcher` keeps the lease
    (``lease`` seconds) alive and looks for a cancellation requested through the store
    (by `cancel`, from any process). ``stop``: once set, the run stops at the next node
    boundary and is released unfinished (`Runner.stop`). ``execute`` false: commit
    ``first`` and release (a decision recorded for a worker to continue).

    A stored log continued (``first`` given) has its code compared with what it started
    with (`_code.check_code`): a ``run.code_changed`` follows its first record, or, under
    ``--strict-code``, `CodeChanged` is raised before anything is claimed or recorded.
    """
    if first:
        first = await _code_checked(store, run_id, plan, view, first, owner)
    if owner is None:
        owner = make_owner()
        generation = await store.claim(run_id, owner, lease, force=force)
    claim = Claim(owner, generation) if generation is not None else None
    closing = Closing(plan, listener)  # (the child runs whose gates it closes)
    journal = Journal(store, run_id, view, writer, closing.listener, owner=owner, claim=claim)
    runner = Runner(plan, journal, run_id, view)
    runner.stop = stop
    runner.offers = lambda: store.decisions(run_id)
    try:
        if fresh and (await store.get_run(run_id)).summary.last_seq != writer.seq:
            raise ConflictError(f"run {run_id!r} changed before it started executing (it was "
                                "cancelled or taken over while queued); it is not started")
        if first:
            await _commit_first(journal, run_id, first)
        if execute and view.status not in TERMINAL_STATUSES:
            await _execute(store, run_id, owner, runner, listener, lease, journal.claim)
    except BaseException as exc:
        if not journal.released:
            await _let_go(store, run_id, owner, exc)
        raise
    if not journal.released:
        await store.release(run_id, owner)
    await close_children(store, run_id, view, plan, closed=closing.children)
    return result_of(run_id, plan.spec.workflow, view)


async def _code_checked(store: Store, run_id: str, plan: Plan, view: RunView,
                        first: list[tuple[str, dict[str, object]]], owner: str | None
                        ) -> list[tuple[str, dict[str, object]]]:
    """``first`` with the code check's records (`check_code`) after its first record: a
    fork's run.forked stays right after its copy. A refusal gives a worker's claim
    (``owner``) back untouched."""
    try:
        return [first[0], *await check_code(store, run_id, plan, view), *first[1:]]
    except BaseException:
        if owner is not None:
            await store.release(run_id, owner)
        raise


async def _commit_first(journal: Journal, run_id: str,
                        first: list[tuple[str, dict[str, object]]]) -> None:
    """`drive`'s ``first`` records (``run.resumed``, a decision) committed under the claim."""
    try:
        await journal.commit(first)
    except ConflictError:
        # read, decided, then claimed after another process had decided (or
        # resumed) the run and let it go: what this one read is stale (a race,
        # not a wrong call: it stays a ConflictError, which the server answers 409)
        raise ConflictError(
            f"run {run_id!r} changed after this process read it (another process "
            "decided or resumed it first); nothing was recorded and this resume is "
            f"refused -- see `interlock status {run_id}`") from None


async def _let_go(store: Store, run_id: str, owner: str, exc: BaseException) -> None:
    """A run given up (a store that failed, a lost claim, a cancellation of the caller),
    released for whoever claims it next. The error `drive` raises is the one that
    stopped it (``exc``), not one of the release's (whose lease then runs out)."""
    try:
        await store.release(run_id, owner)
    except Exception as release_error:
        log.warning("run %s: its claim was not released (%s: %s); it can be taken "
                    "over once its lease runs out (stopped by %s: %s)", run_id,
                    type(release_error).__name__, release_error, type(exc).__name__,
                    exc)


async def _execute(store: Store, run_id: str, owner: str, runner: Runner,
                   listener: Listener | None = None, lease: float = LEASE_SECONDS,
                   claim: Claim | None = None) -> None:
    """Run the executor in this task, watched for its lease and for a cancellation.

    The executor needs no task of its own (a run that never waits for I/O then runs
    from claim to release in one step of its caller). A cancellation requested through the store
    cancels *this* task with ``runner.cancelled_by`` set; the executor takes that
    cancellation back (``Task.uncancel``, as `asyncio.timeout` does with its own) and
    records ``run.cancelled``. A cancellation of our caller propagates; when it came
    together with the watcher's (one ``CancelledError`` for both), it still does.

    A lost claim (`_Watcher.lose`) cancels this task too, with nothing recorded: the
    nodes in flight are stopped as a cancellation stops them, and `ClaimLost` is raised.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("interlock executes a run inside an asyncio task")
    cancelling = task.cancelling()
    watcher = _Watcher(store, run_id, owner, runner, task, lease, claim)
    # in a copy of our context, as a task of its own would be: what node bodies set in
    # context variables stays in the run; its sub-workflow nodes find its child runs there
    context = contextvars.copy_context()
    context.run(CHILD_RUNS.set, _Children(store, run_id, runner.view, listener))
    context.run(CLAIM_GUARD.set, watcher)  # `ctx.claim`, and `ctx.once`'s check
    try:
        await Steps(runner.execute(), context=context)
    except asyncio.CancelledError:
        if watcher.lost is None:
            raise
    finally:
        if watcher.cancelled and runner.view.status != "CANCELLED" \
                and task.cancelling() > cancelling:
            # the watcher's cancellation was not taken back by the executor: it reached
            # it after the run had ended (in its last commit), or a node swallowed it
            task.uncancel()
        await watcher.stop()
    if watcher.lost is not None:
        if watcher.lost_cancel and task.cancelling() > cancelling:
            task.uncancel()  # ours, for the lost claim: the caller is told by the error
        raise watcher.lost
    if task.cancelling() > cancelling:
        raise asyncio.CancelledError  # our caller's, taken for the watcher's by the executor


async def start(plan: Plan, store: Store, run_id: str, *, definition: JSONObject,
                definition_hash: str, input: JSONObject, config: JSONObject,
                limits: dict[str, object], options: dict[str, object],
                started: dict[str, object] | None = None,
                listener: Listener | None = None) -> RunResult:
    """Create a run (its row and ``run.started``, chained with ``$INTERLOCK_LOG_KEY``
    when set) and drive it. ``input``, ``config`` and ``limits`` are the effective ones
    (JSON data); ``options`` what the row keeps of the overrides; ``started``: more
    fields of ``run.started`` (a child run's ``parent``, a trace's ids). The declared
    fields' defaults that apply are recorded there too (`start_defaults`)."""
    view, writer, owner = await create(
        plan, store, run_id, definition=definition, definition_hash=definition_hash,
        input=input, config=config, limits=limits, options=options, started=started,
        listener=listener)
    return await drive(plan, store, run_id, view, writer, listener=listener, owner=owner,
                       generation=1 if owner is not None else None)


async def create(plan: Plan, store: Store, run_id: str, *, definition: JSONObject,
                 definition_hash: str, input: JSONObject, config: JSONObject,
                 limits: dict[str, object], options: dict[str, object],
                 started: dict[str, object] | None = None, listener: Listener | None = None,
                 claimed: bool = True, detached: bool = False
                 ) -> tuple[RunView, L.LogWriter, str | None]:
    """`start`'s first half: the run's row and ``run.started``; its view, its writer, and
    the owner it was created claimed by (``claimed`` and a store that leases in its
    writes), else None -- an unclaimed run, executed later (a server's queue).
    ``detached``: the run is recorded PENDING, unclaimed, for a worker to execute
    (``run.started`` says ``detached: true``)."""
    key = L.env_key()
    writer = L.LogWriter(key=key)
    now = time.time()
    chain = chain_options(key)
    fields: dict[str, object] = {
        "workflow": plan.spec.workflow, "definition_hash": definition_hash, "input": input,
        "config": config, "limits": limits, **(started or {}), **chain, **L.format_field()}
    defaults = start_defaults(plan.spec, input)
    if defaults:
        fields["defaults"] = defaults
    code = code_digests(plan.spec)  # the code each node runs, as evidence
    if code:
        fields["code"] = code
    if detached:
        fields["detached"] = True
        claimed = False
    rec, entry = writer.make(L.RUN_STARTED, fields)
    view = RunView(plan)
    view.apply(rec)
    # created claimed where the store can: no claim of its own to commit
    owner = make_owner() if claimed and store.leases_in_writes else None
    row = RunRow(run_id=run_id, workflow=plan.spec.workflow, definition=definition,
                 definition_hash=definition_hash, input=input, options={**options, **chain},
                 created_at=now,
                 summary=Summary(status=view.status, last_seq=1, last_hash=writer.hash,
                                 updated_at=now),
                 owner=owner, lease_until=now + LEASE_SECONDS if owner else None,
                 generation=1 if owner else 0)  # created claimed: its first claim
    await store.create_run(row, [entry])
    if listener is not None:
        listener(rec, view)
    return view, writer, owner


def start_defaults(spec: WorkflowSpec, data: Mapping[str, object]) -> dict[str, object]:
    """The declared fields' start values that apply to a run (``run.started`` records
    them, so a resume folds the same state whatever the code's defaults become): a value
    in the input replaces the default (null too, for a field without a reducer; a field
    with one given null starts empty)."""
    out = {}
    for name, value in spec.defaults().items():
        given = data.get(name)
        if name not in data or (given is None and spec.state[name].reducer != "replace"):
            out[name] = value
    # each value as the log holds it, in declaration order (as a live run's state has)
    return {name: L.to_json_value(value) for name, value in out.items()}


@dataclass(frozen=True, slots=True)
class _Functions:
    callables: Mapping[str, Callable[..., object]]


class _Children:
    """The child runs of one run (`_subflow.ChildRuns`): on its store, under what is left
    of its limits when each starts."""

    def __init__(self, store: Store, run_id: str, view: RunView,
                 listener: Listener | None = None) -> None:
        self.store, self.run_id, self.view, self.listener = store, run_id, view, listener

    async def run(self, ctx: Any, request: ChildRequest) -> ChildOutcome:
        st, rid = self.store, request.run_id
        try:
            await st.get_run(rid)
            exists = True
        except RunNotFound:
            exists = False
        if not exists:
            spec = request.plan.spec
            limits, inherited = self._limits(
                {"steps": DEFAULT_STEPS, **spec.limits.model_dump(exclude_none=True)})
            # the parent's log names its child (the child's run.started names its parent)
            await ctx._engine_log(L.CHILD_STARTED, {"run_id": rid, "workflow": spec.workflow})
            result = await start(request.plan, st, rid, definition=request.definition,
                                 definition_hash=definition_hash(request.definition),
                                 input=L.to_json_value(request.input()),
                                 config=L.to_json_value(dict(spec.config)), limits=limits,
                                 options={"config": {}, "limits": {}, "parent": request.link,
                                          "inherited": inherited},
                                 started={"parent": request.link},
                                 listener=child_listener(self.listener, rid, spec.workflow))
        else:
            result = await continue_child(
                st, rid, _Functions(request.callables),
                listener=child_listener(self.listener, rid, request.plan.spec.workflow))
        row = await st.get_run(rid)  # its last record (and what it inherited)
        return ChildOutcome(**result.to_json(), last_seq=row.summary.last_seq,
                            inherited=list(row.options.get("inherited") or ()))

    def _limits(self, own: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The child's limits: its own, or what the parent has left where that is less
        (those are ``inherited``: crossing one fails the parent)."""
        out, inherited = dict(own), []
        parent = self.view.limits
        for name, used in (("tokens", self.view.tokens), ("steps", self.view.steps)):
            if parent.get(name) is None:
                continue
            left = max(int(parent[name]) - used, 0)
            if out.get(name) is None or left < out[name]:
                out[name] = left
                inherited.append(name)
        return out, inherited

    def steps(self) -> tuple[int, int | None]:
        return self.view.steps, self.view.limits.get("steps")

    async def search_messages(self, query: str, limit: int) -> list[Any]:
        return await self.store.search_messages(self.view.plan.spec.workflow, query,
                                                limit=limit, exclude=self.run_id)

    async def stopped(self, child_id: str) -> None:
        request = await self.store.cancel_requested(self.run_id)
        if request is None:
            return  # a timeout, a sibling's failure: the child is continued later
        with contextlib.suppress(UsageError, LogError, RunNotFound):
            await cancel(child_id, by=request.get("by"), store=self.store, wait=0)


async def continue_child(store: Store, run_id: str, workflow: Functions | None, *,
                         listener: Listener | None = None) -> RunResult:
    """Continue a child run from its log, unless it ended or still waits for a human;
    where it then stands."""
    loaded = await load_run(store, run_id, workflow=workflow, executable=True)
    view = loaded.view
    if view.status in ("COMPLETED", "REJECTED", "CANCELLED"):
        return result_of(run_id, loaded.row.workflow, view)
    first: list[tuple[str, dict[str, object]]] = []
    if view.status == "WAITING_APPROVAL":
        first = await _unblocked(store, run_id, view)
        # it waits for a human -- unless a child it waits through moved on, or a gate of
        # its own was decided (the parent forwarded the decision) while others still wait
        pending = view.pending_gates()
        if not first and pending and running_beside(view, pending) is None:
            return result_of(run_id, loaded.row.workflow, view)
    return await drive(loaded.plan, store, run_id, view, loaded.writer(),
                       first=[(L.RUN_RESUMED, {"by": None}), *first], listener=listener)


async def continue_claimed(store: Store, run_id: str, owner: str, *,
                           workflow: Functions | None = None,
                           listener: Listener | None = None, lease: float = LEASE_SECONDS,
                           stop: Stop | None = None,
                           executor: Literal["local", "ray"] | None = None) -> RunResult:
    """Execute a run ``owner`` has claimed (`Store.claim_next`: a worker's), from its log:
    a detached run's first nodes, a decided run's continuation, an abandoned run's
    interrupted visits, a waiting run's gate past its deadline (decided by the engine,
    as `resume` does: its ``on_timeout``). ``run.resumed`` names the ``worker``.
    Released at the end, also when it cannot be executed (a broken log, a workflow whose
    code does not import, nothing to do): that error is raised."""
    try:
        loaded = await load_run(store, run_id, workflow=workflow, executable=True,
                                executor=executor)
        writer = loaded.writer()
    except BaseException:
        await store.release(run_id, owner)
        raise
    row = loaded.row
    if row.owner != owner:  # taken over since our claim (our lease ran out meanwhile)
        raise ClaimLost(run_id, row.owner, row.generation, None)
    view = loaded.view
    first: list[tuple[str, dict[str, object]]] = []
    if view.status == "WAITING_APPROVAL":  # a gate's deadline passed: the engine decides
        from .._engine._approvals import expire

        first = expire(loaded.spec, view)
    if (view.status == "WAITING_APPROVAL" and not first) or view.status == "FAILED" \
            or view.status not in RESUMABLE | {"WAITING_APPROVAL"}:
        # (the row said runnable; the log says otherwise -- not ours to continue)
        await store.release(run_id, owner)
        raise UsageError(f"run {run_id!r} is {view.status} with nothing for a worker to do "
                         "(its row and its log disagree); left as it is")
    spans, listener = await _traced(store, run_id, loaded.row.workflow, listener)
    try:
        result = await drive(loaded.plan, store, run_id, view, writer,
                             first=[(L.RUN_RESUMED, {"by": None, "worker": owner,
                                                     "executor": executor}), *first],
                             listener=listener, owner=owner, lease=lease, stop=stop,
                             generation=row.generation if store.fences_appends else None)
    finally:
        if spans is not None:
            spans.end()
    return result


async def _traced(store: Store, run_id: str, workflow: str, listener: Listener | None
                  ) -> tuple[RunSpans | None, Listener | None]:
    """The spans of this execution of a stored run (linked to the span that started it,
    whose ids its ``run.started`` holds), and the listener that makes them; none when
    tracing is off."""
    if not tracing():
        return None, listener
    first = await store.entries_page(run_id, 0, 1)
    started = first[0].record().get("trace") if first else None
    spans = run_spans(run_id, workflow, continues=started if isinstance(started, dict)
                      else None)
    return spans, with_spans(listener, spans)
