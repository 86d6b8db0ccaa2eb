"""Cancelling a stored run: here and now when nobody executes it (with its child runs
in flight or waiting: `_orphans.close_children`), else asked of its executor through the
store.
"""

from __future__ import annotations

import asyncio
import time

from .._engine import _records as R
from .._engine._fold import RunResult, result_of
from .._engine._journal import Journal
from .._errors import UsageError
from .._store import Store, release_store
from ._claims import LEASE_SECONDS, _claim_of, make_owner
from ._load import load_run, open_store_arg, status
from ._orphans import close_children

# how often a run's cancellation request is looked for: by its executor's watcher, and
# by `cancel` waiting for the executor to record it
CANCEL_POLL_SECONDS = 0.25


async def cancel(run_id: str, *, by: str | None = None, store: str | Store | None = None,
                 wait: float = 10.0) -> RunResult:
    """Cancel a running or waiting run; the log records who cancelled it.

    A run that no process is executing (waiting for a human, failed, or whose
    process died) is cancelled here and now. A run being executed elsewhere is
    asked to stop through the store: its executor cancels the visits in flight
    (killing isolated processes) and writes ``run.cancelled``; this waits up to
    ``wait`` seconds for that and returns the run as it then is.
    """
    from .._store import ClaimError

    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id)
        if loaded.view.status in ("COMPLETED", "REJECTED", "CANCELLED"):
            raise UsageError(f"run {run_id!r} is already {loaded.view.status}")
        owner = make_owner()
        try:
            generation = await st.claim(run_id, owner, LEASE_SECONDS)
        except ClaimError:
            await st.request_cancel(run_id, by)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                await asyncio.sleep(CANCEL_POLL_SECONDS)
                if (await st.get_run(run_id)).summary.status == "CANCELLED":
                    break
            return await status(run_id, store=st)
        try:
            loaded = await load_run(st, run_id)  # again: it may have moved before our claim
            if loaded.view.status in ("COMPLETED", "REJECTED", "CANCELLED"):
                # it ended between the first read and the claim (its executor's last
                # append released the claim we then took): nothing to cancel
                raise UsageError(f"run {run_id!r} is already {loaded.view.status}")
            journal = Journal(st, run_id, loaded.view, loaded.writer(),
                              claim=_claim_of(owner, generation))
            await journal.commit([R.run_cancelled(by)])
        finally:
            await st.release(run_id, owner)
        await close_children(st, run_id, loaded.view, loaded.plan, by)
        return result_of(run_id, loaded.row.workflow, loaded.view)
    finally:
        if owned:
            await release_store(st)
