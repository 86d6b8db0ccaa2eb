"""Runs executing in the server: a bounded pool, takeover on start, drain on stop.

Every execution (a run started through the API, a run continued after a decision or a
resume, a run taken over) is a task that waits for one of ``workers`` slots, then
executes under the run's claim exactly as the CLI does (`interlock.resume`,
`interlock.support.Started.execute`), so a run is executed by one process at a time
whichever started it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import interlock
from interlock import InterlockError, Store
from interlock.support import owner_gone

from ._hub import Hub

log = logging.getLogger("interlock.server")

Factory = Callable[[], Awaitable[Any]]

# statuses of a run that was executing when its process stopped
INTERRUPTED = ("RUNNING", "RETRYING", "PENDING")


class Draining(InterlockError):
    """The server is shutting down: no new execution starts."""


class Pool:
    def __init__(self, store: Store, hub: Hub, workers: int) -> None:
        self.store, self.hub = store, hub
        self.workers = workers
        self._slots = asyncio.Semaphore(workers)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self.running = 0  # executions holding a slot
        self._runs: dict[str, int] = {}  # run id -> executions of it submitted, not ended

    def executing(self, run_id: str) -> bool:
        """Whether this server executes the run (or will: it waits for a slot), so every
        commit of its records comes through this server's store."""
        return run_id in self._runs

    def submit(self, what: str, run_id: str, factory: Factory) -> asyncio.Task[Any]:
        """Execute ``factory()`` when a slot is free; the task's result is the run's."""
        if self.stopping:
            raise Draining("the server is shutting down; try again on its next start")
        self._runs[run_id] = self._runs.get(run_id, 0) + 1

        async def execute() -> Any:
            try:
                async with self._slots:
                    if self.stopping:
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
                self.hub.changed(run_id)  # a stream waiting on our commits polls again

        task = asyncio.get_running_loop().create_task(execute(), name=what)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, whoever else awaits it
        if isinstance(exc, InterlockError):
            log.info("%s: %s", task.get_name(), exc)
        elif exc is not None:
            log.error("%s failed", task.get_name(), exc_info=exc)

    async def accepted(self, run_id: str, task: asyncio.Task[Any], first: list[int]) -> None:
        """Wait until ``task`` has committed its first record (``first``: its seq, once
        staged -- a decision recorded) or has ended; an error it ended with is raised
        here. (Its claim keeps other writers out meanwhile.)"""
        while not task.done():
            waiter = self.hub.waiter(run_id)
            if first and (await self.store.get_run(run_id)).summary.last_seq >= first[0]:
                return
            change = asyncio.ensure_future(waiter.wait())
            try:
                await asyncio.wait({task, change}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                change.cancel()
        task.result()

    async def take_over(self, resume: Callable[[str], Factory]) -> list[str]:
        """Continue the runs whose executing process is gone (or whose lease ran out),
        and the runs created but never executed; the ids taken over."""
        now = time.time()
        taken = []
        for status in INTERRUPTED:
            for row in await interlock.list_runs(store=self.store, status=status,
                                                 limit=100_000):
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
        them (each records its nodes in flight as stopped and releases its claim: the
        next start takes them over)."""
        self.stopping = True
        tasks = set(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("stopped %d execution(s) still running after %.0fs; their runs are "
                        "continued on the next start", len(pending), timeout)
            await asyncio.gather(*pending, return_exceptions=True)
