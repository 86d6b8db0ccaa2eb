"""The store interface: where runs and their logs live.

A store is deliberately dumb. The engine numbers, serialises and hash-chains
records itself (`interlock._log`); a store keeps, per run, one summary row
and the ordered entries, and guarantees:

- ``append`` is atomic: the entries and the new summary are committed together
  or not at all, and committed before ``append`` returns (durability: a node's
  completion is committed before any successor starts);
- ``(run_id, seq)`` is unique: two writers appending the same ``seq`` -- two
  processes deciding the same approval, say -- cannot both succeed; the loser
  gets `ConflictError` and nothing of its batch is stored;
- a run is executed by one owner at a time (`claim`): a lease with expiry,
  taken over when the owner's lease ran out or, on the same host, its process
  is gone; ``force`` takes it regardless. Every claim bumps the run's claim
  *generation*; an append made under a `Claim` (owner and generation) is refused
  with `ClaimLost`, in the append's own transaction, once the run's generation has
  moved on (another owner claimed it since): a stale executor cannot write.

Every backend passes the same conformance suite (tests/store/test_store_conformance.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Self

from .._errors import (  # the store's errors live with every other error
    ClaimError,
    ClaimLost,
    ConflictError,
    RunExists,
    RunNotFound,
    StoreError,
)
from .._log import Entry

if TYPE_CHECKING:
    from ._search import Found

# a `Store.list_runs` limit meaning every run the store keeps (coverage, prune, metrics)
ALL_RUNS = 10_000_000

# the statuses of a run that has ended (what `Store.delete_finished` may delete)
FINISHED = ("COMPLETED", "FAILED", "REJECTED", "CANCELLED")

# the statuses of a run a worker may claim (`Store.claim_next`) when nobody holds it:
# detached and never executed, continued after a decision, or abandoned by its executor
RUNNABLE = ("PENDING", "RUNNING", "RETRYING")


def runnable(summary: Summary, now: float) -> bool:
    """Whether a run whose row says ``summary`` is for a worker to continue when nobody
    holds it: its status is `RUNNABLE`, or it waits at a gate whose deadline has passed
    (the engine decides it), or it waits at gates beside branches still to run (its
    ``waiting.running``: the executor that ran them is gone)."""
    if summary.status in RUNNABLE:
        return True
    if summary.status != "WAITING_APPROVAL":
        return False
    waiting = summary.waiting or {}
    deadline = waiting.get("deadline")
    return "running" in waiting or (deadline is not None and deadline <= now)


@dataclass(frozen=True, slots=True)
class Claim:
    """Who executes a run, and under which of its claims: the ``owner`` id and the run's
    claim ``generation`` (bumped by every claim, so a later claim by anyone -- a takeover,
    ``--force`` -- makes this one stale). What an executor's appends are fenced by, and
    what a node sees as ``ctx.claim``."""

    owner: str
    generation: int


@dataclass(slots=True)
class Summary:
    """What a run's row says about it; updated with every append."""

    status: str
    last_seq: int
    last_hash: str
    steps: int = 0
    tokens: int = 0
    error: dict[str, Any] | None = None
    waiting: dict[str, Any] | None = None
    updated_at: float = 0.0

    def copy(self) -> Summary:
        """A shallow copy."""
        return Summary(*_summary_values(self))


@dataclass(slots=True)
class RunRow:
    run_id: str
    workflow: str
    definition: dict[str, Any]  # WorkflowSpec.definition(): what the run executes
    definition_hash: str
    input: dict[str, Any]
    options: dict[str, Any]  # {"config": {...overrides}, "limits": {...overrides}}
    created_at: float
    summary: Summary
    parent_run: str | None = None
    parent_seq: int | None = None
    owner: str | None = None
    lease_until: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # bumped by every claim (`Store.claim`, `claim_next`, a takeover, ``force``); a run
    # created claimed has generation 1, one created unclaimed 0
    generation: int = 0

    def copy(self) -> RunRow:
        """A copy with its own summary; the other values are shared (as with
        `dataclasses.replace`). A store keeps and hands out copies, never its caller's row."""
        row = RunRow(*_row_values(self))
        row.summary = self.summary.copy()
        return row


# every field's value in `__init__`'s order: a copy in one call, not `dataclasses.replace`'s
# walk over the fields (rows are copied once per run, or more)
_summary_values = attrgetter(*(f.name for f in fields(Summary)))
_row_values = attrgetter(*(f.name for f in fields(RunRow)))


def light_row(row: RunRow) -> RunRow:
    """``row`` as `Store.list_page` gives it: no definition, input or options."""
    return RunRow(row.run_id, row.workflow, {}, row.definition_hash, {}, {}, row.created_at,
                  row.summary.copy(), row.parent_run, row.parent_seq, row.owner,
                  row.lease_until, dict(row.extra), row.generation)


_this_owner: tuple[int, str] = (-1, "")


def this_owner() -> str:
    """An owner id for this process: ``host:pid`` (an executor adds ``:suffix``).

    Computed once per process (a fork gets its own).
    """
    global _this_owner
    pid = os.getpid()
    if _this_owner[0] != pid:
        _this_owner = (pid, f"{socket.gethostname()}:{pid}")
    return _this_owner[1]


def owner_gone(owner: str) -> bool:
    """True when ``owner`` (``host:pid[:suffix]``) names a process on this host that no
    longer exists (or has exited and is not yet reaped: a zombie, on Linux -- a process
    SIGKILLed a moment ago stays one until its parent waits for it)."""
    parts = owner.split(":")
    if len(parts) < 2:
        return False
    host, pid = parts[0], parts[1]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # "pid (comm) S ...": the state follows the last ")"
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except OSError:  # (no /proc: not Linux)
        return False


class LeaseRenewer(ABC):
    """Renews leases of one store, called from one thread (the lease keeper's) only,
    never from an event loop: a blocked loop does not stop it."""

    @abstractmethod
    def renew(self, run_id: str, claim: Claim, lease: float) -> None:
        """Extend ``claim``'s lease to ``lease`` seconds from now (blocking). `ClaimLost`
        when the claim is no longer current; `StoreError` when the store cannot be
        reached (the keeper tries again)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Close its connection (it may be asked to `renew` again later)."""


class Store(ABC):
    """A place for runs. All methods are async; backends may use a thread inside."""

    url: str
    # True when `create_run` claims a row with an ``owner`` and `append` takes
    # ``release`` (the stores here): an executor then commits no claim and no release
    # of its own. A store written before these existed is used as it was.
    leases_in_writes = False
    # True when `append` takes ``claim`` and refuses a stale one (`ClaimLost`), `claim`
    # returns the new generation, `heartbeat` takes ``generation``, and
    # `lease_renewer` renews leases from a thread of its own (the stores here)
    fences_appends = False

    @abstractmethod
    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        """Store a new run and its first entries atomically. RunExists if the id is taken.

        A row with an ``owner`` is created claimed by it until ``lease_until`` (a new run
        has no other executor to refuse); the PostgreSQL store counts the lease from its
        server's clock."""

    @abstractmethod
    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        """Append entries and update the summary atomically. ConflictError if a seq is taken.

        With ``release`` (an owner), the run's lease is given up in the same transaction
        if that owner holds it, as `release` does (an executor's last append). With
        ``claim`` (`fences_appends` stores), nothing is stored and `ClaimLost` is raised
        when the run's claim generation is no longer ``claim.generation`` -- checked in
        the append's transaction, so no claim can slip in between."""

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRow:
        """The run's row. RunNotFound if there is none."""

    @abstractmethod
    async def entries(self, run_id: str, after: int = 0) -> list[Entry]:
        """The run's entries with seq > after, in order."""

    async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                           ) -> list[Entry]:
        """At most ``limit`` of the run's entries with seq > after, in order: one page of
        a long log. (This default slices `entries`; the stores read just the page.)"""
        return (await self.entries(run_id, after))[:limit]

    async def iter_entries(self, run_id: str, after: int = 0, page: int = 1000
                           ) -> AsyncIterator[list[Entry]]:
        """The run's entries with seq > after, in order, a page (`entries_page`) at a
        time: a reader of a long log holds one page, not the whole log."""
        page = max(page, 1)
        while True:
            batch = await self.entries_page(run_id, after, page)
            if batch:
                yield batch
            if len(batch) < page:
                return
            after = batch[-1].seq

    @abstractmethod
    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        """Runs, newest first, optionally filtered."""

    async def list_page(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100, before: tuple[float, str] | None = None,
                        updated_after: float | None = None) -> list[RunRow]:
        """One page of a list of runs, as a list shows them: newest first by
        ``(created_at, run_id)``; the runs after ``before`` (the ``(created_at, run_id)``
        of the previous page's last run: keyset paging, so a run created meanwhile shifts
        no page); of ``status`` / ``workflow`` only, and only those whose row changed
        after ``updated_after`` (a `Summary.updated_at`), when given.

        The rows are light: their ``definition``, ``input`` and ``options`` are read as
        empty (``{}``) -- `get_run` reads a run whole. This default sorts `list_runs`'
        rows; the stores here read the page alone, without those columns."""
        rows = [r for r in await self.list_runs(status=status, workflow=workflow,
                                                limit=ALL_RUNS)
                if (before is None or (r.created_at, r.run_id) < before)
                and (updated_after is None or r.summary.updated_at > updated_after)]
        rows.sort(key=attrgetter("created_at", "run_id"), reverse=True)
        return [light_row(r) for r in rows[:max(limit, 0)]]

    async def leases(self) -> list[dict[str, Any]]:
        """Who holds which run now: ``{run_id, workflow, status, owner, lease_until}``
        for each run with an owner, by owner then run (the workers view). The default
        reads the stores' rows the way `list_runs` does; the stores here ask for them."""
        rows = await self.list_runs(limit=ALL_RUNS)
        return sorted(({"run_id": r.run_id, "workflow": r.workflow,
                        "status": r.summary.status, "owner": r.owner,
                        "lease_until": r.lease_until}
                       for r in rows if getattr(r, "owner", None)),
                      key=lambda d: (d["owner"], d["run_id"]))

    @abstractmethod
    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int | None:
        """Become the run's executor for ``lease`` seconds. ClaimError if someone else is.

        Bumps the run's claim generation and returns it (`fences_appends` stores; others
        may return None): the ``generation`` of the `Claim` to append under."""

    async def claim_next(self, owner: str, lease: float, *,
                         workflows: Collection[str] | None = None,
                         exclude: Collection[str] = ()) -> str | None:
        """Claim the oldest runnable run for ``owner`` for ``lease`` seconds and return its
        id; None when there is none. Runnable (`runnable`): its status is one of
        `RUNNABLE` -- or it waits for a human at a gate whose deadline has passed (the
        engine decides it), or beside branches still to run -- and nobody holds it (never
        claimed, released, or its lease ran out); of ``workflows`` only, when given;
        never a child run (its parent's execution continues it), nor one of
        ``exclude`` (runs a worker cannot execute).

        Of any number of processes calling this at once, each run goes to one. This
        default lists and claims (a `ClaimError` skips the run); the stores here claim in
        one statement (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: in its single
        writer's transaction).
        """
        now = time.time()
        rows = [row for status in (*RUNNABLE, "WAITING_APPROVAL")
                for row in await self.list_runs(status=status, limit=ALL_RUNS)]
        for row in sorted(rows, key=attrgetter("created_at")):
            if (row.owner is not None and (row.lease_until or 0.0) > now) \
                    or not runnable(row.summary, now) \
                    or (workflows is not None and row.workflow not in workflows) \
                    or row.options.get("parent") is not None or row.run_id in exclude:
                continue
            try:
                await self.claim(row.run_id, owner, lease)
            except (ClaimError, RunNotFound):
                continue
            return row.run_id
        return None

    async def wait_runnable(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or sooner where the store can tell that a run
        may have become runnable (PostgreSQL: ``LISTEN``/``NOTIFY``). An idle worker
        waits here between two `claim_next`; this default sleeps."""
        await asyncio.sleep(timeout)

    async def wait_changed(self, timeout: float, seen: int | None = None,
                           run_id: str | None = None) -> int:
        """Return after ``timeout`` seconds, or sooner where the store can tell that
        something was committed to it by any process (SQLite: ``PRAGMA data_version``;
        PostgreSQL: records of ``run_id``, or of any run when it is None, by
        ``LISTEN``/``NOTIFY``) after ``seen`` -- a number this method returned before
        (None: from now on; where it has changed since, at once). The server's event
        streams wait here between two looks for records committed elsewhere. This
        default sleeps; either way the caller looks again after ``timeout`` (a detector
        may miss nothing, but the caller does not count on it)."""
        await asyncio.sleep(timeout)
        return 0

    @abstractmethod
    async def heartbeat(self, run_id: str, owner: str, lease: float,
                        generation: int | None = None) -> None:
        """Extend our lease. `ClaimLost` if we lost it (another owner, or with
        ``generation``, a later claim)."""

    def lease_renewer(self) -> LeaseRenewer | None:
        """Something that renews this store's leases from a thread other than the event
        loop's (`interlock._engine._lease`), with a connection of its own; None where the store
        has none (its leases are then renewed on the event loop, by `heartbeat`)."""
        return None

    @abstractmethod
    async def release(self, run_id: str, owner: str) -> None:
        """Give the run up (no error if we no longer hold it)."""

    @abstractmethod
    async def request_cancel(self, run_id: str, by: str | None) -> None:
        """Ask the run's executor (in whatever process) to cancel it: ``extra.cancel``."""

    @abstractmethod
    async def cancel_requested(self, run_id: str) -> dict[str, Any] | None:
        """``{"by", "at"}`` when a cancellation was requested, else None."""

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any]
                             ) -> dict[str, Any] | None:
        """Keep ``decision`` for the gate ``gate`` of the run (``extra.decisions``) unless
        one is kept for it already, atomically: None when this one is kept (it wins),
        else the one kept first. A decision is offered before it is recorded in the log,
        so that exactly one decision per gate wins even when the run is being executed
        elsewhere (whose executor folds it in: `decisions`). This default keeps them in
        this process only; the stores keep them in the run's row."""
        kept: dict[str, dict[str, dict[str, Any]]] = self.__dict__.setdefault(
            "_decisions", {})
        await self.get_run(run_id)  # (RunNotFound)
        mine = kept.setdefault(run_id, {})
        if gate in mine:
            return dict(mine[gate])
        mine[gate] = dict(decision)
        return None

    async def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The decisions offered for the run's gates (`offer_decision`), by gate."""
        kept: dict[str, dict[str, dict[str, Any]]] = self.__dict__.setdefault(
            "_decisions", {})
        return {k: dict(v) for k, v in kept.get(run_id, {}).items()}

    @abstractmethod
    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        """Keep ``data`` as the run's latest snapshot (a cached fold at ``seq``)."""

    @abstractmethod
    async def load_snapshot(self, run_id: str) -> tuple[int, bytes] | None:
        """The run's latest snapshot as ``(seq, data)``, or None."""

    @abstractmethod
    async def delete_finished(self, run_ids: list[str]) -> tuple[list[str], int]:
        """Delete those of ``run_ids`` that are still finished (completed, failed,
        rejected, cancelled) and unclaimed, with their records and snapshots, in one
        transaction: ``(the runs deleted, the records deleted)``. A run that was resumed
        meanwhile is left alone."""

    async def get_cursor(self, name: str) -> str | None:
        """The cursor kept under ``name`` (a poll trigger's: JSON text), or None. This
        default keeps cursors in this process only; SQLite and PostgreSQL keep them in
        their ``cursors`` table, for every process and across restarts."""
        cursors: dict[str, str] = self.__dict__.setdefault("_cursors", {})
        return cursors.get(name)

    async def set_cursor(self, name: str, value: str) -> None:
        """Keep ``value`` as the cursor under ``name`` (it replaces the one kept)."""
        cursors: dict[str, str] = self.__dict__.setdefault("_cursors", {})
        cursors[name] = value

    async def search_messages(self, workflow: str, query: str, *, limit: int = 5,
                              exclude: str | None = None) -> list[Found]:
        """The messages of the conversations of ``workflow`` (their ``chat.message`` and
        ``chat.reply`` records) that best match ``query``'s words, best first, leaving
        out run ``exclude`` (``recall``). This default scans the records;
        SQLite searches an FTS5 index, PostgreSQL its full-text search."""
        from ._search import scan

        return await scan(self, workflow, query, limit, exclude)

    async def size_bytes(self) -> int | None:
        """What the store takes up (a SQLite file with its WAL, PostgreSQL's tables),
        or None when it cannot tell."""
        return None

    async def reclaim(self) -> None:  # noqa: B027 - optional hook
        """Give back the space deleted rows held (SQLite's VACUUM, PostgreSQL's)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    async def close_soon(self) -> None:
        """`close`, where a store can, without waiting for the end of it (the last user of
        a shared store, `release_store`); this default waits."""
        await self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


__all__ = ["RUNNABLE", "Claim", "ClaimError", "ClaimLost", "ConflictError", "Entry",
           "LeaseRenewer", "RunExists", "RunNotFound", "RunRow", "Store", "StoreError",
           "Summary", "light_row", "owner_gone", "this_owner"]
