"""Executing stored runs in a bounded pool: the server's executions and `interlock worker`.

`Pool` runs at most ``size`` executions at a time (each a task waiting for a slot), and
drains: it starts nothing more, gives the executions a while to end, then cancels them
(each stops its nodes in flight and releases its claim). `interlock serve`
executes the runs it starts, decides and takes over in one (``server/_pool.py``).

`Worker` is a process's loop of claiming runnable runs from a store
(`Store.claim_next`: detached runs, runs decided or resumed for a worker, runs whose
executor died and whose lease ran out) and executing them in a pool, each under its
claim, heartbeated (`_execute.drive`). Asked to stop (SIGTERM), it claims nothing more; the
runs in hand stop at their next node boundary -- the nodes running finish and are
committed, none starts -- and are released unfinished, for the next worker to continue;
a node still running after ``drain`` seconds is stopped (its visit, begun and not
completed, runs again there).

A store outage stops no worker: a failed claim is tried again after a back-off, and a
run whose execution met a store error is released (or left to its lease) and claimed
again after a back-off of its own, by this worker or another -- never refused. Only a
definitive refusal (its code does not import here, its log and row disagree) keeps a
run from this worker, for `REFUSE_SECONDS`, and at most `REFUSE_MAX` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar

from .._engine._fold import RunResult
from .._errors import ClaimLost, Draining, InterlockError, LogError
from .._json import JSONObject
from .._ops._claims import LEASE_SECONDS, make_owner
from .._ops._code import CodeChanged
from .._ops._execute import continue_claimed
from .._ops._load import Functions
from .._ops._runs import list_runs
from .._store import RUNNABLE, RunNotFound, Store, StoreError, owner_gone
from ._triggers import Firer

log = logging.getLogger("interlock.worker")

T = TypeVar("T")

#: what makes one execution (`Pool.submit` takes any such callable)
Factory = Callable[[], Awaitable[Any]]

POLL_SECONDS = 0.5  # an idle worker's look for runnable runs: one indexed query
DRAIN_SECONDS = 30.0  # how long a stopping worker lets the nodes in hand finish
REFUSE_SECONDS = 600.0  # a run this worker cannot execute is not claimed again for so long
REFUSE_MAX = 1000  # ... and at most so many such runs are remembered (the oldest go first)
BACKOFF_MAX = 60.0  # a run whose execution met a store error waits at most so long here


class Pool:
    """At most ``size`` executions at a time; ``on_end(run_id)`` after each. An
    execution submitted before a drain and not started when it begins is dropped
    (`Draining`), unless ``finish_submitted`` (a worker's: each holds a claim that its
    execution releases)."""

    def __init__(self, size: int, on_end: Callable[[str], None] | None = None, *,
                 finish_submitted: bool = False) -> None:
        self.size = size
        self.finish_submitted = finish_submitted
        self._slots = asyncio.Semaphore(size)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_end = on_end
        self.stopping = False
        self.running = 0  # executions holding a slot
        self._runs: dict[str, int] = {}  # run id -> executions of it submitted, not ended

    @property
    def queued(self) -> int:
        """Executions submitted and not ended (running or waiting for a slot)."""
        return len(self._tasks)

    def executing(self, run_id: str) -> bool:
        """Whether the run is executed here (or will be: it waits for a slot)."""
        return run_id in self._runs

    def submit(self, what: str, run_id: str, factory: Callable[[], Awaitable[T]]
               ) -> asyncio.Task[T]:
        """Execute ``factory()`` when a slot is free; the task's result is the run's."""
        if self.stopping:
            raise Draining("the server is shutting down; try again on its next start")
        self._runs[run_id] = self._runs.get(run_id, 0) + 1

        async def execute() -> T:
            try:
                async with self._slots:
                    if self.stopping and not self.finish_submitted:
                        raise Draining("the server is shutting down; the run was not "
                                       "executed")
                    self.running += 1
                    try:
                        return await factory()
                    finally:
                        self.running -= 1
            finally:
                left = self._runs.pop(run_id) - 1
                if left:
                    self._runs[run_id] = left
                if self._on_end is not None:
                    self._on_end(run_id)

        task = asyncio.get_running_loop().create_task(execute(), name=what)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, whoever else awaits it
        if isinstance(exc, ClaimLost):  # the run moved to another owner (a server's run)
            log.warning("%s: %s", task.get_name(), exc)
        elif isinstance(exc, InterlockError):
            log.info("%s: %s", task.get_name(), exc)
        elif exc is not None:
            log.error("%s failed", task.get_name(), exc_info=exc)

    async def take_over(self, store: Store, resume: Callable[[str], Factory]) -> list[str]:
        """Continue the runs whose executing process is gone (or whose lease ran out),
        and the runs created but never executed; the ids taken over."""
        now = time.time()
        taken = []
        # what was executing when its process stopped (also beside a waiting gate)
        for status in (*RUNNABLE, "WAITING_APPROVAL"):
            for row in await list_runs(store=store, status=status, limit=100_000):
                if status == "WAITING_APPROVAL" and "running" not in (row.summary.waiting
                                                                      or {}):
                    continue  # stopped at its gates (a passed deadline is the queue's)
                if row.owner is None or owner_gone(row.owner) or \
                        (row.lease_until or 0.0) < now:
                    self.submit(f"take over run {row.run_id}", row.run_id,
                                resume(row.run_id))
                    taken.append(row.run_id)
        if taken:
            log.warning("taking over %d run(s) whose executor is gone: %s", len(taken),
                        ", ".join(taken))
        return taken

    async def drain(self, timeout: float) -> None:
        """Start nothing more; give the executions ``timeout`` seconds to end, then cancel
        them (each stops its nodes in flight and releases its claim: whoever
        takes the run next continues it)."""
        self.stopping = True
        tasks = set(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("stopped %d execution(s) still running after %.0fs; their runs are "
                        "continued by whoever takes them next", len(pending), timeout)
            await asyncio.gather(*pending, return_exceptions=True)


class Worker:
    """Claims runnable runs from ``store`` and executes them, ``concurrency`` at a time,
    until `stop` (then drains: see the module). ``workflows``: take only runs of these
    workflow names, given their functions (a loaded file or a builder's `Workflow`);
    None: any run, from its stored definition. ``poll``: seconds between looks for work
    while idle (a slot that frees looks at once). ``lease``: each claim's lease, renewed
    every third of it. ``executor``: ``"ray"`` runs the body of every call node that
    names no executor or isolation of its own as a Ray task (``--executor ray``)."""

    def __init__(self, store: Store, *, concurrency: int = 1,
                 workflows: Mapping[str, Functions] | None = None,
                 poll: float = POLL_SECONDS, lease: float = LEASE_SECONDS,
                 drain: float = DRAIN_SECONDS,
                 executor: Literal["local", "ray"] | None = None) -> None:
        if concurrency < 1:
            raise ValueError("a worker executes at least one run at a time")
        self.store, self.workflows = store, workflows
        self.concurrency, self.poll, self.lease, self.drain = concurrency, poll, lease, drain
        self.executor = executor  # where the bodies run: ray for every call node without one
        self._wake = asyncio.Event()  # a slot freed, or stop
        self._stop = asyncio.Event()  # the runs in hand stop at their next node boundary
        self.pool = Pool(concurrency, on_end=lambda _: self._wake.set(),
                         finish_submitted=True)
        # runs this worker cannot execute (a definitive refusal: its code does not import
        # here, its log and row disagree...): not claimed again for REFUSE_SECONDS
        self.refused = _Refusals(REFUSE_MAX, REFUSE_SECONDS)
        # runs whose execution met a store error (an outage): released, and claimed again
        # by this worker (or any other) after a back-off that doubles with each failure
        self.backoff = _Refusals(REFUSE_MAX, BACKOFF_MAX)
        self._failures: OrderedDict[str, int] = OrderedDict()  # run id -> store errors
        self.executed = 0  # executions ended (completed, failed, waiting, released...)

    def stop(self) -> None:
        """Claim nothing more; the runs in hand stop at their next node boundary."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def firer(self) -> Firer | None:
        """What fires the ``triggers:`` of the workflows given (loaded files: they have a
        spec and `submit`): each due slot is recorded PENDING, and this worker (or
        another) claims it."""
        given: dict[str, Any] = {name: wf for name, wf in (self.workflows or {}).items()
                                 if getattr(getattr(wf, "spec", None), "triggers", None)}
        if not given:
            return None

        async def start(workflow: str, run_id: str, data: JSONObject) -> object:
            pending = await given[workflow].submit(data, store=self.store, run_id=run_id)
            self._wake.set()  # claim it now
            return pending

        return Firer({name: wf.spec for name, wf in given.items()}, start, self.store)

    async def run(self) -> None:
        """Claim and execute until `stop`, then drain (at most ``drain`` seconds); fire
        the given workflows' triggers meanwhile."""
        names = None if self.workflows is None else set(self.workflows)
        failures = 0  # the store's errors in a row: each doubles the wait, up to a minute
        firer = self.firer()
        firing = asyncio.ensure_future(firer.run(self._stop)) if firer is not None else None
        try:
            while not self.stopping:
                self._wake.clear()
                try:
                    await self._claim(names)
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    wait = min(max(self.poll, 0.5) * 2 ** (failures - 1), 60.0)
                    log.error("cannot claim runs from the store: %s; trying again in %.1fs",
                              exc, wait)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), wait)
                    continue
                if self.stopping:
                    break
                await self._idle()
        finally:
            if firing is not None:
                firing.cancel()  # between two ticks, or in a run's creation (atomic)
                with contextlib.suppress(asyncio.CancelledError):
                    await firing
            await self.pool.drain(self.drain)

    async def _idle(self) -> None:
        """Until a slot frees, the store tells of a runnable run, or ``poll`` seconds."""
        waits = [asyncio.ensure_future(self._wake.wait()),
                 asyncio.ensure_future(self.store.wait_runnable(self.poll))]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _claim(self, names: set[str] | None) -> None:
        """Claim runs until every slot is taken or none is left."""
        while self.pool.queued < self.concurrency and not self.stopping:
            owner = make_owner()
            run_id = await self.store.claim_next(
                owner, self.lease, workflows=names,
                exclude=self.refused.current() | self.backoff.current())
            if run_id is None:
                return
            self.pool.submit(f"run {run_id}", run_id,
                             functools.partial(self._execute, run_id, owner))

    async def _execute(self, run_id: str, owner: str) -> RunResult | None:
        try:
            row = await self.store.get_run(run_id)
        except RunNotFound:
            return None  # deleted since (pruned): nothing to release
        except StoreError as exc:  # the store went away between the claim and this read
            await self._released(run_id, owner)
            self._store_failed(run_id, "?", exc)
            return None
        log.info("claimed run %s (workflow %s, %s)", run_id, row.workflow, row.summary.status)
        functions = None if self.workflows is None else self.workflows.get(row.workflow)
        try:
            result = await continue_claimed(self.store, run_id, owner, workflow=functions,
                                            lease=self.lease, stop=self._stop,
                                            executor=self.executor)
        except asyncio.CancelledError:
            log.info("run %s (workflow %s): stopped with its nodes in flight (the worker "
                     "was stopping); released, continued by the next worker", run_id,
                     row.workflow)
            raise
        except ClaimLost as exc:  # another owner has it now: not ours to refuse or retry
            log.warning("run %s (workflow %s): %s", run_id, row.workflow, exc)
            return None
        except Exception as exc:
            if _transient(exc):
                assert isinstance(exc, StoreError)
                await self._released(run_id, owner)
                self._store_failed(run_id, row.workflow, exc)
                return None
            # a definitive refusal (a bug's too): not claimed again here for a while
            self.refused.add(run_id)
            log.error("run %s (workflow %s) could not be executed here and is left for "
                      "another worker (this one tries it again in %.0f min): %s", run_id,
                      row.workflow, REFUSE_SECONDS / 60,
                      exc if isinstance(exc, InterlockError) else f"{type(exc).__name__}: "
                      f"{exc}", exc_info=not isinstance(exc, InterlockError))
            return None
        finally:
            self.executed += 1
        self._failures.pop(run_id, None)
        if result.status in ("RUNNING", "RETRYING", "PENDING"):
            log.info("run %s (workflow %s): released at a node boundary after %s (the "
                     "worker is stopping); continued by the next worker", run_id,
                     row.workflow, _steps(result.steps))
        elif result.status.startswith("WAITING"):
            log.info("run %s (workflow %s): %s after %s (released; a decision makes "
                     "it runnable again)", run_id, row.workflow, result.status,
                     _steps(result.steps))
        else:
            log.info("finished run %s (workflow %s): %s, %s", run_id, row.workflow,
                     result.status, _steps(result.steps))
        return result

    async def _released(self, run_id: str, owner: str) -> None:
        """Give the claim up after a store error, if the store answers (the execution
        releases it too; otherwise its lease runs out)."""
        with contextlib.suppress(Exception):
            await self.store.release(run_id, owner)

    def _store_failed(self, run_id: str, workflow: str, exc: StoreError) -> None:
        """A run whose execution met a store error: released, not refused; claimed again
        after a back-off (0.5 s, doubling with each failure in a row, up to a minute)."""
        failures = self._failures.pop(run_id, 0) + 1
        self._failures[run_id] = failures
        while len(self._failures) > REFUSE_MAX:
            self._failures.popitem(last=False)
        wait = min(max(self.poll, 0.5) * 2 ** (failures - 1), BACKOFF_MAX)
        self.backoff.add(run_id, wait)
        log.warning("run %s (workflow %s): the store failed during its execution (%s); "
                    "released, and claimed again in %.1fs (by this worker or another)",
                    run_id, workflow, exc, wait)


def _transient(exc: BaseException) -> bool:
    """Whether an execution's error is the store's, and may go away (an outage, a full
    disk, a lost race): the run is retried, not refused."""
    return isinstance(exc, StoreError) and not isinstance(exc, _DEFINITIVE)


# store errors that retrying does not cure (the run is gone, its log does not verify, its
# code changed under --strict-code)
_DEFINITIVE: tuple[type[StoreError], ...] = (RunNotFound, LogError, CodeChanged)


class _Refusals:
    """Run ids, each for a while (``seconds``, or its own), at most ``size`` of them (the
    oldest forgotten first): a worker's memory of the runs it does not claim now."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size, self.seconds = size, seconds
        self._until: OrderedDict[str, float] = OrderedDict()

    def add(self, run_id: str, seconds: float | None = None) -> None:
        self._until.pop(run_id, None)
        self._until[run_id] = time.monotonic() + (self.seconds if seconds is None else seconds)
        while len(self._until) > self.size:
            self._until.popitem(last=False)

    def current(self) -> set[str]:
        """The ids still in force (the expired ones are dropped)."""
        now = time.monotonic()
        for run_id in [r for r, until in self._until.items() if until <= now]:
            del self._until[run_id]
        return set(self._until)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.current()

    def __len__(self) -> int:
        return len(self.current())


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
