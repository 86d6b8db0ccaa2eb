"""The SQLite store's writes on the event loop's own thread, when its writer is idle.

A write normally hops to the store's writer thread and back (`interlock._store.
_sqlite_thread`): two thread wake-ups, about as long as the commit itself for a lone
run's step. When nothing else is queued or running on the writer, and nothing else is
ready to run on the event loop, the write runs right there instead -- the same
function (`SQLiteWrites._write_batch`) on the same connection, so its transaction, its
fencing and its errors are exactly those of the thread. The rules that keep that safe:

- **Order.** `_Writer.begin_inline` lends the connection only when no job is queued or
  running; a job queued while an inline write runs waits for it. So jobs still run in
  the order they were made, and concurrent runs -- whose writes find others queued --
  keep their group commits on the thread.
- **Nothing else waits.** Only when the event loop has no other callback ready
  (`loop_idle`): a loop busy with other runs or requests hands the write to the thread,
  where it may join a group commit, while the loop goes on. asyncio's own loops keep
  their ready callbacks in ``_ready``; a loop without it (another implementation)
  always uses the thread.
- **No waiting for a lock on the loop.** The inline write asks for the file's write lock
  with a busy timeout of 0. Held by another connection (another process, the lease
  keeper's), the write is not made here and goes to the thread, which waits for the lock
  up to ``busy_timeout``, as before. A transaction that fails is rolled back whole, so
  trying it again there is safe.
- **Not after a full disk.** Once a write has failed for want of space, writes go to the
  thread, which gives the WAL's space back first (a checkpoint, with fsyncs;
  `interlock._store._sqlite_wal`) -- also when the failing write was made inline.
- **Checkpoints stay off the loop.** The inline write only asks the checkpointer's
  thread for one, as the writer does.
- **The loop is given back.** A run whose steps never wait would otherwise hold the
  event loop for as long as it runs; after `YIELD_EVERY` seconds of inline writes, the
  write yields once (``asyncio.sleep(0)``) so that timers and I/O are served.

- **No waiting for the disk on the loop.** With ``synchronous=normal`` (the default) or
  ``off`` a WAL commit only hands its pages to the operating system; with ``full`` or
  ``extra`` it waits for an fsync, as long as the disk takes (milliseconds here, far
  more on a busy disk), so those writes always go to the thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable

from ._sqlite_thread import Done, _Writer
from ._sqlite_writes import SQLiteWrites

# how long inline writes may go on without yielding to the event loop once
YIELD_EVERY = 0.002

_BUSY = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
# the ``synchronous`` settings whose WAL commit does not wait for the disk
_NO_FSYNC = ("off", "normal")


def loop_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no callback other than the caller's is ready to run on ``loop``."""
    ready = getattr(loop, "_ready", None)  # asyncio's BaseEventLoop; None elsewhere
    return ready is not None and not ready


def _busy(exc: BaseException) -> bool:
    """Whether a write failed because another connection held the write lock."""
    cause = exc.__cause__
    return isinstance(cause, sqlite3.OperationalError) \
        and (getattr(cause, "sqlite_errorcode", 0) & 0xFF) in _BUSY


class SQLiteInline(SQLiteWrites):
    """`SQLiteStore`'s writes run on the event loop's thread when its writer is idle (see
    the module)."""

    # set by `SQLiteStore.__init__`
    _yielded_at: float  # (time.monotonic) when an inline write last yielded the loop

    def _write_here(self, writer: _Writer, op: Callable[..., object],
                    args: tuple[object, ...]) -> Done | None:
        """Run the write ``op(conn, *args)`` on this thread in a transaction of its own,
        if the writer is idle and lends its connection: its outcome, as the writer would
        have handed it back; None if it was not run (or found the write lock held: not
        made), for the thread to do."""
        if self._synchronous not in _NO_FSYNC or self._space_wanted or self._space_freed \
                or not writer.begin_inline():
            return None
        try:
            conn = self._conn
            if conn is None:  # not opened yet: opening waits for locks, on the thread
                return None
            conn.execute("PRAGMA busy_timeout = 0")
            self._lent = True
            try:
                (done,) = self._write_batch([(op, args)])
            finally:
                self._lent = False
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        finally:
            writer.end_inline()
        if done[1] is not None and _busy(done[1]):
            return None  # nothing was written: the thread waits for the lock
        return done

    def _time_to_yield(self) -> bool:
        """After an inline write: whether to give the event loop a turn now."""
        now = time.monotonic()
        if now - self._yielded_at < YIELD_EVERY:
            return False
        self._yielded_at = now
        return True
