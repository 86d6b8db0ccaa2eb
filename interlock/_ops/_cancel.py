"""Cancelling a stored run: here and now when nobody executes it (with the children of
its sub-workflow visits in flight), else asked of its executor through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from .._definition._plan import Plan
from .._engine import _records as R
from .._engine._fold import RunResult, RunView, result_of
from .._engine._journal import Journal
from .._errors import LogError, RunNotFound, UsageError
from .._plugins._subflow import child_run_id
from .._store import Store, release_store
from ._claims import LEASE_SECONDS, _claim_of, make_owner
from ._load import load_run, open_store_arg, status

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
        await _cancel_children(st, loaded.plan, run_id, loaded.view, by)
        return result_of(run_id, loaded.row.workflow, loaded.view)
    finally:
        if owned:
            await release_store(st)


def _child_ids(plan: Plan, run_id: str, view: RunView) -> list[str]:
    """The child runs of a run's sub-workflow visits in flight (running or waiting)."""
    out = []
    for (node, visit) in view.running:
        if plan.nodes[node].spec.workflow is None:
            continue
        m = view.maps.get((node, visit))
        if m is not None:
            out += [child_run_id(run_id, node, visit, i) for i in range(len(m.items))
                    if i not in m.done]
        else:
            out.append(child_run_id(run_id, node, visit))
    return out


async def _cancel_children(store: Store, plan: Plan, run_id: str, view: RunView,
                           by: str | None) -> None:
    for child in _child_ids(plan, run_id, view):
        with contextlib.suppress(UsageError, LogError, RunNotFound):
            await cancel(child, by=by, store=store, wait=0)
