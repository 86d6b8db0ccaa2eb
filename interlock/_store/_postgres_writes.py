"""The PostgreSQL store's writes: new runs and appends, through each event loop's
committer (group commit).

A write is queued (`_queue`) and its caller awaits its own future. A committer -- a
task of the event loop, started by the first write queued while none runs -- takes the
writes queued by its turn, at most `BATCH_MAX` and one per run (a run's second write
must see its first committed: it waits for a later turn), and stores them in one
transaction. Up to `FLIGHTS` turns are committed at once, each by a committer of its
own on a connection of its own: a write queued while fewer run starts one, and a
committer that finds at least `2 * SPLIT` writes while another turn may start takes half
of them (another committer takes the rest). The database server works on both turns at
once, and the runs of the turn committed first go on while the other commits. A turn's
writes are those of runs with no write in flight. A turn is stored in one
transaction: the new runs in one statement, the appends in another, each append
checking the stored log's last seq and its claim's generation inside the statement. An
append that does not fit is left out by the statement and refused alone. When the
transaction fails as a whole (another process inserted one of the seqs: the primary key
``(run_id, seq)``), nothing of it was stored and each write is tried alone, so that the
refused one fails and only it. A turn of one write is that write's own statement.

Each append statement also ``NOTIFY``s the runs it grew (`_postgres_sql.RECORDS_CHANNEL`)
while a listener has announced itself (`_postgres_sql._LISTENED`): no statement or commit
more, and PostgreSQL delivers it at the commit, so a server streaming one of those runs
from another process reads them within milliseconds (`interlock._store._postgres_listen`).

Invariants: every queued future gets an outcome, even when a committer is cancelled
with its loop (`_commit_writes`'s ``except``: its turn's and the queued writes fail);
a caller cancelled while waiting does not cancel its write, which goes on (its future is
then skipped); a run has at most one write in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from psycopg import errors as pg_errors
from psycopg.rows import TupleRow

from .._log import Entry
from . import _postgres_search
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
from ._postgres_conn import Conn, PostgresConnections, _Pool, _Write, redact
from ._postgres_sql import (
    _APPEND,
    _APPEND_MANY,
    _CREATE_MANY,
    _CREATE_RUN,
    _RUN_NAMES,
    _UPDATE_SUMMARY,
)
from ._rows import (
    check_first_seqs,
    record_node,
    run_params,
    summary_params,
)
from ._search import CHAT_TYPES

# at most this many writes in one turn (more take several)
_CHAT = frozenset(CHAT_TYPES)
BATCH_MAX = 500
FLIGHTS = 2  # turns committed at once, each on its own connection
SPLIT = 16  # a turn is split in two only when both halves have at least this many writes


def _entry_arrays(entries: list[Entry]) -> dict[str, list[object]]:
    return {
        "seqs": [e.seq for e in entries],
        "types": [e.type for e in entries],
        "nodes": [record_node(e) for e in entries],
        "datas": [e.data.decode("utf-8") for e in entries],
        "hashes": [e.hash for e in entries],
    }



def _lease_for(row: RunRow) -> float | None:
    """A claimed new run's lease, in seconds from now (the server counts it)."""
    if row.owner is None or row.lease_until is None:
        return None
    return row.lease_until - time.time()


def _create_params(rows: list[tuple[RunRow, list[Entry]]]) -> dict[str, list[object]]:
    """`_CREATE_MANY`'s parameters for ``(row, entries)`` pairs."""
    params: dict[str, list[object]] = {f"c_{n}": [] for n in _RUN_NAMES}
    params["c_lease_for"] = []
    owners: list[str] = []
    records: list[Entry] = []
    for row, entries in rows:
        for name, value in zip(_RUN_NAMES, run_params(row), strict=True):
            params[f"c_{name}"].append(value)
        params["c_lease_for"].append(_lease_for(row))
        owners += [row.run_id] * len(entries)
        records += entries
    params.update(_entry_arrays(records), e_run=list(owners))
    return params


def _append_params(appends: list[tuple[Any, ...]]) -> dict[str, Sequence[object]]:
    """`_APPEND_MANY`'s parameters for ``(run_id, entries, summary, release, claim)``
    tuples."""
    owners: list[int] = []
    batch: dict[str, list[object]] = {k: [] for k in (
        "b_run", "b_prev", "b_status", "b_updated_at", "b_last_seq", "b_last_hash",
        "b_steps", "b_tokens", "b_error", "b_waiting", "b_release", "b_gen")}
    records: list[Entry] = []
    for i, (run_id, entries, summary, release, claim) in enumerate(appends, 1):
        values = (run_id, entries[0].seq - 1 if entries else None,
                  *summary_params(summary), release,
                  None if claim is None else claim.generation)
        for column, value in zip(batch.values(), values, strict=True):
            column.append(value)
        owners += [i] * len(entries)
        records += entries
    return {**batch, **_entry_arrays(records), "of": owners}


def _not_continued(run_id: str, last: int, entries: list[Entry]) -> ConflictError:
    """Why an append that was not applied did not fit the stored log (which ends at
    ``last``)."""
    try:
        check_first_seqs(run_id, last, entries)
    except ConflictError as exc:
        return exc
    return ConflictError(f"run {run_id!r}: append was not applied")  # pragma: no cover



class PostgresWrites(PostgresConnections):
    """`PostgresStore`'s new runs and appends, committed in turns (see the module)."""

    _chat_ready = False  # the messages' index and its trigger are known to be there

    async def _chat_index(self, entries: list[Entry]) -> None:
        """Before the first write of a conversation's message by this store: the index
        the database fills as messages are written (`_postgres_search.ready`)."""
        if self._chat_ready or not any(e.type in _CHAT for e in entries):
            return
        await self._do(_postgres_search.ready)
        self._chat_ready = True

    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        """Queued for this loop's committer, as appends are (`append`)."""
        check_first_seqs(row.run_id, 0, entries)
        await self._chat_index(entries)
        await self._queue(row.run_id, self._create_one, (row, list(entries)))
        if row.owner is None and row.summary.status == "PENDING":
            await self._notify_runnable()  # (a detached run: a worker's)

    async def _create_one(self, row: RunRow, entries: list[Entry]) -> None:
        params: dict[str, object] = dict(zip(_RUN_NAMES, run_params(row), strict=True))
        params.update(_entry_arrays(entries))
        params["lease_for"] = _lease_for(row)

        async def op(conn: Conn) -> None:
            try:
                cur = await conn.execute(_CREATE_RUN, params)
            except pg_errors.UniqueViolation as exc:
                raise ConflictError(f"run {row.run_id!r}: {exc}") from None
            found = await cur.fetchone()
            assert found is not None
            if found[0] == 0:
                raise RunExists(row.run_id)

        await self._do(op)

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        """Queued for this loop's committer, which stores the writes queued by the time it
        takes its turn in one transaction (group commit); returns once committed."""
        if entries:
            check_first_seqs(run_id, entries[0].seq - 1, entries)
            await self._chat_index(entries)
        await self._queue(run_id, self._append_one,
                          (run_id, list(entries), summary, release, claim))

    async def _queue(self, run_id: str, alone: Callable[..., Awaitable[None]],
                     args: tuple[Any, ...]) -> None:
        pool = self._here()
        fut: asyncio.Future[None] = pool.loop.create_future()
        pool.writes.append((run_id, alone, args, fut))
        if len(pool.committers) < FLIGHTS:
            self._start_committer(pool)
        await fut

    def _start_committer(self, pool: _Pool) -> None:
        pool.committers.add(pool.loop.create_task(self._commit_writes(pool)))

    @staticmethod
    def _take(pool: _Pool, share: bool) -> list[_Write]:
        """A turn's writes, taken from the queue: one per run with none in flight (every
        part of a turn's statement reads one snapshot, so its check of the log's end would
        not see a first write's records), at most `BATCH_MAX`; half of them when
        ``share`` and there are `2 * SPLIT` at least."""
        turn: list[_Write] = []
        rest: list[_Write] = []
        runs: set[str] = set()
        for item in pool.writes:
            if item[0] in runs or item[0] in pool.flying or len(turn) >= BATCH_MAX:
                rest.append(item)  # a run's next write waits for a later turn
            else:
                runs.add(item[0])
                turn.append(item)
        if share and len(turn) >= 2 * SPLIT:
            rest = turn[(len(turn) + 1) // 2:] + rest
            turn = turn[:(len(turn) + 1) // 2]
        pool.writes = rest
        pool.flying |= runs.intersection(item[0] for item in turn)
        return turn

    async def _commit_writes(self, pool: _Pool) -> None:
        """A committer of this loop: while writes wait, one transaction for a turn's worth
        (see `_take`); each caller gets its own outcome."""
        turn: list[_Write] = []
        try:
            while True:
                share = pool.turns + 1 < FLIGHTS
                turn = self._take(pool, share)
                if not turn:
                    break
                pool.turns += 1
                if share and pool.writes and len(pool.committers) < FLIGHTS:
                    self._start_committer(pool)  # (it takes the other half)
                if len(turn) == 1:
                    outcomes = [await self._outcome(turn[0][1](*turn[0][2]))]
                else:
                    outcomes = await self._write_many(turn)
                pool.turns -= 1
                pool.flying.difference_update(item[0] for item in turn)
                for (*_, fut), exc in zip(turn, outcomes, strict=True):
                    if fut.done():
                        continue  # its caller was cancelled (the write went on)
                    if exc is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(exc)
                turn = []
        except BaseException as exc:  # cancelled with the loop, say: nobody waits in vain
            if turn:
                pool.turns -= 1
            pool.flying.difference_update(item[0] for item in turn)
            for *_, fut in turn + pool.writes:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else StoreError(
                        f"PostgreSQL store {redact(self.url)}: the write was interrupted"))
            pool.writes = []
            raise
        finally:  # (at once: a write queued from now on starts another committer)
            task = asyncio.current_task()
            assert task is not None
            pool.committers.discard(task)

    @staticmethod
    async def _outcome(op: Awaitable[None]) -> Exception | None:
        try:
            await op
        except Exception as exc:
            return exc
        return None

    async def _write_many(self, turn: list[_Write]) -> list[Exception | None]:
        """Several runs' writes in one transaction: the new runs in one statement, the
        appends in another. When it fails as a whole -- another process wrote one of the
        seqs at the same moment, say -- each write is tried alone, so the refused one
        fails and only it."""
        creates = [item for item in turn if item[1] == self._create_one]
        appends = [item for item in turn if item[1] == self._append_one]
        create_params = _create_params([item[2] for item in creates]) if creates else None
        append_params = _append_params([item[2] for item in appends]) if appends else None

        async def op(conn: Conn) -> tuple[list[TupleRow], list[TupleRow]] | None:
            try:
                async with conn.transaction():
                    made: list[TupleRow] = []
                    done: list[TupleRow] = []
                    if create_params is not None:
                        made = await (await conn.execute(_CREATE_MANY, create_params)
                                      ).fetchall()
                    if append_params is not None:
                        done = await (await conn.execute(_APPEND_MANY, append_params)
                                      ).fetchall()
                    return made, done
            except pg_errors.UniqueViolation:
                return None  # the transaction was undone as a whole

        try:
            found = await self._do(op)
        except StoreError as exc:  # nothing of the turn was stored
            return [exc] * len(turn)
        if found is None:
            return [await self._outcome(item[1](*item[2])) for item in turn]
        made, done = found
        by_item: dict[int, Exception | None] = {}
        for item, (_, created, _) in zip(creates, made, strict=True):
            by_item[id(item)] = None if created else RunExists(item[0])
        for item, (_, exists, last, updated, _, gen, owner, _) in zip(appends, done,
                                                                 strict=True):
            run_id, entries, claim = item[2][0], item[2][1], item[2][4]
            outcome: Exception | None = None
            if not updated:
                outcome = RunNotFound(run_id) if not exists else ClaimLost(
                    run_id, owner, gen, claim.generation) if claim is not None and \
                    gen != claim.generation else _not_continued(run_id, int(last), entries)
            by_item[id(item)] = outcome
        return [by_item[id(item)] for item in turn]

    async def _append_one(self, run_id: str, entries: list[Entry], summary: Summary,
                          release: str | None, claim: Claim | None = None) -> None:
        status, updated_at, last_seq, last_hash, steps, tokens, error, waiting = (
            summary_params(summary))
        params: dict[str, object] = {
            "run": run_id, "status": status, "updated_at": updated_at, "last_seq": last_seq,
            "last_hash": last_hash, "steps": steps, "tokens": tokens, "error": error,
            "waiting": waiting, "release": release,
            "gen": None if claim is None else claim.generation,
        }
        if entries:
            first = entries[0].seq
            params.update(_entry_arrays(entries), prev=first - 1)

        async def op(conn: Conn) -> None:
            if not entries:
                cur = await conn.execute(_UPDATE_SUMMARY, params)
                if await cur.fetchone() is None:
                    cur = await conn.execute(
                        "SELECT owner, generation FROM runs WHERE run_id = %s", (run_id,))
                    found = await cur.fetchone()
                    if found is None:
                        raise RunNotFound(run_id)
                    assert claim is not None
                    raise ClaimLost(run_id, found[0], found[1], claim.generation)
                return
            try:
                cur = await conn.execute(_APPEND, params)
            except pg_errors.UniqueViolation:
                raise ConflictError(
                    f"run {run_id!r}: record {entries[0].seq} was written by another writer "
                    "at the same time; another writer got there first"
                ) from None
            found = await cur.fetchone()
            assert found is not None
            exists, last, _inserted, updated, gen, owner, _notified = found
            if not exists:
                raise RunNotFound(run_id)
            if not updated and claim is not None and gen != claim.generation:
                raise ClaimLost(run_id, owner, gen, claim.generation)
            if not updated:
                check_first_seqs(run_id, int(last), entries)  # raises ConflictError
                raise ConflictError(f"run {run_id!r}: append was not applied")  # pragma: no cover

        await self._do(op)

