"""Stored runs: drive, resume, inspect, verify and fork them -- all from the log.

Every function here reads a run's records and folds them with the same
`RunView` the executor uses; none keeps a second account of a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .. import _log as L
from .._definition._bounds import check_config, check_run_id
from .._definition._model import DEFAULT_STEPS, WorkflowSpec, check_limits
from .._definition._plan import Plan
from .._definition._spec import parse
from .._engine import _records as R
from .._engine import _snapshot as snapshots
from .._engine._context import CLAIM_GUARD
from .._engine._fold import Gate, RunResult, RunView, result_of
from .._engine._journal import Journal
from .._engine._lease import Held, keeper_for
from .._engine._runner import Runner, Stop
from .._engine._steps import Steps
from .._errors import (
    ClaimError,
    ClaimLost,
    ConflictError,
    InterlockError,
    LogError,
    RunNotFound,
    StoreError,
    UsageError,
)
from .._observe._otel import RunSpans, run_spans, tracing, with_spans
from .._plugins._compile import compile_spec, reading_plan
from .._plugins._subflow import CHILD_RUNS, ChildOutcome, ChildRequest, child_run_id
from .._store import Claim, RunRow, Store, Summary, acquire_store, release_store, this_owner

if TYPE_CHECKING:
    from .._engine._approvals import Decision


class Functions(Protocol):
    """What a resume needs of a `Workflow` besides the stored definition: the Python
    functions of its builder-made nodes, by call path."""

    @property
    def callables(self) -> Mapping[str, Callable[..., Any]]: ...

LEASE_SECONDS = 15.0

log = logging.getLogger("interlock")

Listener = Callable[[L.Record, RunView], None]

RESUMABLE = {"RUNNING", "RETRYING", "FAILED", "PENDING"}


def child_listener(listener: Listener | None, run_id: str, workflow: str
                   ) -> Listener | None:
    """The listener of a child run (a sub-workflow node's): what the parent's listener's
    ``child(run_id, workflow)`` gives, if it has that method (the CLI's progress shows a
    child's records as they are committed, under its parent's node); else none."""
    make = getattr(listener, "child", None)
    return make(run_id, workflow) if callable(make) else None


def open_store_arg(store: str | Store | None) -> tuple[Store, bool]:
    """A `Store` for an argument that may be a URL; True when it is the URL's shared
    store (`acquire_store`), which the caller gives back with `release_store`."""
    if isinstance(store, Store):
        return store, False
    return acquire_store(store), True


# -- executing ----------------------------------------------------------------------


async def drive(plan: Plan, store: Store, run_id: str, view: RunView, writer: L.LogWriter, *,
                first: list[tuple[str, dict[str, Any]]] | None = None, force: bool = False,
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
    """
    if owner is None:
        owner = make_owner()
        generation = await store.claim(run_id, owner, lease, force=force)
    claim = Claim(owner, generation) if generation is not None else None
    journal = Journal(store, run_id, view, writer, listener, owner=owner, claim=claim)
    runner = Runner(plan, journal, run_id, view)
    runner.stop = stop
    try:
        if fresh and (await store.get_run(run_id)).summary.last_seq != writer.seq:
            raise ConflictError(f"run {run_id!r} changed before it started executing (it was "
                                "cancelled or taken over while queued); it is not started")
        if first:
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
        if execute and view.status not in TERMINAL_STATUSES:
            await _execute(store, run_id, owner, runner, listener, lease, journal.claim)
    except BaseException as exc:
        if not journal.released:
            # the run is given up (a store that failed, a lost claim, a cancellation of
            # the caller): let it go for whoever claims it next -- the error to raise is
            # the one that stopped it, not one of the release's (whose lease then runs out)
            try:
                await store.release(run_id, owner)
            except Exception as release_error:
                log.warning("run %s: its claim was not released (%s: %s); it can be taken "
                            "over once its lease runs out (stopped by %s: %s)", run_id,
                            type(release_error).__name__, release_error, type(exc).__name__,
                            exc)
        raise
    if not journal.released:
        await store.release(run_id, owner)
    return result_of(run_id, plan.spec.workflow, view)


def _claim_of(owner: str, generation: int | None) -> Claim | None:
    """The claim a `Store.claim` gave (None from a store that fences no appends)."""
    return None if generation is None else Claim(owner, generation)


def make_run_id() -> str:
    """A new run id: 20 random hex digits."""
    return os.urandom(10).hex()


def make_owner() -> str:
    """An owner id for one execution: `this_owner` and a random suffix."""
    return f"{this_owner()}:{os.urandom(4).hex()}"


CANCEL_POLL_SECONDS = 0.25
# how long `ctx.once` waits, after the claim was found lost, for the run's cancellation
# to reach it before it raises `ClaimLost` itself
LOST_GRACE_SECONDS = 5.0
TERMINAL_STATUSES = frozenset(L.TERMINAL_TYPES.values())


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


class _Watcher:
    """Keeps a run's lease, polls the store for a request to cancel it, commits what the
    executor staged but has not committed yet, and stops the run when its claim is lost.

    The lease is renewed off the event loop, by the store's lease keeper (`_lease`: a
    thread with a connection of its own), from the moment the run is watched: a node
    that blocks the loop for longer than the lease does not lose it. A store without a
    keeper has its lease renewed here, on the loop, every third of the lease.

    A timer starts the watching task after `CANCEL_POLL_SECONDS` (a run that ends sooner
    costs no task); then it polls every `CANCEL_POLL_SECONDS`. The executor commits
    ``node.started`` with the next batch (a node's completion, as a rule) -- one commit
    per step instead of two. The poll commits it too, so a node that runs longer than a
    poll shows in ``trace`` and ``status`` (and survives a crash in the log) while it runs.

    A lost claim (the keeper's renewal, a heartbeat here, or ``ctx.once``'s check found
    that another owner claimed the run since) is `lose`: nothing more is appended (the
    journal refuses, and so would the store), the executor's task is cancelled -- the
    nodes in flight stop as a cancellation stops them -- and `_execute` raises
    `ClaimLost`. It is also the run's `_context.ClaimGuard`: ``ctx.claim`` and
    ``ctx.once``'s check.
    """

    __slots__ = ("_loop", "_next_beat", "_stopped", "_task", "_timer",
                 "cancelled", "claim", "held", "lease", "lost", "lost_cancel", "owner",
                 "run_id", "runner", "store", "target")

    def __init__(self, store: Store, run_id: str, owner: str, runner: Runner,
                 target: asyncio.Task[Any], lease: float = LEASE_SECONDS,
                 claim: Claim | None = None) -> None:
        self.store, self.run_id, self.owner = store, run_id, owner
        self.runner, self.target, self.lease = runner, target, lease
        self.claim = claim
        self.cancelled = False  # whether we cancelled ``target`` (a requested cancellation)
        self.lost: ClaimLost | None = None
        self.lost_cancel = False  # whether we cancelled ``target`` for a lost claim
        self._stopped = False
        loop = self._loop = asyncio.get_running_loop()
        self._next_beat = loop.time() + lease / 3
        keeper = keeper_for(store) if claim is not None else None
        self.held: Held | None = None if keeper is None or claim is None else \
            keeper.hold(run_id, claim, lease, self._lost_elsewhere)
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            CANCEL_POLL_SECONDS, self._start)

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.lost is None:
            try:
                request = await self.store.cancel_requested(self.run_id)
            except StoreError as exc:  # (an outage: the next poll tries again)
                log.warning("run %s: looking for a cancellation request failed (%s); "
                            "trying again in %.2fs", self.run_id, exc, CANCEL_POLL_SECONDS)
                request = None
            if request is not None and self.runner.cancelled_by is None:
                self.runner.cancelled_by = request
                self.cancelled = True
                self.target.cancel()
            if self.held is None and loop.time() >= self._next_beat and \
                    self.runner.view.status not in TERMINAL_STATUSES:  # not released yet
                if not await self._heartbeat():
                    return
                self._next_beat = loop.time() + self.lease / 3
            try:
                await self.runner.sink.flush()  # a no-op unless records wait to be committed
            except ClaimLost as exc:  # the store refused it: another owner claimed the run
                self.lose(exc)
                return
            except StoreError:  # the journal is broken: the executor's next flush says so
                return
            await asyncio.sleep(CANCEL_POLL_SECONDS)

    async def _heartbeat(self, confirming: bool = False) -> bool:
        """Renew the lease from the loop; False (and `lose`) when the claim is gone. A
        store error is logged (the next poll tries again), or, ``confirming`` an
        effect, raised."""
        sent = time.monotonic()
        try:
            if self.claim is None:
                await self.store.heartbeat(self.run_id, self.owner, self.lease)
            else:
                await self.store.heartbeat(self.run_id, self.owner, self.lease,
                                           self.claim.generation)
        except ClaimError as exc:
            self.lose(exc if isinstance(exc, ClaimLost) else ClaimLost(
                self.run_id, exc.owner, None,
                None if self.claim is None else self.claim.generation))
            return False
        except StoreError as exc:
            if not confirming:  # (the watcher's: its next poll tries again)
                log.warning("run %s: renewing the lease failed (%s)", self.run_id, exc)
                return True
            raise
        if self.held is not None:
            self.held.renewed = max(self.held.renewed, sent)
        return True

    def _lost_elsewhere(self, exc: ClaimLost) -> None:
        """The keeper's (on its thread): the claim is gone; the loop stops the run."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs there
            self._loop.call_soon_threadsafe(self.lose, exc)

    def lose(self, exc: ClaimLost) -> None:
        """The claim is gone: append nothing more, stop the run (`_execute` raises)."""
        if self.lost is not None or self._stopped or (
                isinstance(self.runner.sink, Journal) and self.runner.sink.released):
            return  # (released by the run's last append: nothing of ours is at stake)
        self.lost = exc
        if isinstance(self.runner.sink, Journal):  # broken: its flushes refuse from now on
            self.runner.sink.broken = exc
        log.warning("%s", exc)
        if not self.target.done():
            self.lost_cancel = True
            self.target.cancel()

    # -- the `_context.ClaimGuard` of the run's nodes --------------------------------------

    async def confirm(self) -> None:
        """Before a ``ctx.once`` effect: renew the lease, with the claim's generation (one
        heartbeat: 0.05-0.25 ms on SQLite, ~0.1 ms on PostgreSQL; the effect's own
        record costs an append). The keeper alone would notice a lost claim only at its
        next renewal, up to a third of the lease later -- after a ``--force`` takeover,
        or a pause of the whole process, the node would run its effect meanwhile. When
        the claim is gone, the run is being stopped: wait for that cancellation here
        (the node stops as a cancellation stops it), and raise `ClaimLost` if it does
        not come. A store error is raised as it is: no effect without the check."""
        if self.lost is None and await self._heartbeat(confirming=True):
            return
        await asyncio.sleep(LOST_GRACE_SECONDS)
        assert self.lost is not None
        raise self.lost

    async def stop(self) -> None:
        """Stop watching: no cancellation after this. Raises what ended the watch, if any."""
        self._stopped = True
        if self.held is not None:
            keeper = keeper_for(self.store)
            if keeper is not None:
                keeper.drop(self.held)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def start(plan: Plan, store: Store, run_id: str, *, definition: dict[str, Any],
                definition_hash: str, input: dict[str, Any], config: dict[str, Any],
                limits: dict[str, Any], options: dict[str, Any],
                started: dict[str, Any] | None = None,
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


async def create(plan: Plan, store: Store, run_id: str, *, definition: dict[str, Any],
                 definition_hash: str, input: dict[str, Any], config: dict[str, Any],
                 limits: dict[str, Any], options: dict[str, Any],
                 started: dict[str, Any] | None = None, listener: Listener | None = None,
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
    fields: dict[str, Any] = {
        "workflow": plan.spec.workflow, "definition_hash": definition_hash,
        "input": input, "config": config, "limits": limits, **(started or {}), **chain}
    defaults = start_defaults(plan.spec, input)
    if defaults:
        fields["defaults"] = defaults
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


def start_defaults(spec: WorkflowSpec, data: Mapping[str, Any]) -> dict[str, Any]:
    """The declared fields' start values that apply to a run (``run.started`` records
    them, so a resume folds the same state whatever the code's defaults become): a value
    in the input replaces the default (null too, for a field without a reducer; a field
    with one given null starts empty)."""
    out = {}
    for name, value in spec.defaults().items():
        given = data.get(name)
        if name not in data or (given is None and spec.state[name].reducer != "replace"):
            out[name] = value
    # each value as the log holds it; the fields in declaration order (as a live run's
    # state has them)
    return {name: L.to_json_value(value) for name, value in out.items()}


# -- child runs (SPEC §7 sub-workflows) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Functions:
    callables: Mapping[str, Callable[..., Any]]


class _Children:
    """The child runs of one run (`_subflow.ChildRuns`): on its store, under what is left
    of its limits when each starts."""

    def __init__(self, store: Store, run_id: str, view: RunView,
                 listener: Listener | None = None) -> None:
        self.store, self.run_id, self.view = store, run_id, view
        self.listener = listener

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
            definition = request.definition
            # the parent's log names its child (the child's run.started names its parent)
            await ctx._engine_log(L.CHILD_STARTED, {"run_id": rid, "workflow": spec.workflow})
            result = await start(request.plan, st, rid, definition=definition,
                                 definition_hash=definition_hash(definition),
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
    first: list[tuple[str, dict[str, Any]]] = []
    if view.status == "WAITING_APPROVAL":
        first = await _unblocked(store, run_id, view)
        moved = {(f["node"], f["visit"]) for _, f in first}
        if any((g.node, g.visit) not in moved for g in view.pending_gates()):
            return result_of(run_id, loaded.row.workflow, view)  # waits for a human
    return await drive(loaded.plan, store, run_id, view, loaded.writer(),
                       first=[(L.RUN_RESUMED, {"by": None}), *first], listener=listener)


async def waiting_path(store: Store, run_id: str, parent: str | None = None) -> str | None:
    """The path of nodes down to the gate a run waits at (through its child runs), or
    None when nothing in it waits for a human -- or, with ``parent``, when it is not that
    run's child (a fork's log names the children of the run it was forked from)."""
    try:
        loaded = await load_run(store, run_id)
    except RunNotFound:
        return None
    view = loaded.view
    if parent is not None and (loaded.row.options.get("parent") or {}).get("run") != parent:
        return None
    if view.status != "WAITING_APPROVAL":
        return None
    for gate in view.pending_gates():
        if gate.kind != "workflow" or gate.key is None:
            return gate.node
        below = await waiting_path(store, gate.key, run_id)
        if below is not None:
            return f"{gate.node}/{below}"
    return None


async def _unblocked(store: Store, run_id: str, view: RunView
                     ) -> list[tuple[str, dict[str, Any]]]:
    """Decisions for the gates of child runs that no longer wait there (the child was
    decided or continued on its own, or waits at another gate now, or is not this run's:
    a fork's): the node runs again and finds its child as it is (or starts its own)."""
    items = []
    for gate in view.pending_gates():
        if gate.kind != "workflow" or gate.key is None:
            continue
        below = await waiting_path(store, gate.key, run_id)
        if below is None or f"{gate.node}/{below}" != gate.path:
            items.append((L.APPROVAL_DECIDED, {"node": gate.node, "visit": gate.visit,
                                               "kind": "workflow", "decision": "continued",
                                               "key": gate.key}))
    return items


def _child_gate(view: RunView, decision: Decision, skip: list[tuple[str, dict[str, Any]]]
                ) -> tuple[Gate, Decision] | None:
    """The gate of a child run ``decision`` is for, and the decision as the child takes
    it (``node`` ``remediate/approval`` names the gate ``approval`` of the child of
    ``remediate``); None when it is for a gate of this run."""
    from dataclasses import replace

    moved = {(f["node"], f["visit"]) for _, f in skip}
    pending = [g for g in view.pending_gates() if (g.node, g.visit) not in moved]
    if decision.node is not None:
        head, _, rest = decision.node.partition("/")
        for g in pending:
            if g.kind == "workflow" and g.node == head:
                return g, replace(decision, node=rest or None)
        return None
    if pending and pending[0].kind == "workflow":
        return pending[0], decision
    return None


async def _decide_child(store: Store, run_id: str, decision: Decision) -> None:
    """Record ``decision`` at the gate a child run (or its child...) waits at; the run
    that includes it continues it when it runs the node again."""
    from .._engine._approvals import decide

    loaded = await load_run(store, run_id)
    view = loaded.view
    if view.status != "WAITING_APPROVAL":
        raise UsageError(f"child run {run_id!r} is {view.status}, not waiting for a decision; "
                         "the decision is refused")
    moved = await _unblocked(store, run_id, view)
    below = _child_gate(view, decision, moved)
    if below is not None:
        await _decide_child(store, str(below[0].key), below[1])
        return
    await _commit_claimed(store, loaded, decide(loaded.spec, view, decision))


async def _expired_children(store: Store, view: RunView,
                            skip: list[tuple[str, dict[str, Any]]]
                            ) -> list[tuple[str, dict[str, Any]]]:
    """`_approvals.expire` in the child runs a run waits for (at any depth): the engine's
    decisions for their gates whose deadline has passed, recorded there; the records that
    make this run's node run again and continue each such child."""
    moved = {(f["node"], f["visit"]) for _, f in skip}
    items = []
    for gate in view.pending_gates():
        if gate.kind == "workflow" and gate.key is not None and \
                (gate.node, gate.visit) not in moved and await _expire_child(store, gate.key):
            items.append((L.APPROVAL_DECIDED, {"node": gate.node, "visit": gate.visit,
                                               "kind": "workflow", "decision": "continued",
                                               "key": gate.key}))
    return items


async def _expire_child(store: Store, run_id: str) -> bool:
    """Whether a deadline passed in the child run ``run_id`` (or below it), now decided."""
    from .._engine._approvals import expire

    try:
        loaded = await load_run(store, run_id)
    except RunNotFound:
        return False
    view = loaded.view
    if view.status != "WAITING_APPROVAL":
        return False
    below = await _expired_children(store, view, await _unblocked(store, run_id, view))
    items = expire(loaded.spec, view) + below
    if not items:
        return False
    await _commit_claimed(store, loaded, items)
    return True


async def _commit_claimed(store: Store, loaded: Loaded, items: list[tuple[str, dict[str, Any]]]
                          ) -> None:
    """Append ``items`` to a run nobody executes (a child waiting for a human), under a
    claim of our own."""
    owner = make_owner()
    generation = await store.claim(loaded.row.run_id, owner, LEASE_SECONDS)
    try:
        await Journal(store, loaded.row.run_id, loaded.view, loaded.writer(),
                      claim=_claim_of(owner, generation)).commit(items)
    finally:
        await store.release(loaded.row.run_id, owner)


_PAST = {"approve": "approved", "reject": "rejected", "modify": "modified"}


async def _continue_parent(store: Store, run_id: str, link: Mapping[str, Any], *,
                           detach: bool = False) -> None:
    """A child run was resumed on its own: continue its parent if it waits for it (or was
    interrupted) -- the node runs again and finds the child as it now is."""
    try:
        parent = await load_run(store, link["run"])
    except RunNotFound:
        return
    view = parent.view
    waits = any(g.kind == "workflow" and g.key == run_id for g in view.pending_gates())
    if waits or view.status in ("RUNNING", "RETRYING"):
        with contextlib.suppress(ClaimError, UsageError, LogError):  # being executed: it will see
            await resume(link["run"], store=store, detach=detach)


def _child_ids(plan: Plan, run_id: str, view: RunView) -> list[str]:
    """The child runs of a run's sub-workflow visits in flight (running or waiting)."""
    out = []
    for (node, visit) in view.running:
        if plan.nodes[node].spec.workflow is None:
            continue
        m = view.maps.get((node, visit))
        if m is not None:
            out += [child_run_id(run_id, node, visit, i) for i in range(len(m.items))
                    if i not in m.done]
        else:
            out.append(child_run_id(run_id, node, visit))
    return out


async def _cancel_children(store: Store, plan: Plan, run_id: str, view: RunView,
                           by: str | None) -> None:
    for child in _child_ids(plan, run_id, view):
        with contextlib.suppress(UsageError, LogError, RunNotFound):
            await cancel(child, by=by, store=store, wait=0)


# -- reading a stored run -------------------------------------------------------------


@dataclass
class Loaded:
    row: RunRow
    entries: list[L.Entry]  # the records folded from the log (after the snapshot, if one)
    spec: WorkflowSpec  # the definition the run started with
    plan: Plan  # its plan: executable (functions resolved) or for reading only
    view: RunView
    last: tuple[int, str]  # seq and chain hash of the run's last record
    key: L.ChainKey | None = None  # the run's chain key, when it is keyed and we have it
    keyed: bool = False
    notes: list[str] = field(default_factory=list)  # what a reader should be told

    def writer(self) -> L.LogWriter:
        """A writer that continues the run's log."""
        if self.keyed and self.key is None:
            raise UsageError(_key_missing(self.row))
        return L.LogWriter(*self.last, key=self.key)


def definition_hash(definition: dict[str, Any]) -> str:
    return hashlib.sha256(L.dumps(definition)).hexdigest()


def chain_options(key: L.ChainKey | None) -> dict[str, Any]:
    """What a new run's row and its run.started say of its chain (nothing when plain)."""
    return {} if key is None else {"chain": L.KEYED, "key_id": key.id}


_BROKEN_TODO = ("`interlock verify {run_id}` shows where the chain breaks; a broken log is "
                "never continued: restore the run from a backup or an export (`interlock "
                "export` made before the change, checked with `interlock verify --file`)")


def _key_missing(row: RunRow) -> str:
    return (f"run {row.run_id!r} has a keyed log (key id {row.options.get('key_id')}): set "
            f"{L.LOG_KEY_ENV} to the key it was written with to check or continue it")


def run_key(row: RunRow) -> tuple[bool, L.ChainKey | None]:
    """Whether the run's chain is keyed, and the key to check it with (None: not at hand).

    A key that is set but is not the run's is refused: every hash would disagree.
    """
    if row.options.get("chain") is None:
        return False, None
    if row.options.get("chain") != L.KEYED:
        raise UsageError(f"run {row.run_id!r}: its log uses the chain "
                         f"{row.options.get('chain')!r}, which this interlock does not know; "
                         "upgrade interlock")
    key = L.env_key()
    if key is not None and key.id != row.options.get("key_id"):
        raise UsageError(f"run {row.run_id!r} was written with the log key "
                         f"{row.options.get('key_id')}, but {L.LOG_KEY_ENV} holds the key "
                         f"{key.id}; set it to the run's key")
    return True, key


def check_tail(row: RunRow, entries: list[L.Entry], start: int, start_hash: str) -> str | None:
    """Why the log's end disagrees with the run's summary, if it does.

    The summary is written in the same transaction as the records, and read before
    them, so the log may have grown since (another process appending) but never end
    before the summary's last record, nor hold another record there.
    """
    s = row.summary
    last = entries[-1].seq if entries else start
    if last < s.last_seq:
        return (f"the log ends at record {last}, but the run's summary says it has "
                f"{s.last_seq} records: records were removed from its end")
    if s.last_seq == start:
        at_hash = start_hash
    elif s.last_seq > start:
        at_hash = entries[s.last_seq - start - 1].hash
    else:
        return None  # before the snapshot: the caller folds the whole log and asks again
    if at_hash != s.last_hash:
        return (f"record {s.last_seq} is not the one the run's summary names (its hash "
                "differs): the log was changed at its end")
    return None


async def load_run(store: Store, run_id: str, *, workflow: Functions | None = None,
                   executable: bool = False, upto: int | None = None,
                   executor: Literal["local", "ray"] | None = None) -> Loaded:
    """Read a run, check its chain, rebuild its workflow from the stored definition and fold.

    ``executable`` resolves the node functions (needed to continue the run); reading
    needs only the graph. ``upto`` folds the records up to that seq only (from the
    start); otherwise the latest snapshot is used when it is bound to the log (its
    digest in the ``snapshot.taken`` record after it, which the chain covers) and only
    the records after it are read, checked and folded. A log that is broken, or whose
    end disagrees with the run's summary, is refused.
    """
    row = await store.get_run(run_id)
    if definition_hash(row.definition) != row.definition_hash:
        raise LogError(f"run {run_id!r}: the stored definition does not match the hash "
                       "recorded when the run started: it was changed in the store since; "
                       "nothing reads or continues the run until it is restored (from a "
                       f"backup, or an export: `interlock verify --file`); `interlock verify "
                       f"{run_id}` reports it", run_id=run_id)
    keyed, key = run_key(row)
    if keyed and key is None and executable:
        raise UsageError(_key_missing(row))
    notes = [f"its log is keyed (key id {row.options.get('key_id')}) and {L.LOG_KEY_ENV} is "
             "not set: its hashes were not checked"] if keyed and key is None else []
    spec = parse(row.definition)
    if executor is not None:  # where this process runs the bodies (a worker's --executor)
        spec = spec.model_copy(update={"nodes": {
            name: ns.on_executor(executor) for name, ns in spec.nodes.items()}})
    plan = compile_spec(spec, workflow.callables if workflow is not None else {})[0] \
        if executable else reading_plan(spec)
    view, start, start_hash = None, 0, L.GENESIS
    entries: list[L.Entry] = []
    if upto is None:
        snap = await store.load_snapshot(run_id)
        restored = snapshots.load(plan, snap[1]) if snap is not None else None
        if restored is not None and snap is not None:
            view, start_hash = restored
            start = view.seq
            entries = await store.entries(run_id, after=start)
            why = snapshots.unbound(snap[1], start, entries)
            if why is None and row.summary.last_seq < start:
                why = "it is past the end of the log"
            if why is not None:
                notes.append(f"the snapshot at record {start} was not used: {why}; "
                             "the whole log was folded instead")
                view, start, start_hash = None, 0, L.GENESIS
    if start == 0:
        entries = await store.entries(run_id)
    problem = L.verify_chain(entries, start=start, prev_hash=start_hash, key=key,
                             hashes=not keyed or key is not None)
    if problem is not None:
        raise LogError(f"run {run_id!r}: the log is broken at record {problem.seq} "
                       f"({problem.message}); {_BROKEN_TODO.format(run_id=run_id)}",
                       run_id=run_id)
    tail = check_tail(row, entries, start, start_hash)
    if tail is not None:
        raise LogError(f"run {run_id!r}: {tail}; {_BROKEN_TODO.format(run_id=run_id)}",
                       run_id=run_id)
    if view is None:
        view = RunView(plan)
    for entry in entries:
        if upto is not None and entry.seq > upto:
            break
        view.apply(entry.record())
    last = (entries[-1].seq, entries[-1].hash) if entries else (start, start_hash)
    for note in notes:
        log.warning("run %s: %s", run_id, note)
    return Loaded(row, entries, spec, plan, view, last, key, keyed, notes)


async def resume(run_id: str, decision: Decision | None = None, *,
                 store: str | Store | None = None, workflow: Functions | None = None,
                 config: Mapping[str, Any] | None = None,
                 limits: Mapping[str, Any] | None = None, force: bool = False,
                 listener: Listener | None = None, detach: bool = False) -> RunResult:
    """Continue a run from its log: interrupted visits run again, nothing completed does.

    A run waiting for a human needs a `Decision` (`approve`, `reject`, `modify`),
    unless a gate's deadline has passed: then the engine decides, and says so.
    ``detach``: record the decision (and the resume) and return without executing: the
    run is PENDING until a worker (``interlock worker``) claims and continues it.
    """
    from .._engine._approvals import decide, expire

    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id, workflow=workflow, executable=True)
        view = loaded.view
        fields = _overrides(config, limits)
        first: list[tuple[str, dict[str, Any]]] = []
        if view.status == "WAITING_APPROVAL":
            expired = expire(loaded.spec, view)
            moved = await _unblocked(st, run_id, view)  # child runs that wait no more
            first += expired + moved
            child = _child_gate(view, decision, moved) if decision is not None else None
            if moved and decision is not None and child is None:
                raise UsageError(
                    f"run {run_id!r}: the child run {moved[0][1]['key']!r} it waited for "
                    "does not wait there any more (decided or continued on its own, or "
                    "not this run's: a fork's); resume it without a decision first, then "
                    "decide what it waits for then")
            if child is not None:  # a gate inside a child run: it decides it (SPEC §7)
                gate, below = child
                await _decide_child(st, str(gate.key), below)
                assert decision is not None
                first.append((L.APPROVAL_DECIDED, {
                    "node": gate.node, "visit": gate.visit, "kind": "workflow",
                    "decision": _PAST[decision.kind], "by": decision.by,
                    "comment": decision.comment, "key": gate.key, "path": gate.path}))
            elif decision is not None:
                first += decide(loaded.spec, view, decision, expired=expired)
            else:  # a gate in a child run whose deadline passed: decided there
                first += await _expired_children(st, view, moved)
            if decision is None and not first:
                gate = view.pending_gates()[0]
                raise UsageError(f"run {run_id!r} is waiting for a decision at "
                                 f"{gate.path or gate.node!r}; "
                                 "resume it with --approve, --reject or --modify "
                                 "(interlock.approve/reject/modify in Python)")
        elif decision is not None:
            raise UsageError(f"run {run_id!r} is {view.status}, not waiting for a decision; "
                             "the decision is refused")
        elif view.status not in RESUMABLE:
            raise UsageError(f"run {run_id!r} is {view.status}; only a failed, interrupted or "
                             "waiting run can be resumed")
        resumed = dict(fields, by=decision.by if decision else None)
        if detach:
            resumed["detached"] = True
        spans, listener = await _traced(st, run_id, loaded.row.workflow, listener)
        try:
            result = await drive(loaded.plan, st, run_id, view, loaded.writer(),
                                 first=[(L.RUN_RESUMED, resumed), *first], force=force,
                                 listener=listener, execute=not detach)
        finally:
            if spans is not None:
                spans.end()
        link = loaded.row.options.get("parent")
        if link is not None:  # a child run resumed on its own: its parent goes on too
            await _continue_parent(st, run_id, link, detach=detach)
        return result
    finally:
        if owned:
            await release_store(st)


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
    first: list[tuple[str, dict[str, Any]]] = []
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


def _overrides(config: Mapping[str, Any] | None,
               limits: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config:
        check_config(config)
        out["config"] = L.to_json_value(dict(config))
    if limits:
        out["limits"] = check_limits(limits)
    return out


async def status(run_id: str, *, store: str | Store | None = None) -> RunResult:
    """The run as its log tells it."""
    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id)
        return result_of(run_id, loaded.row.workflow, loaded.view)
    finally:
        if owned:
            await release_store(st)


TRACE_KEYS = ("seq", "type", "node", "at", "duration_ms", "attempt", "tokens", "error")


async def trace(run_id: str, *, store: str | Store | None = None) -> list[dict[str, Any]]:
    """The run's records, oldest first, each with at least the SPEC's trace keys."""
    return [rec async for page in trace_pages(run_id, store=store) for rec in page]


TRACE_PAGE = 2000  # records read from the store at a time by `trace_pages`


async def trace_pages(run_id: str, *, store: str | Store | None = None,
                      page: int | None = None, after: int = 0
                      ) -> AsyncIterator[list[dict[str, Any]]]:
    """`trace`'s records a page (default `TRACE_PAGE`) at a time: a long run's log is
    never held whole. ``after``: only the records with a greater seq."""
    st, owned = open_store_arg(store)
    try:
        async for records in _trace_pages(st, run_id, page or TRACE_PAGE, after, ()):
            yield records
    finally:
        if owned:
            await release_store(st)


async def _trace_pages(st: Store, run_id: str, page: int, after: int, above: tuple[str, ...]
                       ) -> AsyncIterator[list[dict[str, Any]]]:
    links = ChildLinks(await st.get_run(run_id), above)
    async for entries in st.iter_entries(run_id, after=after, page=page):
        records = [trace_record(run_id, entry) for entry in entries]
        for rec in records:  # a child run's records, nested under its start (SPEC §7)
            child = await links.follow(st, rec)
            if child is not None:
                rec["records"] = [{**r, "run_id": child} for pg in
                                  [p async for p in _trace_pages(st, child, page, 0,
                                                                 links.path)]
                                  for r in pg]
        yield records


class ChildLinks:
    """Which ``child.started`` records of a run are links to its child runs, as every
    reader (`trace`, `export`, `verify`) follows them: one the engine wrote (`forged`
    finds none), of a run not already nested (a crash may log a child's start twice),
    whose row names this run -- or a run it was forked from -- as its parent. ``above``:
    the runs this one is nested under (never followed again: no cycle)."""

    def __init__(self, row: RunRow, above: tuple[str, ...] = ()) -> None:
        self.row = row
        self.path = (*above, row.run_id)
        self.nodes: Mapping[str, Any] | None = None  # the definition's, when first needed
        self.seen: set[str] = set()
        self._lineage: set[str] | None = None

    async def follow(self, st: Store, rec: L.Record) -> str | None:
        """The child run ``rec`` links to, the first time it is met, else None."""
        if rec.get("type") != L.CHILD_STARTED:
            return None
        if self.nodes is None:
            try:
                self.nodes = parse(self.row.definition).nodes
            except InterlockError:  # a definition changed in the store: verify says so
                self.nodes = {}
        if forged(self.nodes, self.path, rec):
            return None
        child = str(rec["run_id"])
        if child in self.seen:
            return None
        self.seen.add(child)
        try:
            parent = ((await st.get_run(child)).options.get("parent") or {}).get("run")
            if self._lineage is None:
                self._lineage = await _lineage(st, self.row.run_id)
        except RunNotFound:
            return None
        return child if parent in self._lineage else None


def forged(nodes: Mapping[str, Any], path: tuple[str, ...], rec: L.Record) -> str | None:
    """Why ``rec``, of one of the engine's namespaces that the fold does not check
    (``child.``, ``snapshot.``, ``notify.``), is not a record interlock wrote there, or
    None. ``nodes``: the run's definition's; ``path``: the run's id last, after the runs
    it is nested under. (A node may not write these types, `ctx.log`: such a record was
    written to the store by hand, or by a node before they were reserved.)"""
    rtype = str(rec.get("type"))
    space = rtype.split(".", 1)[0]
    if space not in ("child", "snapshot", "notify"):
        return None
    node = rec.get("node")
    if space == "child":
        spec = nodes.get(node) if isinstance(node, str) else None
        if rtype != L.CHILD_STARTED or spec is None or spec.workflow is None:
            return (f"a {rtype} record of {node!r}, which is not a sub-workflow node: the "
                    "engine did not write it (a forged child link)")
        child = rec.get("run_id")
        if not isinstance(child, str) or not child:
            return f"a {rtype} record of {node!r} that names no child run"
        if child in path:
            return (f"a {rtype} record of {node!r} names the run {child!r}, which holds it: "
                    "a cycle of child runs (a forged child link)")
        return None
    if rtype == L.SNAPSHOT_TAKEN and node is None and rec.get("covers") == rec.get("seq", 0) - 1:
        return None
    if rtype == "notify.sent" and node is None:
        return None
    return (f"a {rtype} record{f' of {node!r}' if node else ''} that interlock did not write "
            f"(the {space}. namespace is interlock's own)")


def trace_record(run_id: str, entry: L.Entry) -> dict[str, Any]:
    """The stored entry as a trace shows it: the record, the SPEC's trace keys, its hash."""
    try:
        rec = entry.record()
    except ValueError:  # orjson.JSONDecodeError: the stored text was changed
        raise LogError(f"run {run_id!r}: the log is broken at record {entry.seq} (its data "
                       f"is not valid JSON); {_BROKEN_TODO.format(run_id=run_id)}",
                       run_id=run_id) from None
    for key in TRACE_KEYS:
        rec.setdefault(key, None)
    rec["hash"] = entry.hash
    return rec


@dataclass(frozen=True, slots=True)
class Verification:
    run_id: str
    ok: bool
    records: int
    seq: int | None = None  # the first bad record
    message: str = ""
    keyed: bool = False  # the chain is keyed, and was checked with the key
    notes: tuple[str, ...] = ()  # findings that do not break the log (a forged snapshot)
    children: tuple[str, ...] = ()  # the child runs verified with it (sub-workflows)


class LogCheck:
    """`verify`'s checks made one page of entries at a time (`feed`, then `result`), so
    that a long log is never held whole -- by ``interlock verify`` and by ``interlock
    trace``, which verifies as it goes: the chain (keyed or plain), the first record and
    the definition, the fold, the summary, and the snapshot (``snapshot``: the run's
    stored one, as ``(seq, data)``; a mismatch is a note, not a broken log).
    """

    def __init__(self, row: RunRow, snapshot: tuple[int, bytes] | None = None,
                 above: tuple[str, ...] = ()) -> None:
        self.row = row
        self.path = (*above, row.run_id)  # the runs it is nested under, then its own
        self.records = 0
        self.last: L.Entry | None = None
        self.problem: Verification | None = None
        self.view: RunView | None = None
        self.snapshot = snapshot
        self.notes: list[str] = []
        self.keyed, self.key = False, None
        try:
            self.keyed, self.key = run_key(row)
        except UsageError as exc:
            self._fail(1, str(exc))
            return
        if self.keyed and self.key is None:
            self.problem = Verification(row.run_id, False, 0, None, _key_missing(row))
        elif not self.keyed and L.env_key() is not None:
            self._fail(1, f"{L.LOG_KEY_ENV} is set, but this run's log is not keyed: it "
                          "cannot prove that a holder of the key wrote it (a run started "
                          "without the key, or a log rewritten without it); unset the "
                          "variable to check its plain chain")

    def _fail(self, seq: int, message: str) -> None:
        self.problem = Verification(self.row.run_id, False, self.records, seq, message)

    def feed(self, entries: list[L.Entry]) -> None:
        if self.problem is not None or not entries:
            return
        first = self.last is None
        found = L.verify_chain(entries, start=self.records, key=self.key,
                               prev_hash=self.last.hash if self.last else L.GENESIS)
        self.records += len(entries)
        if found is not None:
            return self._fail(found.seq, found.message)
        if first and not self._first(entries[0]):
            return None
        self._check_snapshot(entries)
        assert self.view is not None
        nodes = self.view.plan.spec.nodes
        for entry in entries:
            try:
                rec = entry.record()
                why = forged(nodes, self.path, rec) if entry.type.split(".", 1)[0] in \
                    ("child", "snapshot", "notify") else None
                if why is not None:
                    return self._fail(entry.seq, f"the log holds {why}")
                self.view.apply(rec)
            except (InterlockError, KeyError, IndexError, TypeError, ValueError) as exc:
                return self._fail(entry.seq,
                                  f"the record does not follow from the ones before: {exc}")
        self.last = entries[-1]
        return None

    def _first(self, entry: L.Entry) -> bool:
        row = self.row
        if entry.type != L.RUN_STARTED:
            self._fail(1, "the log does not begin with run.started")
            return False
        rec = entry.record()
        if definition_hash(row.definition) != row.definition_hash or \
                rec.get("definition_hash") != row.definition_hash:
            self._fail(1, "the stored definition does not match the hash recorded when the "
                          "run started")
            return False
        if (rec.get("chain"), rec.get("key_id")) != \
                (row.options.get("chain"), row.options.get("key_id")):
            self._fail(1, "the run's row and its run.started record disagree about how its "
                          "log is chained")
            return False
        self.view = RunView(reading_plan(parse(row.definition)))
        return True

    def _check_snapshot(self, entries: list[L.Entry], *, end: bool = False) -> None:
        """Whether the record after the snapshot vouches for it, once it is read (or
        at the ``end`` of the log, when there is none)."""
        if self.snapshot is None:
            return
        seq, raw = self.snapshot
        after = [e for e in entries if e.seq == seq + 1]
        if after or end or self.records > seq + 1:
            why = snapshots.unbound(raw, seq, after)
            if why is not None:
                self.notes.append(f"the snapshot at record {seq} does not match the log "
                                  f"({why}); it is not used: status and resume fold the "
                                  "whole log")
            self.snapshot = None

    def result(self) -> Verification:
        run_id = self.row.run_id
        if self.problem is not None:
            return Verification(run_id, False, self.records, self.problem.seq,
                                self.problem.message)
        if self.last is None or self.view is None:
            return Verification(run_id, False, 0, 1, "the log does not begin with run.started")
        self._check_snapshot([], end=True)  # a snapshot past the end of the log
        s, view, last = self.row.summary, self.view, self.last
        facts = [("status", s.status, view.status), ("last seq", s.last_seq, last.seq),
                 ("last hash", s.last_hash, last.hash), ("steps", s.steps, view.steps),
                 ("tokens", s.tokens, view.tokens)]
        for what, stored, folded in facts:
            if stored != folded and not (what == "status" and stored in RESUMABLE
                                         and folded in RESUMABLE):
                return Verification(run_id, False, self.records, last.seq,
                                    f"the run's summary says {what} = {stored!r} but its log "
                                    f"gives {folded!r}")
        return Verification(run_id, True, self.records, keyed=self.keyed,
                            notes=tuple(self.notes))


async def verify(run_id: str, *, store: str | Store | None = None) -> Verification:
    """Check the hash chain, the definition and the fold against the run's summary, a
    page of records at a time.

    A keyed log is checked with ``$INTERLOCK_LOG_KEY`` (without it, it cannot be
    checked: not ok). With the key set, a log that is not keyed is not ok either: it
    cannot prove that a holder of the key wrote it.
    """
    st, owned = open_store_arg(store)
    try:
        return await _verify(st, run_id, ())
    finally:
        if owned:
            await release_store(st)


async def _lineage(st: Store, run_id: str) -> set[str]:
    """A run and the runs it was forked from (whose records a fork's log copies)."""
    out: set[str] = set()
    rid: str | None = run_id
    while rid is not None and rid not in out:
        out.add(rid)
        rid = (await st.get_run(rid)).parent_run
    return out


async def _verify(st: Store, run_id: str, above: tuple[str, ...]) -> Verification:
    """`verify` of one run and, when it holds, of every child run its log names (SPEC
    §7: ``verify PARENT`` verifies every child chain): the first broken one is the
    result, under its own id. ``above``: the runs it is nested under (its parent last)."""
    row = await st.get_run(run_id)
    check = LogCheck(row, await st.load_snapshot(run_id), above)
    children: list[str] = []
    async for entries in st.iter_entries(run_id, page=TRACE_PAGE):
        check.feed(entries)
        if check.problem is None and check.view is not None:
            # (LogCheck refused a child.started the engine did not write)
            children += [str(e.record().get("run_id")) for e in entries
                         if e.type == L.CHILD_STARTED]
    result = check.result()
    parent = above[-1] if above else None
    if parent is not None and result.ok and \
            (row.options.get("parent") or {}).get("run") not in await _lineage(st, parent):
        return Verification(run_id, False, result.records, 1,
                            f"the child run does not name {parent!r} (or a run it was "
                            "forked from) as its parent")
    if not result.ok:
        return result
    verified: list[str] = []
    for child in dict.fromkeys(children):
        try:
            found = await _verify(st, child, (*above, run_id))
        except RunNotFound:
            return Verification(child, False, 0, None, f"the child run {child!r} that run "
                                f"{run_id!r} names is not in the store")
        if not found.ok:
            return found
        verified += [child, *found.children]
    return dataclasses.replace(result, children=tuple(verified))


async def fork(run_id: str, at: int, *, store: str | Store | None = None,
               workflow: Functions | None = None, config: Mapping[str, Any] | None = None,
               patch: Mapping[str, Any] | None = None, new_run_id: str | None = None,
               limits: Mapping[str, Any] | None = None,
               listener: Listener | None = None) -> RunResult:
    """Start a new run from the state at record ``at`` of ``run_id`` and run it.

    The new run's records 1..at are byte-identical copies of the original's (so
    their hashes match); record at+1 is ``run.forked`` with the parent, the config
    and limit overrides and the state patch (the other limits are the parent's, as
    they were at ``at``). The original run is not touched.
    """
    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id, workflow=workflow, executable=True, upto=at)
        if not 1 <= at <= len(loaded.entries):
            raise UsageError(f"run {run_id!r} has records 1..{len(loaded.entries)}; "
                             f"cannot fork at {at}")
        if patch is not None and not isinstance(patch, Mapping):
            raise UsageError("the patch is a JSON object of state fields")
        if patch:
            from .._engine._approvals import check_patch

            check_patch(loaded.spec, loaded.view, dict(patch))  # as modify's is
        prefix = loaded.entries[:at]
        fields = _overrides(config, limits)
        now = time.time()
        fields.update(parent_run=run_id, parent_seq=at,
                      patch=L.to_json_value(dict(patch)) if patch else None,
                      deadlines=_fresh_deadlines(loaded.spec, loaded.view, now) or None)
        rid = new_run_id or make_run_id()
        check_run_id(rid)
        row = loaded.row
        new_row = RunRow(run_id=rid, workflow=row.workflow, definition=row.definition,
                         definition_hash=row.definition_hash, input=row.input,
                         options=row.options, created_at=now,
                         summary=Summary(status="RUNNING", last_seq=at,
                                         last_hash=prefix[-1].hash, updated_at=now),
                         parent_run=run_id, parent_seq=at)
        await st.create_run(new_row, prefix)
        writer = L.LogWriter(at, prefix[-1].hash, key=loaded.key)
        spans, listener = await _traced(st, rid, row.workflow, listener)
        try:
            # run.forked re-opens the run at that point, whatever its status was there
            return await drive(loaded.plan, st, rid, loaded.view, writer,
                               first=[(L.RUN_FORKED, fields)], listener=listener)
        finally:
            if spans is not None:
                spans.end()
    finally:
        if owned:
            await release_store(st)


def _fresh_deadlines(spec: WorkflowSpec, view: RunView, now: float
                     ) -> list[dict[str, Any]]:
    """A fork that waits at an approval gives it its full ``timeout`` again, from now: the
    parent's deadline has usually passed, and a fork is a new run."""
    out = []
    for gate in view.pending_gates():
        ns = spec.nodes[gate.node]
        if gate.kind == "approval" and ns.approval is not None and ns.approval.timeout:
            out.append({"node": gate.node, "visit": gate.visit,
                        "deadline": round(now + ns.approval.timeout, 6)})
    return out


async def cancel(run_id: str, *, by: str | None = None, store: str | Store | None = None,
                 wait: float = 10.0) -> RunResult:
    """Cancel a running or waiting run; the log records who cancelled it.

    A run that no process is executing (waiting for a human, failed, or whose
    process died) is cancelled here and now. A run being executed elsewhere is
    asked to stop through the store: its executor cancels the visits in flight
    (killing isolated processes) and writes ``run.cancelled``; this waits up to
    ``wait`` seconds for that and returns the run as it then is.
    """
    from .._store import ClaimError

    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id)
        if loaded.view.status in ("COMPLETED", "REJECTED", "CANCELLED"):
            raise UsageError(f"run {run_id!r} is already {loaded.view.status}")
        owner = make_owner()
        try:
            generation = await st.claim(run_id, owner, LEASE_SECONDS)
        except ClaimError:
            await st.request_cancel(run_id, by)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                await asyncio.sleep(CANCEL_POLL_SECONDS)
                if (await st.get_run(run_id)).summary.status == "CANCELLED":
                    break
            return await status(run_id, store=st)
        try:
            loaded = await load_run(st, run_id)  # again: it may have moved before our claim
            if loaded.view.status in ("COMPLETED", "REJECTED", "CANCELLED"):
                # it ended between the first read and the claim (its executor's last
                # append released the claim we then took): nothing to cancel
                raise UsageError(f"run {run_id!r} is already {loaded.view.status}")
            journal = Journal(st, run_id, loaded.view, loaded.writer(),
                              claim=_claim_of(owner, generation))
            await journal.commit([R.run_cancelled(by)])
        finally:
            await st.release(run_id, owner)
        await _cancel_children(st, loaded.plan, run_id, loaded.view, by)
        return result_of(run_id, loaded.row.workflow, loaded.view)
    finally:
        if owned:
            await release_store(st)


async def list_runs(*, store: str | Store | None = None, status: str | None = None,
                    workflow: str | None = None, limit: int = 100) -> list[RunRow]:
    st, owned = open_store_arg(store)
    try:
        return await st.list_runs(status=status, workflow=workflow, limit=limit)
    finally:
        if owned:
            await release_store(st)


async def append_note(run_id: str, rtype: str, fields: Mapping[str, Any], *,
                      store: Store) -> None:
    """Append one record that changes nothing in the run (a tool's note, such as a
    server's ``notify.sent``) to its log, under the run's claim: claimed, read, chained,
    committed, released. `ClaimError` while another owner executes the run;
    `UsageError` once it has ended (a note never follows its final record)."""
    owner = make_owner()
    generation = await store.claim(run_id, owner, LEASE_SECONDS)
    try:
        loaded = await load_run(store, run_id)
        if loaded.view.status in TERMINAL_STATUSES:
            raise UsageError(f"run {run_id!r} has ended ({loaded.view.status}): no "
                             f"{rtype} is appended after its final record")
        journal = Journal(store, run_id, loaded.view, loaded.writer(),
                          claim=_claim_of(owner, generation))
        await journal.commit([(rtype, L.to_json_value(dict(fields)))])
    finally:
        await store.release(run_id, owner)
