"""Executing stored runs in a bounded pool: the server's executions and `interlock worker`.

`Pool` runs at most ``size`` executions at a time (each a task waiting for a slot), and
drains: it starts nothing more, gives the executions a while to end, then cancels them
(each stops its nodes in flight and releases its claim). `interlock serve`
executes the runs it starts, decides and takes over in one (``server/_pool.py``).

`Worker` is a process's loop of claiming runnable runs from a store
(`Store.claim_next`: detached runs, runs decided or resumed for a worker, runs whose
executor died and whose lease ran out) and executing them in a pool, each under its
claim, heartbeated (`_runs.drive`). Asked to stop (SIGTERM), it claims nothing more; the
runs in hand stop at their next node boundary -- the nodes running finish and are
committed, none starts -- and are released unfinished, for the next worker to continue;
a node still running after ``drain`` seconds is stopped (its visit, begun and not
completed, runs again there).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from ._errors import ClaimLost, Draining, InterlockError
from ._fold import RunResult
from ._runs import LEASE_SECONDS, Functions, continue_claimed, list_runs, make_owner
from ._store import RUNNABLE, RunNotFound, Store, StoreError, owner_gone
from ._triggers import Firer

log = logging.getLogger("interlock.worker")

Factory = Callable[[], Awaitable[Any]]

POLL_SECONDS = 0.5  # an idle worker's look for runnable runs: one indexed query
DRAIN_SECONDS = 30.0  # how long a stopping worker lets the nodes in hand finish


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

    def submit(self, what: str, run_id: str, factory: Factory) -> asyncio.Task[Any]:
        """Execute ``factory()`` when a slot is free; the task's result is the run's."""
        if self.stopping:
            raise Draining("the server is shutting down; try again on its next start")
        self._runs[run_id] = self._runs.get(run_id, 0) + 1

        async def execute() -> Any:
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
        for status in RUNNABLE:  # what was executing when its process stopped
            for row in await list_runs(store=store, status=status, limit=100_000):
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
        self.refused: set[str] = set()  # runs this worker cannot execute: not claimed again
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

        async def start(workflow: str, run_id: str, data: dict[str, Any]) -> Any:
            pending = await given[workflow].submit(data, store=self.store, run_id=run_id)
            self._wake.set()  # claim it now
            return pending

        return Firer({name: wf.spec for name, wf in given.items()}, start)

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
            run_id = await self.store.claim_next(owner, self.lease, workflows=names,
                                                 exclude=self.refused)
            if run_id is None:
                return
            self.pool.submit(f"run {run_id}", run_id,
                             functools.partial(self._execute, run_id, owner))

    async def _execute(self, run_id: str, owner: str) -> RunResult | None:
        try:
            row = await self.store.get_run(run_id)
        except RunNotFound:
            return None  # deleted since (pruned): nothing to release
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
        except Exception as exc:  # (a bug's too: never claimed again by this worker)
            self.refused.add(run_id)
            log.error("run %s (workflow %s) could not be executed here and is left for "
                      "another worker: %s", run_id, row.workflow,
                      exc if isinstance(exc, InterlockError) else f"{type(exc).__name__}: "
                      f"{exc}", exc_info=not isinstance(exc, InterlockError))
            return None
        finally:
            self.executed += 1
        if result.status in ("RUNNING", "RETRYING", "PENDING"):
            log.info("run %s (workflow %s): released at a node boundary after %d steps (the "
                     "worker is stopping); continued by the next worker", run_id,
                     row.workflow, result.steps)
        else:
            log.info("finished run %s (workflow %s): %s, %d steps", run_id, row.workflow,
                     result.status, result.steps)
        return result
