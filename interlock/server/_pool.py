"""Runs executing in the server: the engine's bounded pool (`interlock.support.Pool`:
slots, takeover on start, drain on stop), told to this server's event streams.

Every execution (a run started through the API, a run continued after a decision or a
resume, a run taken over) is a task that waits for one of ``workers`` slots, then
executes under the run's claim exactly as the CLI does (`interlock.resume`,
`interlock.support.Started.execute`), so a run is executed by one process at a time
whichever started it. An execution is a `Job` given the store to use: it runs on a loop
of its own (`_loops.RunLoops`: a thread and its event loop), off the API's loop; with a
memory store, on the API's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from interlock import Store
from interlock.support import Draining
from interlock.support import Pool as EnginePool

from ._hub import Hub
from ._loops import Job, RunLoops

__all__ = ["Draining", "Job", "Pool"]


class Pool(EnginePool):
    def __init__(self, store: Store, hub: Hub, workers: int,
                 loops: RunLoops | None = None) -> None:
        # a stream waiting on our commits polls again when an execution ends
        super().__init__(workers, on_end=hub.changed)
        self.store, self.hub = store, hub
        self.workers = workers
        self.loops = loops  # None: executions on this (the API's) loop, with ``store``

    def execution(self, run_id: str, job: Job) -> Callable[[], Awaitable[Any]]:
        """What `submit` takes: ``job`` on a run loop with its store, or here."""
        loops = self.loops
        if loops is None:
            return lambda: job(self.store)
        return lambda: loops.run(run_id, job)

    def submit_job(self, what: str, run_id: str, job: Job) -> asyncio.Task[Any]:
        return self.submit(what, run_id, self.execution(run_id, job))

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
