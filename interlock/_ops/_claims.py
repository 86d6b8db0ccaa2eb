"""Claims on stored runs: run and owner ids, the lease's length, the claim a store gave,
and a commit of our own under a claim (to a run nobody executes).
"""

from __future__ import annotations

import os

from .._engine._journal import Journal
from .._store import Claim, Store, this_owner
from ._load import Loaded

LEASE_SECONDS = 15.0


def _claim_of(owner: str, generation: int | None) -> Claim | None:
    """The claim a `Store.claim` gave (None from a store that fences no appends)."""
    return None if generation is None else Claim(owner, generation)


def make_run_id() -> str:
    """A new run id: 20 random hex digits."""
    return os.urandom(10).hex()


def make_owner() -> str:
    """An owner id for one execution: `this_owner` and a random suffix."""
    return f"{this_owner()}:{os.urandom(4).hex()}"


async def _commit_claimed(store: Store, loaded: Loaded, items: list[tuple[str, dict[str, object]]]
                          ) -> None:
    """Append ``items`` to a run nobody executes (a child waiting for a human), under a
    claim of our own."""
    owner = make_owner()
    generation = await store.claim(loaded.row.run_id, owner, LEASE_SECONDS)
    try:
        await Journal(store, loaded.row.run_id, loaded.view, loaded.writer(),
                      claim=_claim_of(owner, generation)).commit(items)
    finally:
        await store.release(loaded.row.run_id, owner)
