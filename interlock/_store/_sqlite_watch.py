"""The SQLite store's change detector: how a process learns within milliseconds that
another process (or another connection of its own) committed to the file.

SQLite tells no one of a commit. ``PRAGMA data_version`` on a connection tells whether
any *other* connection committed since that connection last asked: it reads the WAL
index in shared memory (no disk read, no lock held), a few microseconds. A `Watch` asks
it on a connection of its own that never writes, and only while someone waits
(`Watch.wait`) or waited in the last `LINGER` seconds: an idle server or worker with
nothing to follow does not look at all.

When to ask: on Linux the kernel tells of every write to the file or its WAL (inotify:
`interlock._store._file_events`), and the detector asks at once, and also every `EVERY`
seconds for `BURST` seconds after the last write told (a commit's frames are written
just before they are published in the WAL index: the look at the write may be too
early); while nothing is written it sleeps, so waiting costs nothing. Where the kernel
cannot tell (another system, inotify's limits reached), it asks every `EVERY` seconds
all the while.

A change seen bumps a counter (`Watch.count`, local to the process); a waiter passes
the count it saw last and returns at once if it moved, so a commit made while the
waiter was reading is not missed. A detector is an optimisation, never the only way:
every waiter has a timeout (the slow poll it replaced), and a detector that cannot work
(the file is not there yet, an error) lets its waiters time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from pathlib import Path

from ._file_events import FileEvents

log = logging.getLogger("interlock.store")

EVERY = 0.01  # seconds between two looks at data_version while someone waits
LINGER = 2.0  # seconds the detector keeps looking after the last wait ended
BURST = 0.25  # seconds of looks every EVERY after the last write the kernel told of


class Watch:
    """One event loop's detector of commits to the SQLite file at ``path``."""

    def __init__(self, path: Path, busy_ms: int) -> None:
        self.path, self.busy_ms = path, busy_ms
        self.count = 0  # changes seen so far
        self.ticks = 0  # looks at data_version (for tests and the bench)
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._changed = asyncio.Event()  # set (and replaced) at each change seen
        self._waiting = 0
        self._until = 0.0  # (time.monotonic) the detector stops looking after this
        self._task: asyncio.Task[None] | None = None
        self._failed = False
        self._absent = False  # a look found no file (the store not created yet)
        self._told = asyncio.Event()  # the kernel told of a write (`FileEvents`)
        self._burst_until = 0.0  # (time.monotonic) looks every EVERY until then
        self.told = False  # the kernel tells of writes here (for tests and the bench)

    async def wait(self, timeout: float, seen: int | None = None) -> int:
        """Until a change after ``seen`` (a `count` returned before; None: the next change
        from now), at most ``timeout`` seconds; the count then."""
        if seen is not None and seen != self.count:
            self._keep_looking()
            return self.count
        event = self._changed
        self._waiting += 1
        self._keep_looking()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await event.wait()
        finally:
            self._waiting -= 1
            self._until = time.monotonic() + LINGER
        return self.count

    def _keep_looking(self) -> None:
        self._until = max(self._until, time.monotonic() + LINGER)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._look(), name=f"interlock-sqlite-watch:{self.path.name}")

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        events = FileEvents.open(self.path.parent, [self.path.name, f"{self.path.name}-wal"])
        if events is not None:
            loop.add_reader(events.fd, self._written, events)
        self.told = events is not None
        try:
            self._check()  # the version to compare with (commits from here on)
            while self._waiting or time.monotonic() < self._until:
                await self._next_look()
                self.ticks += 1
                self._check()
        finally:
            if events is not None:
                loop.remove_reader(events.fd)
                events.close()

    def _written(self, events: FileEvents) -> None:
        if events.drain():
            self._burst_until = time.monotonic() + BURST
            self._told.set()

    async def _next_look(self) -> None:
        """Until the next look: `EVERY` seconds; told of writes, until the next write
        told, at most `EVERY` seconds in a burst (a write told lately) and otherwise
        until the end of the linger."""
        if not self.told:
            await asyncio.sleep(EVERY)
            return
        now = time.monotonic()
        timeout = EVERY if now < self._burst_until else \
            LINGER if self._waiting else self._until - now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._told.wait()
        self._told.clear()

    def _check(self) -> None:
        version = self._data_version()
        if version is None:
            return
        # a change: the version moved, or the file appeared since a look found none
        # (its first commits were before this connection's first version)
        if version != self._version and (self._version is not None or self._absent):
            self.count += 1
            event, self._changed = self._changed, asyncio.Event()
            event.set()
        self._version, self._absent = version, False

    def _data_version(self) -> int | None:
        try:
            if self._conn is None:
                if not self.path.exists():  # not created yet: opening would create it
                    self._absent = True
                    return None
                self._conn = sqlite3.connect(self.path, isolation_level=None,
                                             check_same_thread=False,
                                             timeout=self.busy_ms / 1000)
            row = self._conn.execute("PRAGMA data_version").fetchone()
            return int(row[0])
        except sqlite3.Error as exc:
            if not self._failed:  # said once: the waiters fall back on their timeouts
                self._failed = True
                log.warning("watching %s for commits of other processes: %s (falling "
                            "back on polling)", self.path, exc)
            self.close_conn()
            return None

    def close_conn(self) -> None:
        conn, self._conn, self._version = self._conn, None, None
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.close_conn()


__all__ = ["BURST", "EVERY", "LINGER", "Watch"]
