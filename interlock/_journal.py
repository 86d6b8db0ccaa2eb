"""The journal: where a run's records go -- the only part of the executor that touches
the store.

`add`/`stage` seal a record with the run's `LogWriter` (numbered, timestamped,
chained) and fold it into the `RunView` at once; `flush` stores everything staged in
one transaction, with the run's `Summary` (what a store's run row shows), and now and
then a snapshot. So the view runs *ahead* of the store by what is staged: the
scheduler's rule is that nothing that depends on a staged record starts before the
flush that stores it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import _log as L
from . import _snapshot as snapshots
from ._errors import ClaimLost
from ._fold import RunView
from ._records import Item
from ._store import Claim, Store, Summary

_new_summary = object.__new__


class Journal:
    """Seals, folds, stages and stores one run's records (a `_records.Sink`)."""

    def __init__(self, store: Store, run_id: str, view: RunView, writer: L.LogWriter,
                 listener: Any = None, owner: str | None = None,
                 claim: Claim | None = None) -> None:
        self.store = store
        # the claim every append is made under (refused by the store once another owner
        # claimed the run: `ClaimLost`), where the store fences appends; once lost, no
        # flush reaches the store again
        self.claim = claim if getattr(store, "fences_appends", False) else None
        self.lost: ClaimLost | None = None
        # the executor's lease, given up by the append that ends the run (``released``),
        # where the store can (`Store.leases_in_writes`)
        self.owner = owner if getattr(store, "leases_in_writes", False) else None
        self.released = False
        self.run_id = run_id
        self.view = view
        self.writer = writer
        self.listener = listener
        # a flush in flight (see `flush`); the others wait for ``_idle``, counted in
        # ``_waiting``
        self._flushing = False
        self._waiting = 0
        self._idle = asyncio.Event()
        self._staged: list[L.Entry] = []
        self._snapshot_seq = writer.seq  # records since then are not in a snapshot
        self._snapshot_every = snapshots.EVERY

    def stage(self, items: list[Item]) -> list[L.Record]:
        """Number and chain records and fold them into the view; `flush` stores them.

        Nothing that depends on a staged record may start before the flush returns:
        the loop only starts nodes after flushing.
        """
        put = self.put
        return [put(rtype, {k: v for k, v in fields.items() if v is not None})
                for rtype, fields in items]

    def add(self, item: Item) -> L.Record:
        """`stage` for one record whose fields have no None values (the fields become
        the record)."""
        return self.put(item[0], item[1])

    def put(self, rtype: str, fields: dict[str, Any]) -> L.Record:
        """`add` for an item given as its two halves (the hot path's: no tuple made)."""
        rec, entry = self.writer.seal(rtype, fields)
        self.view.apply(rec)
        self._staged.append(entry)
        if self.listener is not None:
            self.listener(rec, self.view)
        return rec

    def _seal(self, rtype: str, fields: dict[str, Any]) -> L.Entry:
        """A record sealed and folded now, outside the staged batch (the caller stores it)."""
        rec, entry = self.writer.seal(rtype, fields)
        self.view.apply(rec)
        if self.listener is not None:
            self.listener(rec, self.view)
        return entry

    async def flush(self) -> None:
        """Commit every staged record (one transaction); now and then, a snapshot.

        Flushes are serialised: one that finds another in flight waits for it, so when
        this returns, what was staged before it is stored.
        """
        # Serialised with a flag, not an `asyncio.Lock`: the common flush finds none in
        # flight and takes its turn with a test and a store (the lock's acquire and
        # release are three calls, once per step). This is safe because it runs on the
        # event loop's thread and nothing awaits between the test and the store, so two
        # flushes cannot both see ``_flushing`` false. One that finds another in flight
        # waits until none is, then tests again (a third may have taken the turn first).
        while self._flushing:
            self._waiting += 1
            self._idle.clear()
            try:
                await self._idle.wait()
            finally:
                self._waiting -= 1
        self._flushing = True
        try:
            if self.lost is not None:
                raise self.lost
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
            # the run's summary, made here (one call less per step), and without its
            # dataclass ``__init__`` (another): a bare instance, every slot stored here
            v = self.view
            summary = _new_summary(Summary)
            summary.status = v.status
            summary.last_seq = self.writer.seq
            summary.last_hash = self.writer.hash
            summary.steps = v.steps
            summary.tokens = v.tokens
            summary.error = v.error
            summary.waiting = v.waiting
            summary.updated_at = time.time()
            try:
                if self.claim is not None:
                    await self.store.append(self.run_id, entries, summary, release,
                                            claim=self.claim)
                elif release is None:
                    await self.store.append(self.run_id, entries, summary)
                else:
                    await self.store.append(self.run_id, entries, summary, release=release)
            except ClaimLost as exc:
                self.lost = exc
                raise
            if release is not None:
                self.released = True
            if snap is not None:
                await self.store.save_snapshot(self.run_id, at, snap)
                self._snapshot_seq = at
                self._snapshot_every = snapshots.interval(len(snap))
        finally:
            self._flushing = False
            if self._waiting:
                self._idle.set()

    async def commit(self, items: list[Item]) -> list[L.Record]:
        recs = self.stage(items)
        await self.flush()
        return recs


__all__ = ["Journal"]
