"""The journal: where a run's records go -- the only part of the executor that touches
the store.

`add`/`stage` seal a record with the run's `LogWriter` (numbered, timestamped,
chained) and fold it into the `RunView` at once; `flush` stores everything staged in
one transaction, with the run's `Summary` (what a store's run row shows), and now and
then a snapshot. So the view runs *ahead* of the store by what is staged: the
scheduler's rule is that nothing that depends on a staged record starts before the
flush that stores it.

A record is staged only once the fold has taken it (a record the fold refuses leaves
the writer where it was: no gap in the numbering). A batch the store does not take is
never dropped: the append is tried again for up to `Journal.retry_for` seconds (an
outage, a full disk, a restarted database); a try that finds the batch stored already
(the same seqs with the same hashes: an earlier try committed but its answer was lost)
counts as done. When the store still refuses it -- or refuses it for good: a conflict,
a claim no longer held -- the journal is *broken*: its batch stays staged, every later
flush raises the same error (never a false "another writer got there first"), and the
executor gives the run up, unfinished, for whoever claims it next to continue from the
last stored record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from .. import _log as L
from .._errors import ClaimError, ConflictError, RunNotFound, StoreError
from .._store import Claim, Store, Summary
from . import _snapshot as snapshots
from ._fold import RunView
from ._gates import shown
from ._records import Item
from ._staging import Staging

log = logging.getLogger("interlock")

_new_summary = object.__new__

RETRY_SECONDS = 10.0  # how long a failed append is tried again before the run is given up
RETRY_FIRST_DELAY = 0.05  # the first pause between two tries; doubled up to RETRY_MAX_DELAY
RETRY_MAX_DELAY = 1.0


class StoreOutage(BaseException):
    """The run's records could not be stored (`Journal` is broken): ``error`` says why.

    Raised where a node's body would see it (``ctx.once``, ``ctx.log``) instead of the
    store's error, and a `BaseException` for the same reason as a pause is one: the
    body's ``except Exception:``, ``retry:`` and the node's error edges must not take an
    outage of the store for the node's own failure. The scheduler gives the run up with
    ``error`` (`_runner.Runner.execute`).
    """

    def __init__(self, error: StoreError) -> None:
        super().__init__(str(error))
        self.error = error


class Journal(Staging):
    """Seals, folds, stages (`_staging.Staging`) and stores one run's records (a
    `_records.Sink`)."""

    def __init__(self, store: Store, run_id: str, view: RunView, writer: L.LogWriter,
                 listener: Callable[[L.Record, RunView], object] | None = None,
                 owner: str | None = None,
                 claim: Claim | None = None) -> None:
        self.store = store
        # the claim every append is made under (refused by the store once another owner
        # claimed the run: `ClaimLost`, which breaks the journal), where the store
        # fences appends
        self.claim = claim if getattr(store, "fences_appends", False) else None
        # the executor's lease, given up by the append that ends the run (``released``),
        # where the store can (`Store.leases_in_writes`)
        self.owner = owner if getattr(store, "leases_in_writes", False) else None
        self.released = False
        self.run_id = run_id
        super().__init__(view, writer, listener)
        # a flush in flight (see `flush`); the others wait for ``_idle``, counted in
        # ``_waiting``
        self._flushing = False
        self._waiting = 0
        self._idle = asyncio.Event()
        # records after this seq are not in a snapshot: the log's latest one, as the load
        # found it -- not where this journal starts, or a run continued a few records at
        # a time (a conversation, a turn per process) would never take one
        self._snapshot_seq = min(view.snapshot_at, writer.seq)
        self._snapshot_every = snapshots.EVERY
        # set when a batch could not be stored (see `flush`): the run cannot go on here
        self.broken: StoreError | None = None
        self.retry_for = RETRY_SECONDS
        # a batch put back after a cancelled append, which may have been stored anyway
        self._unsure = False

    # Flushes are serialised with a flag, not an `asyncio.Lock` (its acquire and release
    # are three calls, once per step): the common flush finds none in flight and takes its
    # turn with a test and a store. Safe because it runs on the event loop's thread and
    # nothing awaits between the test and the store: two flushes cannot both see
    # ``_flushing`` false (`_wait_turn` tests again after each wait).
    async def flush(self) -> None:
        """Commit every staged record (one transaction); now and then, a snapshot.

        Flushes are serialised: one that finds another in flight waits for it, so when
        this returns, what was staged before it is stored.

        Raises the store's error when the batch could not be stored (tried again for
        `retry_for` seconds, `_append`): the journal is then broken, the batch stays
        staged, and every later flush raises that error again.
        """
        if self._flushing:
            await self._wait_turn()
        self._flushing = True
        try:
            if self.broken is not None:
                raise self.broken
            if self._deferred is not None:
                self.started()  # a visit running while something flushes: it started
            if not self._staged:
                return
            entries, self._staged = self._staged, []
            # the view matches the log up to entries[-1] right now, before any await
            snap = None
            release: str | None = None
            if entries[-1].type in L.TERMINAL_TYPES:
                release = self.owner
            elif entries[-1].seq - self._snapshot_seq >= self._snapshot_every:
                at = entries[-1].seq
                snap = snapshots.dump(self.view, entries[-1].hash)
                # bound to the chain: its digest rides in this batch, the row follows it
                entries.append(self._seal(*snapshots.taken(at, snap)))
            # the run's summary (the store's run row), made here and without its dataclass
            # ``__init__`` (two calls less per step): a bare instance, every slot set here
            v = self.view
            summary = _new_summary(Summary)
            summary.last_seq, summary.last_hash = self.writer.seq, self.writer.hash
            summary.steps, summary.tokens, summary.error = v.steps, v.tokens, v.error
            # a gate waits: the row shows it in the very write that commits it (`shown`)
            summary.status, summary.waiting = shown(v) if v.gates else (v.status, v.waiting)
            summary.updated_at = time.time()
            try:
                try:  # the first try, with no coroutine of ours (`_try`); then `_append`
                    await self._try(entries, summary, release)
                except Exception as failed:  # (a conflict on a sure first try: another's)
                    if isinstance(failed, ClaimError | RunNotFound) or (
                            isinstance(failed, ConflictError) and not self._unsure):
                        raise
                    await self._append(entries, summary, release, failed)
            except BaseException as exc:
                self._put_back(entries, exc)  # (raises, for any other error)
                raise  # the store's error, or a cancellation (the batch may be flushed again)
            self._unsure = False
            if release is not None:
                self.released = True
            if snap is not None:
                await self._save_snapshot(at, snap)
        finally:
            self._flushing = False
            if self._waiting:
                self._idle.set()

    async def _wait_turn(self) -> None:
        """Wait until no flush is in flight (see `flush`)."""
        while self._flushing:
            self._waiting += 1
            self._idle.clear()
            try:
                await self._idle.wait()
            finally:
                self._waiting -= 1

    def _put_back(self, entries: list[L.Entry], exc: BaseException) -> None:
        """The batch ``entries`` was not stored (``exc``): nothing is dropped. It is staged
        again, before anything staged since, and the journal says why it cannot go on
        (``broken``, raised) -- unless the append was cancelled, which leaves it unsure
        whether the batch was stored, for the next flush to find out."""
        self._staged[:0] = entries
        if not isinstance(exc, Exception):
            self._unsure = True
        if isinstance(exc, StoreError):
            self.broken = exc
        elif isinstance(exc, Exception):
            self.broken = self._failed(entries, 1, 0.0, exc)
            raise self.broken from exc

    async def _save_snapshot(self, at: int, snap: bytes) -> None:
        """Save the snapshot of the view at record ``at``, whose ``snapshot.taken`` is
        stored; a snapshot that is not saved is only a resume that folds more."""
        try:
            await self.store.save_snapshot(self.run_id, at, snap)
        except Exception as exc:  # a snapshot saves time on load; the log is whole
            log.warning("run %s: the snapshot at record %d was not saved (%s: %s); "
                        "loading the run folds its log instead", self.run_id, at,
                        type(exc).__name__, exc)
        else:
            self._snapshot_seq = at
            self._snapshot_every = snapshots.interval(len(snap))

    def _try(self, entries: list[L.Entry], summary: Summary, release: str | None
             ) -> Awaitable[None]:
        """One try of the append: the store's own coroutine (no frame of ours around it)."""
        store, run_id = self.store, self.run_id
        if self.claim is not None:
            return store.append(run_id, entries, summary, release, claim=self.claim)
        if release is None:
            return store.append(run_id, entries, summary)
        return store.append(run_id, entries, summary, release=release)

    async def _append(self, entries: list[L.Entry], summary: Summary,
                      release: str | None, failed: Exception) -> None:
        """Append one batch whose first try (`flush`'s) failed with ``failed``: an error
        of the store is retried for `retry_for` seconds.

        A refusal that no retry can change is raised at once: the claim is another's
        (`ClaimError`), the run is gone (`RunNotFound`), a record's seq is taken by
        another writer (`ConflictError`) -- unless a try before found the store
        failing (or was cancelled): the seqs taken may then be this batch's own, stored
        by a try whose answer was lost, which counts as done when the stored records
        have this batch's hashes. Anything else (an outage, a full disk, a lost
        connection) is tried again, with a growing pause; at the end, a `StoreError`
        saying what failed.
        """
        run_id = self.run_id
        tries = 0
        deadline = 0.0
        delay = RETRY_FIRST_DELAY
        exc = failed
        while True:
            cause = exc
            if isinstance(exc, ConflictError):
                # after a failed or cancelled try the seq may be ours, stored by the try
                # whose answer was lost (compare hashes)
                try:
                    if await self._stored(entries):
                        log.info("run %s: records %d-%d were stored by an earlier try",
                                 run_id, entries[0].seq, entries[-1].seq)
                        return
                except Exception as read_error:  # the store is still failing: try again
                    cause = read_error
                else:
                    raise ConflictError(
                        f"{exc} (records {entries[0].seq}-{entries[-1].seq} were not stored "
                        "by an earlier try of this executor, whose answer was lost: another "
                        "writer's are stored there -- the run was taken over)") from None
            # the retry window opens at the first failure, not at the flush: a batch
            # that waited for another flush in flight still gets its whole window
            tries += 1
            now = time.monotonic()
            if tries == 1:
                deadline = now + self.retry_for
            if now + delay > deadline:
                raise self._failed(entries, tries, now - deadline + self.retry_for, cause) \
                    from cause
            log.warning("run %s: storing records %d-%d failed (%s: %s); trying again in "
                        "%.2fs", run_id, entries[0].seq, entries[-1].seq,
                        type(cause).__name__, cause, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)
            try:
                await self._try(entries, summary, release)
                return
            except (ClaimError, RunNotFound):
                raise
            except Exception as again:
                exc = again

    async def _stored(self, entries: list[L.Entry]) -> bool:
        """Whether the store holds ``entries`` already (the same seqs, the same hashes)."""
        got = await self.store.entries_page(self.run_id, entries[0].seq - 1, len(entries))
        return [(e.seq, e.hash) for e in got] == [(e.seq, e.hash) for e in entries]

    def _failed(self, entries: list[L.Entry], tries: int, spent: float,
                cause: BaseException) -> StoreError:
        what = f"{type(cause).__name__}: {cause}"
        return StoreError(
            f"run {self.run_id!r}: records {entries[0].seq}-{entries[-1].seq} could not be "
            f"stored ({tries} tries over {spent:.1f}s; the store said {what}); the run "
            f"stops here unfinished, its log intact up to record {entries[0].seq - 1}: once "
            "the store is back, a resume of the run on this store (or a worker) continues it")

    async def commit(self, items: list[Item]) -> list[L.Record]:
        recs = self.stage(items)
        await self.flush()
        return recs


__all__ = ["RETRY_SECONDS", "Journal", "StoreOutage"]
