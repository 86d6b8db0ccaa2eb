"""Where the server's runs execute: event loops of their own, off the API's.

Each execution in the server (one of ``--workers`` slots) runs on a `RunLoop`: a thread
with its own asyncio event loop. A SQLite store serves several loops (its one writer
thread hands each outcome to the loop that asked): the run loops share the API's, and
its group commit. A PostgreSQL connection belongs to one loop: each run loop opens a
store of its own on the same URL. A node body that holds its loop -- an ``async def``
that computes, or calls a blocking client, without awaiting -- holds up its own run
only: the API's loop keeps answering health checks, reads, decisions and event streams.
A loop serves one execution at a time and is reused by the next (its store stays open).

Commits on a run loop wake the API's event streams through `Relay` (the API loop's
`Hub`, told with ``call_soon_threadsafe``).

`Watchdog` (one thread) looks at every run loop twice a second: a loop that has not
turned for `BLOCKED_AFTER` seconds is logged, naming the run it executes and the node
whose body holds it (found in the loop thread's stack: the engine's `in_loop` frame),
with what to do about it.

A memory store (``memory://``) lives in one process's memory and is not safe to use
from two threads: with it, runs execute on the API's loop, as they always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import interlock
from interlock import Store
from interlock.support import executing_node

from ._hub import Hub, NotifyingStore

log = logging.getLogger("interlock.server")

T = TypeVar("T")
Job = Callable[[Store], Awaitable[Any]]  # an execution, given the store of its loop

TICK = 0.25  # seconds between a run loop's heartbeats (a timer: costs nothing when busy)
WATCH_EVERY = 0.5  # seconds between the watchdog's looks
BLOCKED_AFTER = 1.0  # a loop that has not turned for this long is reported
REPEAT_AFTER = 10.0  # a loop still blocked is reported again this often


class Relay(Hub):
    """The API loop's hub, told of commits made on another thread's loop."""

    def __init__(self, hub: Hub, loop: asyncio.AbstractEventLoop) -> None:
        # (not Hub.__init__: this holds no waiters; `committed` is all a store calls)
        self._hub, self._loop = hub, loop

    def changed(self, run_id: str) -> None:
        with contextlib.suppress(RuntimeError):  # the API loop closed: nobody listens
            self._loop.call_soon_threadsafe(self._hub.changed, run_id)

    def mark(self, run_id: str, seq: int) -> None:
        self._hub.mark(run_id, seq)  # (at once, from this thread: before its next piece)


class RunLoop:
    """A thread running an event loop, executing one run at a time on a store of its
    own (opened on first use, closed by `close`)."""

    def __init__(self, index: int, url: str, relay: Relay, shared: Store | None) -> None:
        self.name = f"interlock-runs-{index}"
        self.url, self.relay = url, relay
        self.loop = asyncio.new_event_loop()
        self.own = shared is None  # a store of its own, closed with it
        self.store: Store | None = None if shared is None else NotifyingStore(shared, relay)
        self.run_id: str | None = None  # the execution on it now
        self.beat = time.monotonic()  # when it last turned (its tick)
        self.reported = 0.0  # the beat whose stall was last reported (the watchdog's)
        self.held_by = ""  # what held it then
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(TICK, self._tick)

    async def run(self, run_id: str, job: Job, *, stop_wait: float) -> Any:
        """``job(store)`` on this loop, awaited from the caller's loop. Cancelled, it
        cancels the execution there (which stops its nodes in flight and releases its
        claim) and waits for that, at most ``stop_wait`` seconds (a body holding the
        loop cannot be cancelled: the run is left to its lease), then raises
        ``CancelledError``."""
        caller = asyncio.get_running_loop()
        done: asyncio.Future[Any] = caller.create_future()
        task: list[asyncio.Task[Any]] = []

        def settle(t: asyncio.Task[Any]) -> None:  # on the caller's loop
            if done.done():
                return
            if t.cancelled():
                done.cancel()
            elif (exc := t.exception()) is not None:
                done.set_exception(exc)
            else:
                done.set_result(t.result())

        async def go() -> Any:
            if self.store is None:
                self.store = NotifyingStore(interlock.open_store(self.url), self.relay)
            return await job(self.store)

        def begin() -> None:  # on this loop
            t = self.loop.create_task(go(), name=f"run {run_id}")
            task.append(t)
            t.add_done_callback(lambda t: caller.call_soon_threadsafe(settle, t))

        def cancel() -> None:  # on this loop, after `begin` (its calls are in order)
            if task:
                task[0].cancel()

        self.run_id = run_id
        self.loop.call_soon_threadsafe(begin)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if done.cancelled():
                raise  # the execution itself ended cancelled
            self.loop.call_soon_threadsafe(cancel)
            stopped, _ = await asyncio.wait({done}, timeout=stop_wait)
            if not stopped:
                log.warning("run %s: not stopped %.0fs after it was asked to (%s); its "
                            "claim lapses with its lease and whoever takes the run next "
                            "continues it", run_id, stop_wait, self.holder() or "its "
                            "event loop is blocked")
            elif not done.cancelled():
                done.exception()  # (retrieved: the caller's cancellation wins)
            raise
        finally:
            if done.done():
                self.run_id = None  # free for the next execution

    def holder(self) -> str | None:
        """What holds this loop's thread now: ``node X of run Y``, or the code it is
        in (read from the thread's stack)."""
        frame = sys._current_frames().get(self.thread.ident or 0)
        if frame is None:
            return None
        node = executing_node(frame)
        if node is not None:
            return f"node {node!r} of run {self.run_id}"
        code = frame.f_code
        return (f"run {self.run_id}, in {code.co_name} ({code.co_filename}:"
                f"{frame.f_lineno}), outside any node body")

    async def close(self, wait: float) -> None:
        """Close its store and end its thread (at most ``wait`` seconds each: a loop a
        body still holds is left to the process's exit)."""
        if self.own and self.store is not None and self.run_id is None:
            future = asyncio.run_coroutine_threadsafe(self.store.close(), self.loop)
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), wait)
            except Exception as exc:  # closing is best effort: the process is ending
                log.warning("%s: closing its store: %s", self.name, exc)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join, wait)


class RunLoops:
    """The server's run loops: one per execution at a time (made as they are first
    needed, at most the pool's size since each execution holds a slot), watched."""

    def __init__(self, url: str, hub: Hub, *, stop_wait: float,
                 shared: Store | None = None) -> None:
        """``shared``: a store every run loop uses (one that serves several event
        loops: SQLite's); else each opens its own on ``url``."""
        self.url, self.stop_wait, self.shared = url, stop_wait, shared
        self.relay = Relay(hub, asyncio.get_running_loop())
        self._free: list[RunLoop] = []
        self.loops: list[RunLoop] = []
        self._watchdog: Watchdog | None = None

    async def run(self, run_id: str, job: Job) -> Any:
        """Execute ``job(store)`` on a free run loop (a new one if none is)."""
        lp = self._free.pop() if self._free else self._new()
        try:
            return await lp.run(run_id, job, stop_wait=self.stop_wait)
        finally:
            if lp.run_id is None:
                self._free.append(lp)
            else:  # still held by a body that would not stop: not given to another run
                self.loops.remove(lp)

    def _new(self) -> RunLoop:
        lp = RunLoop(len(self.loops) + 1, self.url, self.relay, self.shared)
        self.loops.append(lp)
        if self._watchdog is None:
            self._watchdog = Watchdog(self)
        return lp

    async def close(self, wait: float) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        await asyncio.gather(*(lp.close(wait) for lp in self.loops))


class Watchdog:
    """A thread that reports a run loop which has not turned for `BLOCKED_AFTER`
    seconds (again every `REPEAT_AFTER` while it stays blocked), and when it turns
    again."""

    def __init__(self, loops: RunLoops) -> None:
        self.loops = loops
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name="interlock-watchdog",
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _main(self) -> None:
        while not self._stop.wait(WATCH_EVERY):
            for lp in list(self.loops.loops):
                try:
                    self.look(lp)
                except Exception:  # never let a report end the watch
                    log.exception("the run loops' watchdog failed")

    def look(self, lp: RunLoop) -> None:
        beat, now = lp.beat, time.monotonic()
        if lp.reported and lp.reported != beat:  # it turned since it was reported
            log.warning("%s turns again: %s blocked it for %.1fs", lp.name, lp.held_by,
                        beat - lp.reported - TICK)
            lp.reported = 0.0
        held = now - beat - TICK
        if held < BLOCKED_AFTER or lp.run_id is None:
            return
        if lp.reported == beat and held % REPEAT_AFTER >= WATCH_EVERY:
            return  # reported already; again every REPEAT_AFTER seconds
        lp.reported = beat
        who = lp.held_by = lp.holder() or f"run {lp.run_id}"
        log.warning(
            "%s has blocked its event loop (%s) for %.1fs: an async def body that computes "
            "or calls a blocking client without awaiting; make it a sync def (it then runs "
            "on a thread) or await its slow calls (asyncio.to_thread for a blocking "
            "library). Other runs and the API are not held up; its timeout is enforced "
            "when it returns", who, lp.name, held)


__all__ = ["Job", "Relay", "RunLoop", "RunLoops", "Watchdog"]
