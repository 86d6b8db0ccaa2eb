"""The PostgreSQL store's ears: one connection per event loop that ``LISTEN``s for what
other processes (and this one) commit, and wakes whoever waits for it.

Two channels (`interlock._store._postgres_sql`): `RECORDS_CHANNEL`, notified in the same
statement as an append's records (its payload names the runs that grew; empty: any run),
which the server's event streams wait on (`Store.wait_changed`); and `RUNNABLE_CHANNEL`,
notified when a run may have become runnable, which idle workers wait on
(`Store.wait_runnable`). ``NOTIFY`` is delivered at the writer's commit, so a waiter woken
reads the records committed.

An append notifies only while some process listens for records: a listener whose
streams wait announces itself (`Listener._keep_present`: the store's
``interlock_listening`` sequence holds the time until which the latest announcement
lasts, `PRESENCE` seconds, renewed every `PRESENCE` / 3 while anyone waits), and each
append reads it (`_postgres_sql._LISTENED`) in its own statement once its records are
written. With nobody listening, appends notify nothing: a notifying commit takes a lock
that serialises the commits of every process that notifies. A sequence is read outside
the statement's snapshot, so an append that reads "nobody" did so before the
announcement was made, after its records were written, and commits a moment later.
What the listener may miss is thus an append committed around its announcement, which it
covers by waking every waiter when it has announced itself (whose reads see the appends
committed by then) and again `GRACE` later (the appends that read "nobody" just before
it and committed after those reads). Workers, which wait for runnable runs only, do not
announce themselves.

A `Listener` opens its connection at its first wait and keeps it (and one task reading
it) until the store is closed. What it has heard is counted (`Listener.count`); a waiter
passes the count it saw last and returns at once if a notification for its run came
since, so one that arrives while the waiter reads is not missed. A notification can
still be lost -- the connection dropped, the server restarted -- so:

- a connection lost is opened again (after `RETRY`, doubling up to `RETRY_MAX` while it
  fails), and once it listens again *every* waiter is woken: what was committed in
  between was told to no one;
- an announcement the store refuses is tried again every `RETRY_MAX` (said once in the
  log): meanwhile it may run out, so appends notify nobody and the waiters' timeouts
  stand in; the first announcement that succeeds after a failure wakes every waiter, as
  a first one does;
- every waiter has a timeout, the slow poll it replaced, and looks again after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.rows import TupleRow

from ._postgres_sql import RECORDS_CHANNEL, RUNNABLE_CHANNEL

log = logging.getLogger("interlock.store")

Conn = psycopg.AsyncConnection[TupleRow]

RETRY = 0.1  # seconds before the first attempt to listen again after a failure
RETRY_MAX = 5.0  # and at most this long between two attempts
RUNS_KEPT = 4096  # runs whose last notification is remembered (the most recent)
PRESENCE = 10.0  # seconds an announcement that records are listened for lasts
GRACE = (0.1, 1.0)  # after announcing: every waiter is woken at once, then these later


class Listener:
    """One event loop's ``LISTEN`` connection and what it heard (see the module)."""

    def __init__(self, connect: Callable[[], Awaitable[Conn]], where: str,
                 announce: Callable[[float], Awaitable[None]] | None = None) -> None:
        self._connect, self.where, self._announce = connect, where, announce
        self.count = 0  # notifications heard (and reconnections), in this process
        self.listening = asyncio.Event()  # set while the connection listens (for tests)
        self.connections = 0  # connections that listened (for tests: a reconnection)
        # run id -> the count at its last notification, the most recent `RUNS_KEPT`; a run
        # forgotten is taken as changed at `_forgotten` (a spurious wake costs one read)
        self._last: OrderedDict[str, int] = OrderedDict()
        self._forgotten = 0
        self._everything = 0  # the count when any run may have changed (empty payload)
        # the waiters' events, held by the waiters only: None keys those of any run
        self._events: weakref.WeakValueDictionary[str | None, asyncio.Event] = \
            weakref.WeakValueDictionary()
        self._runnable = 0  # notifications that a run may be runnable
        self._runnable_seen = 0  # ... when `wait_runnable` last returned
        self._runnable_event = asyncio.Event()
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self._said = False  # a failure was logged (once, until it listens again)
        # announcing that records are listened for: while someone waited in the last
        # `PRESENCE` seconds (loop time); `present` is set once announced (for tests)
        self._wanted_until = 0.0
        self.grace: tuple[float, ...] = GRACE
        self._presence: asyncio.Task[None] | None = None
        self.present = asyncio.Event()
        self._relistened = asyncio.Event()  # the connection listens again: announce now

    # -- waiting -----------------------------------------------------------------------

    def _changed_since(self, run_id: str | None, seen: int) -> bool:
        if run_id is None:
            return self.count != seen
        last = self._last.get(run_id, self._forgotten)
        return max(last, self._everything) > seen

    async def wait_changed(self, timeout: float, seen: int | None = None,
                           run_id: str | None = None) -> int:
        """Until records of ``run_id`` (None: of any run) are committed after ``seen``
        (a count returned before; None: from now on), at most ``timeout`` seconds; the
        count then."""
        self._start()
        self._want_records()
        if seen is not None and self._changed_since(run_id, seen):
            return self.count
        event = self._events.get(run_id)
        if event is None:
            event = self._events[run_id] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        return self.count

    async def wait_runnable(self, timeout: float) -> None:
        """Until a run may have become runnable since the last call returned, at most
        ``timeout`` seconds."""
        self._start()
        if self._runnable == self._runnable_seen:
            event = self._runnable_event
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await event.wait()
        self._runnable_seen = self._runnable

    # -- announcing ----------------------------------------------------------------------

    _pause = staticmethod(asyncio.sleep)  # (the `GRACE` waits: a test holds them)

    def _want_records(self) -> None:
        loop = asyncio.get_running_loop()
        self._wanted_until = loop.time() + PRESENCE
        if self._presence is None and self._announce is not None:
            self._presence = loop.create_task(self._keep_present(),
                                              name="interlock-postgres-presence")

    async def _keep_present(self) -> None:
        """Announce that records are listened for, once listening, and again every
        `PRESENCE` / 3 seconds and at once after listening again, while anyone waits or
        waited in the last `PRESENCE` seconds; after a first announcement (or one after
        listening again), wake every waiter at once and `GRACE` later (see the module)."""
        assert self._announce is not None
        loop = asyncio.get_running_loop()
        announced_on = 0  # the connection the last announcement was made on
        failed = False  # the last try failed (and was logged: once, until one succeeds)
        try:
            while loop.time() < self._wanted_until or self._events:
                await self.listening.wait()
                on, since = self.connections, loop.time()
                try:
                    await self._announce(PRESENCE)
                except Exception as exc:  # the store away: the poll stands in meanwhile
                    self.present.clear()
                    if not failed:
                        failed = True
                        log.warning("announcing that %s is listened to failed: %s; other "
                                    "processes' commits reach the event streams by their "
                                    "poll until it succeeds (trying again every %g s)",
                                    self.where, str(exc).strip() or type(exc).__name__,
                                    RETRY_MAX)
                    await asyncio.sleep(RETRY_MAX)
                    continue
                # after failures the last announcement may have run out: appends made
                # since notified nobody, as before a first one
                if on != announced_on or failed:
                    failed = False
                    announced_on = on
                    self.present.set()
                    self._heard_everything(runnable=False)
                    waited = 0.0
                    for after in self.grace:
                        await self._pause(after - waited)
                        waited = after
                        self._heard_everything(runnable=False)
                self._relistened.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(since + PRESENCE / 3):
                        await self._relistened.wait()
        finally:
            self._presence = None
            self.present.clear()

    # -- hearing -----------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name="interlock-postgres-listen")

    async def _listen(self) -> None:
        """Listen, and listen again after the connection is lost, until cancelled."""
        delay = RETRY
        while True:
            try:
                self._conn = conn = await self._connect()
                await conn.execute(f"LISTEN {RECORDS_CHANNEL}; LISTEN {RUNNABLE_CHANNEL}")
                self.connections += 1
                self.listening.set()
                self._said, delay = False, RETRY
                self._heard_everything()  # what was committed before is told to no one
                self._relistened.set()
                async for note in conn.notifies():
                    self._heard(note.channel, note.payload)
            except Exception as exc:  # the connection lost or refused: said once
                if not self._said:
                    self._said = True
                    log.warning("listening for the commits of other processes on %s: %s "
                                "(polling until listening again)", self.where,
                                str(exc).strip() or type(exc).__name__)
            self.listening.clear()
            await self._drop()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _heard(self, channel: str, payload: str) -> None:
        if channel == RUNNABLE_CHANNEL:
            self._runnable += 1
            self._runnable_event.set()
            self._runnable_event = asyncio.Event()
            return
        if not payload:
            self._heard_everything()
            return
        self.count += 1
        for run_id in payload.split(" "):
            self._last[run_id] = self.count
            self._last.move_to_end(run_id)
            event = self._events.pop(run_id, None)
            if event is not None:
                event.set()
        while len(self._last) > RUNS_KEPT:
            self._forgotten = max(self._forgotten, self._last.popitem(last=False)[1])
        event = self._events.pop(None, None)
        if event is not None:
            event.set()

    def _heard_everything(self, *, runnable: bool = True) -> None:
        """Any run may have changed (and a run may be runnable): wake every waiter."""
        self.count += 1
        self._everything = self.count
        events = list(self._events.values())
        self._events.clear()
        for event in events:
            event.set()
        if runnable:
            self._heard(RUNNABLE_CHANNEL, "")

    # -- closing -----------------------------------------------------------------------

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def close(self) -> None:
        for task in (self._presence, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = None
        await self._drop()

    def abandon(self) -> None:
        """Close the connection without awaiting (from another loop than its own, or its
        loop gone); its task is cancelled if its loop still runs."""
        conn, self._conn, task, self._task = self._conn, None, self._task, None
        for each in (task, self._presence):
            if each is not None and not each.get_loop().is_closed():
                each.get_loop().call_soon_threadsafe(each.cancel)
        if conn is not None:
            conn.pgconn.finish()


__all__ = ["GRACE", "PRESENCE", "RETRY", "RETRY_MAX", "RUNS_KEPT", "Listener"]
