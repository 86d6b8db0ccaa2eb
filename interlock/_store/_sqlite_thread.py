"""The SQLite store's threads: the writer, the one thread per store that runs every
job on its connection in order and commits the writes queued together in one
transaction (group commit), and the checkpointer, which copies the WAL into the file on
a connection of its own (a full disk is not its failure).

The writer also lends its connection to the event loop's thread: a write made while
nothing is queued or running may run there, inline (`_Writer.begin_inline`), in place of
the hop to the thread and back (see `interlock._store._sqlite_inline`)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import queue
import sqlite3
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._base import StoreError
from ._sqlite_sql import disk_full

# a write of a group commit: an operation run on the connection inside the transaction
# (``op(conn, *args)``), and its arguments
Write = tuple[Callable[..., object], tuple[object, ...]]
# what became of a write: its result, or the exception it failed with
Done = tuple[object, BaseException | None]
# a job: the event loop and future its outcome goes to (a future of whatever the job
# returns: the caller's type, hence Any), and ``fn(*args)`` to run alone -- or, with no
# ``fn``, a `Write` for the group commit in ``args``
_Job = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., object] | None,
             tuple[Any, ...]]
_Outcome = tuple[asyncio.Future[Any], object, BaseException | None]


def _deliver(outcomes: list[_Outcome]) -> None:
    """On the event loop: hand jobs' outcomes to their awaiting coroutines (if still there)."""
    for fut, result, exc in outcomes:
        if fut.cancelled():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)


class _Writer:
    """A store's one thread: runs jobs in order, hands each outcome to the event loop
    that asked for it.

    Leaner than ``loop.run_in_executor`` on a one-thread pool (no concurrent future,
    no chained callbacks): a job is a queue entry; the outcomes of what one turn ran,
    one ``call_soon_threadsafe`` per event loop.

    Group commit: each turn takes every job queued by then; writes queued one after
    the other (appends, claims, new runs -- from concurrent runs, as a rule) go to
    ``batch`` together, which commits them in one transaction. So N runs writing while a
    commit is in progress share the next commit instead of paying N. One run alone finds
    one job per turn -- or, when the writer is idle, runs its write on its own thread
    (`begin_inline`).

    The thread is a daemon so that a store nobody closed does not keep the process
    alive; at exit `_stop_writers` lets the jobs queued finish (a transaction in
    progress commits or rolls back as a whole), as a thread pool's worker would.
    """

    def __init__(self, name: str,
                 batch: Callable[[list[Write]], list[Done]]
                 ) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._stopped = False
        # jobs queued and not yet run to their end, on this thread or inline (under
        # ``_guard``): 0 means the writer is idle
        self._pending = 0
        # held while jobs run on the connection, here or inline on another thread
        self._running = threading.Lock()
        self._batch = batch
        self._last: Callable[[], None] | None = None  # run before the thread ends
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        _WRITERS.add(self)

    def submit(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any],
               fn: Callable[..., object] | None, args: tuple[object, ...]) -> None:
        with self._guard:
            if self._stopped:
                raise StoreError("the SQLite store was closed while this call was being made")
            self._pending += 1
            self._jobs.put((loop, fut, fn, args))

    def begin_inline(self) -> bool:
        """Take the connection for a job on the caller's thread, if nothing is queued or
        running (then True: the caller runs its job, then `end_inline`). Jobs queued
        meanwhile wait for `end_inline`, so the order of jobs is kept: one that finds
        others queued is queued behind them."""
        with self._guard:
            if self._stopped or self._pending:
                return False
            self._pending = 1
        self._running.acquire()  # free: the thread releases it before `_pending` drops
        return True

    def end_inline(self) -> None:
        self._running.release()
        with self._guard:
            self._pending -= 1

    def close_with(self, last: Callable[[], None]) -> None:
        """Run ``last`` after the queued jobs, then end the thread, without waiting; the
        thread stays in `_WRITERS` until it ends, so that the process waits for it at
        exit."""
        with self._guard:
            if self._stopped:
                return
            self._stopped = True
            self._last = last
            self._jobs.put(None)

    def stop(self) -> None:
        """Let the queued jobs finish (a `close_with`'s last job too), then end the thread
        and wait for it (idempotent)."""
        _WRITERS.discard(self)
        with self._guard:
            if not self._stopped:
                self._stopped = True
                self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        # Invariants of the hand-off:
        # - jobs run in the order they were queued, and a group commit takes only writes
        #   queued one after the other: a read queued after a write runs after its commit
        #   (it sees it), and a write queued after a read runs after it;
        # - every job's future gets exactly one outcome, even when the job raises a
        #   BaseException (it is the caller's to see, as in a thread pool), and a job
        #   runs to its end whether or not its caller still waits (`_deliver` skips a
        #   cancelled future): a write the caller gave up on may have committed;
        # - the outcomes go back in one ``call_soon_threadsafe`` per event loop and turn
        #   (`_hand_back`), never by touching a future from this thread;
        # - jobs run holding ``_running`` (an inline job holds it too, so one queued while
        #   it runs waits for it), and a group's jobs leave ``_pending`` after it is
        #   released and before their outcomes go back: a caller resumed by its outcome
        #   finds the writer idle if nothing else was queued.
        jobs = self._jobs
        while True:
            turn: list[_Job | None] = [jobs.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    turn.append(jobs.get_nowait())
            i, n = 0, len(turn)
            while i < n:
                job = turn[i]
                if job is None:
                    with self._running:
                        self._end()
                    return
                outcomes: list[_Outcome]
                with self._running:
                    if job[2] is not None:  # one job on its own
                        i += 1
                        group = [job]
                        try:
                            outcomes = [(job[1], job[2](*job[3]), None)]
                        except BaseException as e:  # to the caller, as a thread pool does
                            outcomes = [(job[1], None, e)]
                    else:  # the writes queued one after the other: one transaction
                        j = i
                        while j < n and (nxt := turn[j]) is not None and nxt[2] is None:
                            j += 1
                        group = turn[i:j]  # type: ignore[assignment]  # no None in it
                        i = j
                        done = self._batch([g[3] for g in group])
                        outcomes = [(g[1], result, exc)
                                    for g, (result, exc) in zip(group, done, strict=True)]
                with self._guard:
                    self._pending -= len(group)
                self._hand_back(group, outcomes)
                # drop this thread's references before it blocks on the queue: a result
                # or an exception (with its traceback's frames) belongs to the caller now
                del job, group, outcomes

    def _end(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            try:
                last()
            except Exception:  # nobody waits for it: keep the reason in the log
                logging.getLogger("interlock").exception("closing the SQLite store failed")
            _WRITERS.discard(self)

    @staticmethod
    def _hand_back(group: list[_Job], outcomes: list[_Outcome]) -> None:
        loop = group[0][0]
        if all(g[0] is loop for g in group):
            by_loop = {loop: outcomes}
        else:  # one store, several event loops (threads of their own)
            by_loop = {}
            for g, outcome in zip(group, outcomes, strict=True):
                by_loop.setdefault(g[0], []).append(outcome)
        for lp, outs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                lp.call_soon_threadsafe(_deliver, outs)


class _Checkpointer:
    """Checkpoints a store's WAL on a thread and a connection of its own, when asked.

    ``PRAGMA wal_checkpoint(PASSIVE)`` copies what it can without waiting for (or
    blocking) the writer or any reader, so a commit never waits for a checkpoint's
    fsyncs. Requests coalesce: one that comes while a checkpoint runs starts the next.
    ``failed`` is set (and the thread ends) if the thread cannot do its work; the
    writer then turns SQLite's own checkpoints back on. A full disk is not such a
    failure: the checkpoint is tried again at the next request.
    """

    def __init__(self, path: Path, name: str) -> None:
        self._path = path
        self._wake = threading.Event()
        self._stopped = False
        self.failed: str | None = None
        self.ran = threading.Event()  # set after each checkpoint (for whoever waits on one)
        # started by the first request: a short-lived store (one short run) starts none
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def request(self) -> None:
        if not self._thread.is_alive() and not self._stopped:
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """End the thread, closing its connection (idempotent)."""
        self._stopped = True
        self._wake.set()
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=0)
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopped:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    if not disk_full(exc):
                        raise
                    # (a full disk: the writer truncates the WAL when space comes back;
                    # this thread goes on with the next request)
                self.ran.set()
        except sqlite3.Error as exc:
            self.failed = str(exc) or type(exc).__name__
        finally:
            if conn is not None:
                conn.close()


_WRITERS: weakref.WeakSet[_Writer] = weakref.WeakSet()


@atexit.register
def _stop_writers() -> None:
    for writer in list(_WRITERS):
        writer.stop()
