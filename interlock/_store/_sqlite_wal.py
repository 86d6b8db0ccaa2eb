"""The SQLite store's WAL kept small: checkpoints asked of the checkpointer thread every
`CHECKPOINT_EVERY` jobs or `CHECKPOINT_BYTES` of records, and the WAL's space given back
when the disk is full.

The full-disk rule a maintainer must keep: once a write has failed for want of space,
no write is made until the WAL has been checkpointed into the file and truncated
(`_give_space_back`). A PASSIVE checkpoint leaves the WAL file as large as it was, and
SQLite would refill the space freed with the next writes' pages; so the first space that
becomes free goes to the checkpoint, never to a write. After a disk was found full once,
the WAL is also truncated before it takes half the space left (`_wal_too_big`).

Everything here runs on the store's writer thread (or on the event loop's, while the
writer lends it the connection: `interlock._store._sqlite_inline`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ._sqlite_file import SQLiteFile

T = TypeVar("T")

# a checkpoint after this many jobs (transactions, mostly: a step's commit writes 3-5
# pages) or this many bytes of records, whichever comes first: about SQLite's own
# default of a checkpoint per 1000 WAL pages
CHECKPOINT_EVERY = 250
CHECKPOINT_BYTES = 4 << 20
_SPACE_RETRY = 1.0  # seconds before the WAL's truncation is tried again, after a busy one


class SQLiteWal(SQLiteFile):
    """Each job run on the connection counted towards a checkpoint; the WAL's space given
    back after a full disk (see the module)."""

    # set by `SQLiteStore.__init__`; the writer thread's only
    _jobs_since_checkpoint: int
    _bytes_since_checkpoint: int
    _space_next: float
    _space_said: bool
    _space_freed: int
    _lent: bool  # a job is running on the event loop's thread (`_sqlite_inline`)

    def _run(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)``, a job of the writer thread, on the connection (opened
        on first use); a job that fails leaves no transaction open behind it."""
        conn = self._conn or self._open()
        self._jobs_since_checkpoint += 1
        if self._jobs_since_checkpoint >= CHECKPOINT_EVERY \
                or self._bytes_since_checkpoint >= CHECKPOINT_BYTES:
            self._checkpoint(conn)
        full_before = self._space_wanted
        try:
            return fn(conn, *args)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            raise self._error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        finally:
            # the disk was found full by this job (`_error`): the WAL's space is given
            # back now, after its transaction was rolled back and before the next job
            # may take that space -- on the writer thread: a job run on the event loop's
            # (`_lent`) leaves it to the next write, which goes to the thread
            if self._space_wanted and not full_before and not conn.in_transaction \
                    and not self._lent:
                self._give_space_back(conn)  # the disk was found full just now

    def _wal_too_big(self) -> bool:
        """Whether the WAL takes more than half the space left on its disk."""
        try:
            free = shutil.disk_usage(self.path.parent).free
            wal = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return False
        return wal > free // 2

    def _give_space_back(self, conn: sqlite3.Connection, quiet: bool = False) -> None:
        """After a write failed on a full disk: copy the WAL into the file and truncate
        the WAL (``wal_checkpoint(TRUNCATE)``), which gives back the WAL file's space --
        a PASSIVE checkpoint leaves its size as it is, so freed space would fill again at
        once. While the disk is too full for the copy, it is tried again before each
        write (and writes are refused), so the first space freed goes to the checkpoint
        rather than to the WAL; after a reader or writer kept it from its end, not for
        `_SPACE_RETRY` seconds. Says what it did, once per full disk."""
        self._space_next = 0.0
        self._jobs_since_checkpoint = self._bytes_since_checkpoint = 0
        log = logging.getLogger("interlock")
        wal = Path(f"{self.path}-wal")
        before = wal.stat().st_size if wal.exists() else 0
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            if not self._space_said:
                self._space_said = True
                log.error("the disk of the SQLite store %s is full; checkpointing its WAL "
                          "(%d bytes) into the file to give that space back failed too "
                          "(%s): free space on the disk; the checkpoint is tried again "
                          "before each write", self.path, before, exc)
            return
        if busy:
            self._space_next = time.monotonic() + _SPACE_RETRY
            if not self._space_said:
                self._space_said = True
                log.error("the disk of the SQLite store %s is full; its WAL (%d bytes) "
                          "could not be truncated: another connection was reading or "
                          "writing it for longer than the busy timeout; tried again before "
                          "each write", self.path, before)
            return
        after = wal.stat().st_size if wal.exists() else 0
        self._space_wanted = self._space_said = False
        self._space_freed += 1
        log.log(logging.DEBUG if quiet else logging.WARNING,
                "the disk of the SQLite store %s was full: its WAL was checkpointed into the "
                "file and truncated, giving back %d bytes", self.path, before - after)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Ask the checkpointer for a checkpoint; if it has failed, let SQLite checkpoint
        on commit again (the WAL would otherwise grow without end)."""
        self._jobs_since_checkpoint = self._bytes_since_checkpoint = 0
        ck = self._checkpointer
        if ck is None:
            return
        if ck.failed is None:
            ck.request()
            return
        self._checkpointer = None
        ck.stop()
        conn.execute("PRAGMA wal_autocheckpoint = 1000")

