"""`LocalRuns`: the runs of ``interlock mcp`` (stdio), executed in this process on a
store of its own -- the same store the CLI and a server can read and decide."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext

import interlock
from interlock.support import NoKey, key_refusal, store_word, unkeyed

from ._runs import Caller, Progress

if TYPE_CHECKING:
    from interlock import Decision, Store, Workflow
    from interlock.support import RunView

log = logging.getLogger("interlock.mcp")


class LocalRuns:
    """Runs executed here: a call drives its run to its next stop in this process."""

    def __init__(self, workflows: Mapping[str, Workflow], store: Store,
                 public_url: str | None = None) -> None:
        self.workflows, self.store, self.public_url = workflows, store, public_url
        self.store_hint = f" --store {store_word(absolute(store.url))}"
        # the tasks' runs executing here: every one (to stop them), the latest per run
        self._tasks: set[asyncio.Task[object]] = set()
        self._running: dict[str, asyncio.Task[object]] = {}

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Whoever started this process: the client's own name, as it gives it (stdio
        has no credentials; the process runs as its user)."""
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        name = getattr(info, "name", None) or "mcp"
        return Caller(f"mcp:{name}")

    def refuse_unkeyed(self, workflow: str, what: str = "the run was not started") -> None:
        """`NoKey` when an agent node a run of ``workflow`` may reach has no API key in
        this process, which would execute it (as ``interlock run`` refuses it)."""
        wf = self.workflows.get(workflow)
        keys = unkeyed(wf.warnings) if wf is not None else []
        if keys:
            raise NoKey(key_refusal(
                keys, "set the variable in the environment the MCP client starts "
                "`interlock mcp` with (the env of its server entry), and restart it",
                what=what, here="in the environment of `interlock mcp`"))

    async def call(self, workflow: str, data: dict[str, Any], caller: Caller,
                   progress: Progress) -> dict[str, Any]:
        self.refuse_unkeyed(workflow)
        wf = self.workflows[workflow]
        async with _forwarded(progress) as listen:
            result = await wf.run(data, store=self.store, listener=listen)
        return result.to_json()

    async def decide(self, run_id: str, decision: Decision, caller: Caller,
                     progress: Progress) -> dict[str, Any]:
        row = await self.store.get_run(run_id)
        async with _forwarded(progress) as listen:
            result = await interlock.resume(run_id, decision, store=self.store,
                                            workflow=self.workflows.get(row.workflow),
                                            listener=listen)
        return result.to_json()

    async def message(self, run_id: str, text: str, caller: Caller,
                      progress: Progress) -> dict[str, Any]:
        row = await self.store.get_run(run_id)
        self.refuse_unkeyed(row.workflow, "the message was not taken")
        async with _forwarded(progress) as listen:
            result = await interlock.send(run_id, text, by=caller.name, store=self.store,
                                          workflow=self.workflows.get(row.workflow),
                                          listener=listen)
        return result.to_json()

    async def status(self, run_id: str, caller: Caller) -> dict[str, Any]:
        return (await interlock.status(run_id, store=self.store)).to_json()

    async def start(self, workflow: str, data: dict[str, Any], caller: Caller
                    ) -> dict[str, Any]:
        self.refuse_unkeyed(workflow)
        started = await self.workflows[workflow].start(data, store=self.store)
        self._spawn(started.run_id, started.execute())
        return started.result.to_json()

    async def decide_soon(self, run_id: str, decision: Decision, caller: Caller) -> None:
        wf = self.workflows.get((await self.store.get_run(run_id)).workflow)
        await interlock.resume(run_id, decision, store=self.store, workflow=wf, detach=True)
        self._spawn(run_id, self._continue(run_id, wf, self._running.get(run_id)))

    async def _continue(self, run_id: str, wf: Workflow | None,
                        executing: asyncio.Task[object] | None) -> None:
        """Execute a decided run here -- after its execution here, if any, has stopped,
        and unless that execution took the decision in (the run is then no longer the
        PENDING the recorded decision left)."""
        if executing is not None:
            await asyncio.wait([executing])
        if (await self.store.get_run(run_id)).summary.status == "PENDING":
            await interlock.resume(run_id, store=self.store, workflow=wf)

    async def cancel(self, run_id: str, caller: Caller) -> None:
        await interlock.cancel(run_id, by=caller.name, store=self.store, wait=0)

    async def times(self, run_id: str) -> tuple[float, float]:
        row = await self.store.get_run(run_id)
        return row.created_at, row.summary.updated_at or row.created_at

    async def close(self) -> None:
        """Stop the tasks' runs still executing here (each is left resumable, as an
        interrupted ``interlock run`` is)."""
        running = list(self._tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def _spawn(self, run_id: str, work: Coroutine[Any, Any, object]) -> None:
        """Execute a task's run in this process, beyond the call that started it (as
        long as the process lives; a run it leaves unfinished is resumable)."""
        task = asyncio.get_running_loop().create_task(work)
        self._running[run_id] = task
        self._tasks.add(task)

        def done(task: asyncio.Task[object]) -> None:
            self._tasks.discard(task)
            if self._running.get(run_id) is task:
                del self._running[run_id]
            if not task.cancelled() and task.exception() is not None:
                log.warning("run %s stopped: %s", run_id, task.exception())

        task.add_done_callback(done)


@contextlib.asynccontextmanager
async def _forwarded(progress: Progress
                     ) -> AsyncIterator[Callable[[Mapping[str, object], RunView], None]]:
    """A run listener (called on any thread) whose records reach ``progress`` in order,
    on this loop; the records still queued are sent when the block ends."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Mapping[str, object] | None] = asyncio.Queue()

    def listen(rec: Mapping[str, object], view: RunView) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, rec)

    async def send() -> None:
        while (rec := await queue.get()) is not None:
            with contextlib.suppress(Exception):  # a client gone does not stop the run
                await progress(rec)

    sender = loop.create_task(send())
    try:
        yield listen
    finally:
        loop.call_soon_threadsafe(queue.put_nowait, None)
        await sender


def absolute(url: str) -> str:
    """``url`` with a relative SQLite path made absolute: the command it goes in runs
    wherever its reader is, not in this process's directory."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(url[len("sqlite:///"):]).resolve())
    return url
