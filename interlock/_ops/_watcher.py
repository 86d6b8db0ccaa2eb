"""The watcher of a run being executed (`_Watcher`, made by `_execute._execute`): its
lease kept, the store polled for a request to cancel it and for decisions offered for
its gates, what the executor staged committed, and the run stopped when its claim is
lost; the ``ctx.claim``/``ctx.once`` check of its nodes (`_context.ClaimGuard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from .._engine._journal import Journal
from .._engine._lease import Held, keeper_for
from .._engine._runner import Runner
from .._errors import ClaimError, ClaimLost, StoreError
from .._store import Claim, Store
from ._cancel import CANCEL_POLL_SECONDS
from ._claims import LEASE_SECONDS
from ._load import TERMINAL_STATUSES

log = logging.getLogger("interlock")

# how long `ctx.once` waits, after the claim was found lost, for the run's cancellation
# to reach it before it raises `ClaimLost` itself
LOST_GRACE_SECONDS = 5.0


class _Watcher:
    """Keeps a run's lease, polls the store for a request to cancel it, commits what the
    executor staged but has not committed yet, and stops the run when its claim is lost.

    The lease is renewed off the event loop, by the store's lease keeper (`_lease`: a
    thread with a connection of its own), from the moment the run is watched: a node
    that blocks the loop for longer than the lease does not lose it. A store without a
    keeper has its lease renewed here, on the loop, every third of the lease.

    A timer starts the watching task after `CANCEL_POLL_SECONDS` (a run that ends sooner
    costs no task); then it polls every `CANCEL_POLL_SECONDS`. The executor commits
    ``node.started`` with the next batch (a node's completion, as a rule) -- one commit
    per step instead of two. The poll commits it too, so a node that runs longer than a
    poll shows in ``trace`` and ``status`` (and survives a crash in the log) while it runs.

    A lost claim (the keeper's renewal, a heartbeat here, or ``ctx.once``'s check found
    that another owner claimed the run since) is `lose`: nothing more is appended (the
    journal refuses, and so would the store), the executor's task is cancelled -- the
    nodes in flight stop as a cancellation stops them -- and `_execute` raises
    `ClaimLost`. It is also the run's `_context.ClaimGuard`: ``ctx.claim`` and
    ``ctx.once``'s check.
    """

    __slots__ = ("_loop", "_next_beat", "_stopped", "_task", "_timer",
                 "cancelled", "claim", "held", "lease", "lost", "lost_cancel", "owner",
                 "run_id", "runner", "store", "target")

    def __init__(self, store: Store, run_id: str, owner: str, runner: Runner,
                 target: asyncio.Task[Any], lease: float = LEASE_SECONDS,
                 claim: Claim | None = None) -> None:
        self.store, self.run_id, self.owner = store, run_id, owner
        self.runner, self.target, self.lease = runner, target, lease
        self.claim = claim
        self.cancelled = False  # whether we cancelled ``target`` (a requested cancellation)
        self.lost: ClaimLost | None = None
        self.lost_cancel = False  # whether we cancelled ``target`` for a lost claim
        self._stopped = False
        loop = self._loop = asyncio.get_running_loop()
        self._next_beat = loop.time() + lease / 3
        keeper = keeper_for(store) if claim is not None else None
        self.held: Held | None = None if keeper is None or claim is None else \
            keeper.hold(store, run_id, claim, lease, self._lost_elsewhere)
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            CANCEL_POLL_SECONDS, self._start)

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.lost is None:
            try:
                request = await self.store.cancel_requested(self.run_id)
            except StoreError as exc:  # (an outage: the next poll tries again)
                log.warning("run %s: looking for a cancellation request failed (%s); "
                            "trying again in %.2fs", self.run_id, exc, CANCEL_POLL_SECONDS)
                request = None
            if request is not None and self.runner.cancelled_by is None:
                self.runner.cancelled_by = request
                self.cancelled = True
                self.target.cancel()
            if self.runner.view.gates and self.lost is None:
                try:  # decisions offered by other processes for gates waiting here
                    offers = await self.store.decisions(self.run_id)
                except StoreError:
                    offers = {}
                if offers:
                    self.runner.offer(offers)
            if (self.held is None or self.held.unkept) and loop.time() >= self._next_beat and \
                    self.runner.view.status not in TERMINAL_STATUSES:  # not released yet
                if not await self._heartbeat():
                    return
                self._next_beat = loop.time() + self.lease / 3
            try:
                await self.runner.sink.flush()  # a no-op unless records wait to be committed
            except ClaimLost as exc:  # the store refused it: another owner claimed the run
                self.lose(exc)
                return
            except StoreError:  # the journal is broken: the executor's next flush says so
                return
            await asyncio.sleep(CANCEL_POLL_SECONDS)

    async def _heartbeat(self, confirming: bool = False) -> bool:
        """Renew the lease from the loop; False (and `lose`) when the claim is gone. A
        store error is logged (the next poll tries again), or, ``confirming`` an
        effect, raised."""
        sent = time.monotonic()
        try:
            if self.claim is None:
                await self.store.heartbeat(self.run_id, self.owner, self.lease)
            else:
                await self.store.heartbeat(self.run_id, self.owner, self.lease,
                                           self.claim.generation)
        except ClaimError as exc:
            self.lose(exc if isinstance(exc, ClaimLost) else ClaimLost(
                self.run_id, exc.owner, None,
                None if self.claim is None else self.claim.generation))
            return False
        except StoreError as exc:
            if not confirming:  # (the watcher's: its next poll tries again)
                log.warning("run %s: renewing the lease failed (%s)", self.run_id, exc)
                return True
            raise
        if self.held is not None:
            self.held.renewed = max(self.held.renewed, sent)
        return True

    def _lost_elsewhere(self, exc: ClaimLost) -> None:
        """The keeper's (on its thread): the claim is gone; the loop stops the run."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs there
            self._loop.call_soon_threadsafe(self.lose, exc)

    def lose(self, exc: ClaimLost) -> None:
        """The claim is gone: append nothing more, stop the run (`_execute` raises)."""
        if self.lost is not None or self._stopped or (
                isinstance(self.runner.sink, Journal) and self.runner.sink.released):
            return  # (released by the run's last append: nothing of ours is at stake)
        self.lost = exc
        if isinstance(self.runner.sink, Journal):  # broken: its flushes refuse from now on
            self.runner.sink.broken = exc
        log.warning("%s", exc)
        if not self.target.done():
            self.lost_cancel = True
            self.target.cancel()

    # -- the `_context.ClaimGuard` of the run's nodes --------------------------------------

    async def confirm(self) -> None:
        """Before a ``ctx.once`` effect: renew the lease, with the claim's generation (one
        heartbeat: 0.05-0.25 ms on SQLite, ~0.1 ms on PostgreSQL; the effect's own
        record costs an append). The keeper alone would notice a lost claim only at its
        next renewal, up to a third of the lease later -- after a ``--force`` takeover,
        or a pause of the whole process, the node would run its effect meanwhile. When
        the claim is gone, the run is being stopped: wait for that cancellation here
        (the node stops as a cancellation stops it), and raise `ClaimLost` if it does
        not come. A store error is raised as it is: no effect without the check."""
        if self.lost is None and await self._heartbeat(confirming=True):
            return
        await asyncio.sleep(LOST_GRACE_SECONDS)
        assert self.lost is not None
        raise self.lost

    async def stop(self) -> None:
        """Stop watching: no cancellation after this. Raises what ended the watch, if any."""
        self._stopped = True
        if self.held is not None:
            keeper = keeper_for(self.store)
            if keeper is not None:
                keeper.drop(self.held)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["LOST_GRACE_SECONDS", "_Watcher"]
