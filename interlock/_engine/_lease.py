"""The lease keeper: renews the leases of the runs this process executes from a thread
of its own, so that a blocked event loop does not lose them.

A node body that blocks its event loop (a synchronous HTTP or LLM client called inside
``async def``, a long computation) stops every coroutine of that loop -- a heartbeat
scheduled there too. If the block outlasts the lease, another worker takes the run
over and two processes execute it. So leases are renewed here instead: one daemon
thread per kind of store (`SQLiteStore`, `PostgresStore`, `MemoryStore`: started by the
first lease it holds, ended after `IDLE_SECONDS` without one), with a connection of its
own to each store whose leases it holds (`Store.lease_renewer`: a second SQLite
connection, a blocking psycopg connection), renewing each lease held every third of it.
Per kind, not per store: a store is often opened for one run (``wf.run_sync(store=...)``
in a loop, ``wf.run(store="memory://")``), and a thread per store left a thread per run
alive for `IDLE_SECONDS` after it -- 1,000 concurrent in-memory runs, 1,000 threads.
(One thread for every kind would let a store that does not answer -- a PostgreSQL
server gone, a SQLite file locked -- hold up the renewals of another.)

When a renewal finds the claim gone (`ClaimLost`: another owner claimed the run since,
after this *process* was paused -- SIGSTOP, a long GC, a suspended machine -- for longer
than the lease, or with ``--force``) the lease's ``on_lost`` is called on this thread;
the executor hands it to its event loop (`_watcher._Watcher`), which stops the run. An
error of the store (a restart, a locked file) is retried every `RETRY_SECONDS` while
the lease lasts; after that the next renewal tells whether the claim survived.

`Held.renewed` is the monotonic time of the last renewal known to have succeeded
(taken *before* it was sent): a lease is valid until at least ``renewed + lease``.
(``ctx.once`` does not rely on it: it checks the claim with the store before each
effect, `_watcher._Watcher.confirm`.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable

from .._errors import ClaimError, ClaimLost, StoreError
from .._store import Claim, LeaseRenewer, Store

log = logging.getLogger("interlock")

IDLE_SECONDS = 10.0  # a keeper thread with no lease to keep for this long ends
RETRY_SECONDS = 0.5  # a renewal that failed on a store error is tried again after this


class Held:
    """One lease the keeper renews."""

    __slots__ = ("claim", "due", "lease", "lost", "on_lost", "renewed", "run_id", "store",
                 "unkept")

    def __init__(self, store: Store, run_id: str, claim: Claim, lease: float,
                 on_lost: Callable[[ClaimLost], None]) -> None:
        self.store = weakref.ref(store)  # (a store dropped meanwhile: nothing to renew)
        self.run_id, self.claim, self.lease, self.on_lost = run_id, claim, lease, on_lost
        now = time.monotonic()
        self.renewed = now  # (the claim was made just before: a lower bound would do too)
        self.due = now + lease / 3
        self.lost: ClaimLost | None = None
        # set when the store has no `LeaseRenewer` (a store of another package, a
        # wrapper): the keeper drops it, and the executor's loop renews it by heartbeats
        self.unkept = False


class Keeper:
    """The thread that renews the leases of one kind of store, with one `LeaseRenewer`
    per store."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[Held] = set()
        self._running = False
        self._wakes_at = 0.0  # when the thread wakes next (a hold due earlier wakes it)
        self._renewers: weakref.WeakKeyDictionary[Store, LeaseRenewer] = \
            weakref.WeakKeyDictionary()

    def hold(self, store: Store, run_id: str, claim: Claim, lease: float,
             on_lost: Callable[[ClaimLost], None]) -> Held:
        """Renew ``claim``'s lease every third of ``lease`` until `drop`."""
        held = Held(store, run_id, claim, lease, on_lost)
        with self._cond:
            self._held.add(held)
            if not self._running:
                self._running = True
                threading.Thread(target=self._main, name=f"interlock-lease:{run_id}",
                                 daemon=True).start()
            elif held.due < self._wakes_at:
                self._cond.notify()
        return held

    def drop(self, held: Held) -> None:
        with self._cond:
            self._held.discard(held)
            if not self._held:
                self._cond.notify()  # its connections are closed now, not at the next due

    def _main(self) -> None:
        ended = False
        try:
            while True:
                with self._cond:
                    idle_since = time.monotonic()
                    while True:
                        now = time.monotonic()
                        if not self._held:
                            self._close_renewers()
                            if now - idle_since >= IDLE_SECONDS:
                                self._running, ended = False, True
                                return
                            # (any lease held now is due before this wakes: `hold` wakes it)
                            self._wakes_at = math.inf
                            self._cond.wait(IDLE_SECONDS - (now - idle_since))
                            continue
                        first = min(h.due for h in self._held)
                        if first <= now:
                            break
                        self._wakes_at = first
                        self._cond.wait(first - now)
                    due = [h for h in self._held if h.due <= now]
                    unused = self._unused_renewers()
                for renewer in unused:  # (a store none of whose runs holds a lease now)
                    with contextlib.suppress(Exception):
                        renewer.close()
                for held in due:
                    self._renew(held)
        finally:
            if not ended:  # (an error of the thread itself: the next `hold` starts one)
                with self._cond:
                    self._running = False
                    self._close_renewers()

    def _unused_renewers(self) -> list[LeaseRenewer]:
        """The renewers of stores that hold no lease now, taken out (the caller closes
        them): a store opened for one run, beside others of its kind that go on."""
        if len(self._renewers) < 2:
            return []  # (the one store's renewer is closed when nothing is held)
        used = {id(h.store()) for h in self._held}
        return [self._renewers.pop(store) for store in list(self._renewers)
                if id(store) not in used]

    def _close_renewers(self) -> None:
        renewers = list(self._renewers.values())
        self._renewers.clear()
        for renewer in renewers:
            with contextlib.suppress(Exception):
                renewer.close()

    def _renew(self, held: Held) -> None:
        store = held.store()
        if store is None:
            self.drop(held)
            return
        if held not in self._held:
            return  # dropped meanwhile: its run ended
        sent = time.monotonic()
        try:
            renewer = self._renewers.get(store)
            if renewer is None:
                renewer = store.lease_renewer()
                if renewer is None:  # (a store that has none: the loop renews)
                    held.unkept = True
                    self.drop(held)
                    return
                self._renewers[store] = renewer
            renewer.renew(held.run_id, held.claim, held.lease)
        except ClaimError as exc:
            lost = exc if isinstance(exc, ClaimLost) else ClaimLost(
                held.run_id, exc.owner, None, held.claim.generation)
            held.lost = lost
            self.drop(held)
            held.on_lost(lost)
            return
        except (StoreError, OSError) as exc:
            log.warning("run %s: the lease could not be renewed (%s); trying again in "
                        "%.1fs", held.run_id, exc, RETRY_SECONDS)
            held.due = time.monotonic() + RETRY_SECONDS
            return
        except Exception:  # a bug: keep the thread, say so, try again later
            log.exception("run %s: renewing the lease failed", held.run_id)
            held.due = time.monotonic() + RETRY_SECONDS
            return
        held.renewed = sent
        held.due = sent + held.lease / 3


_KEEPERS: dict[type[Store], Keeper] = {}  # one per kind of store (see the module's doc)
_KEEPERS_LOCK = threading.Lock()


def keeper_for(store: Store) -> Keeper | None:
    """The keeper of ``store``'s leases, or None when the store renews none off the
    event loop (`Store.fences_appends` false: its leases are renewed by heartbeats on
    the loop, as before)."""
    if not getattr(store, "fences_appends", False):
        return None
    kind = type(store)
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(kind)
        if keeper is None:
            keeper = _KEEPERS[kind] = Keeper()
        return keeper


__all__ = ["Held", "Keeper", "keeper_for"]
