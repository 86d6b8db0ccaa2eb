"""The SQLite store's writes, as operations inside a transaction they neither open nor
commit: a new run, an append (fenced by its claim's generation), and the writes of one
turn of the writer thread committed together (group commit), each under a savepoint so
that a refused one fails alone.

Everything here runs on the store's writer thread (`interlock._store._sqlite_thread`), or
on the event loop's while the writer is idle and lends it the connection
(`interlock._store._sqlite_inline`).
"""

from __future__ import annotations

import sqlite3
import time

from .._log import Entry
from . import _sqlite_search
from ._base import (
    Claim,
    ClaimLost,
    ConflictError,
    RunExists,
    RunNotFound,
    RunRow,
    StoreError,
    Summary,
)
from ._rows import (
    check_first_seqs,
    run_params,
    summary_params,
)
from ._sqlite_ops import SQLiteOps
from ._sqlite_sql import (
    _APPEND_CHECK,
    _INSERT_RECORD,
    _INSERT_RUN,
    _INSERT_SPEC,
    _ROW_AT,
    _SPEC_AT,
    _UPDATE_SUMMARY,
    _UPDATE_SUMMARY_IF,
    MAX_RUN_KEY,
    SEQ_BITS,
    SEQ_MASK,
)
from ._sqlite_thread import Done, Write
from ._sqlite_wal import SQLiteWal


class SQLiteWrites(SQLiteWal, SQLiteOps):
    """`SQLiteStore`'s writes on the writer thread (see the module)."""

    def _rows(self, run_key: int, entries: list[Entry]) -> list[tuple[int, str, bytes]]:
        self._bytes_since_checkpoint += sum(len(e.data) for e in entries)
        base = run_key << SEQ_BITS
        return [(base | e.seq, e.data.decode("utf-8"), bytes.fromhex(e.hash))
                for e in entries]

    # Writes are operations run inside a transaction they do not open or commit: the
    # writer runs one alone in ``BEGIN IMMEDIATE ... COMMIT`` (`_alone`), or the writes
    # queued one after the other together in one (`_together`), each under a savepoint.

    def _create_in(self, conn: sqlite3.Connection, row: RunRow, entries: list[Entry]) -> None:
        params = run_params(row)
        try:
            run_key = conn.execute(_INSERT_RUN, [params[i] for i in _ROW_AT]).lastrowid
        except sqlite3.IntegrityError:
            raise RunExists(row.run_id) from None
        assert run_key is not None
        if run_key > MAX_RUN_KEY:
            raise StoreError(f"SQLite store {self.path} has numbered {MAX_RUN_KEY:,} runs, "
                             "as many as one file holds; start a new store file")
        conn.execute(_INSERT_SPEC, (run_key, *(params[i] for i in _SPEC_AT)))
        conn.executemany(_INSERT_RECORD, self._rows(run_key, entries))
        _sqlite_search.index(conn, run_key, entries)  # (a fork's, an import's messages)

    def _append_in(self, conn: sqlite3.Connection, run_id: str, entries: list[Entry],
                   summary: Summary, release: str | None, claim: Claim | None = None) -> None:
        params = summary_params(summary)  # params[0] is the status
        prev = entries[0].seq - 1 if entries else None
        if entries and entries[-1].seq > SEQ_MASK:
            raise StoreError(f"run {run_id!r}: a SQLite store holds {SEQ_MASK:,} records "
                             "a run at most")
        held = None if claim is None else claim.generation
        # Fencing: the claim's generation and the log's end are checked in the very
        # transaction that writes, which holds the file's one write lock (BEGIN IMMEDIATE,
        # alone or the group commit's): no claim, in this process or another, can commit
        # between the check and the records. The common case is one statement -- the
        # summary updated only if the status is unchanged, the log ends at ``prev`` and
        # the generation is still the claim's; when it updates nothing, the row says
        # why (no run, claimed since, another writer's records), or only the status
        # changed, which the second UPDATE writes.
        done = conn.execute(_UPDATE_SUMMARY_IF, (*params[1:], run_id, summary.status,
                                                 prev, held)).fetchall()  # [(run_key,)] or []
        if not done:
            found = conn.execute(_APPEND_CHECK, (run_id,)).fetchone()
            if found is None:
                raise RunNotFound(run_id)
            if held is not None and found[3] != held:  # claimed since: fenced off
                raise ClaimLost(run_id, found[4], found[3], held)
            check_first_seqs(run_id, found[1], entries)  # raises ConflictError
            conn.execute(_UPDATE_SUMMARY, (*params, run_id))  # the status changes
            done = [found[2:]]
        if entries:
            try:
                conn.executemany(_INSERT_RECORD, self._rows(done[0][0], entries))
            except sqlite3.IntegrityError as exc:
                raise ConflictError(f"run {run_id!r}: {exc}; another writer got there "
                                    "first") from None
            _sqlite_search.index(conn, done[0][0], entries)  # a conversation's messages
        if release is not None:
            self._release(conn, run_id, release)

    def _write_batch(self, batch: list[Write]) -> list[Done]:
        """On the writer thread: the writes of one turn (``(operation, args)`` each),
        committed in one transaction; each one's outcome, in order.

        A write that is refused (a conflict, a run that is not there, a claim held by
        another) is undone to its savepoint and fails alone: the others commit. When the
        transaction as a whole fails (the commit, the write lock), every write of it
        fails and none is stored.
        """
        try:
            if self._space_wanted:  # the disk was full: the WAL's space back first
                if time.monotonic() >= self._space_next:
                    self._give_space_back(self._conn or self._open())
                if self._space_wanted:  # (a write now would take the space freed)
                    raise StoreError(
                        f"SQLite store {self.path}: the disk is full; no write is made until "
                        "the store's WAL is checkpointed into the file and truncated, which "
                        "needs some free space on the disk: free some, and the write can be "
                        "tried again")
            elif self._space_freed and self._wal_too_big():
                # once a disk was full here: the WAL is truncated before it takes half the
                # space left (the store's own checkpoints come every CHECKPOINT_EVERY jobs,
                # and the WAL's space would be gone before the next one)
                self._give_space_back(self._conn or self._open(), quiet=True)
            freed = self._space_freed
            try:
                return self._batch(batch)
            except StoreError:
                if self._space_freed == freed:
                    raise
                # the disk was full (nothing of the batch was stored), and truncating the
                # WAL gave space back: the batch once more, in that space
                return self._batch(batch)
        except BaseException as exc:  # nothing of the batch was committed
            return [(None, exc)] * len(batch)

    def _batch(self, batch: list[Write]) -> list[Done]:
        if len(batch) == 1:
            return [(self._run(self._alone, *batch[0]), None)]
        return self._run(self._together, batch)

    def _together(self, conn: sqlite3.Connection, batch: list[Write]) -> list[Done]:
        outcomes: list[Done] = []
        conn.execute("BEGIN IMMEDIATE")
        for op, args in batch:
            conn.execute("SAVEPOINT interlock_write")
            try:
                outcomes.append((op(conn, *args), None))
            except StoreError as exc:
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, exc))
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, self._error(exc)))
            except Exception as exc:  # a bug in one write's values fails that write only
                conn.execute("ROLLBACK TO interlock_write")
                outcomes.append((None, exc))
            conn.execute("RELEASE interlock_write")
        conn.execute("COMMIT")
        return outcomes

