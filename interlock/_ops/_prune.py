"""Retention: ``interlock prune`` deletes finished runs older than a cut-off.

What it may delete: runs that ended -- completed, failed, rejected, cancelled -- and
were last updated before the cut-off, with their records and snapshots. Never a run
that waits for a human, is pending or running (the store re-checks that in the
transaction that deletes, so a run resumed meanwhile is left alone), and never a run
whose parent run it keeps (a fork or a sub-workflow's child goes with its parent, or
not at all). After deleting it has the store give the space back (SQLite's VACUUM)
and says how many bytes that freed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .._errors import UsageError
from .._store import ALL_RUNS, FINISHED, RunRow, Store, open_store


@dataclass(slots=True)
class Pruned:
    """What `prune` removed (or, with ``dry_run``, would remove)."""

    runs: list[RunRow] = field(default_factory=list)
    records: int = 0
    kept_children: list[str] = field(default_factory=list)  # old enough, parent kept
    bytes_before: int | None = None
    bytes_after: int | None = None
    dry_run: bool = False

    @property
    def freed(self) -> int | None:
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return max(0, self.bytes_before - self.bytes_after)

    def to_json(self) -> dict[str, object]:
        return {"dry_run": self.dry_run, "runs": [r.run_id for r in self.runs],
                "records": self.records, "kept_children": self.kept_children,
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "bytes_freed": self.freed}


def select(rows: list[RunRow], older_than: float, statuses: tuple[str, ...], now: float
           ) -> tuple[list[RunRow], list[str]]:
    """The rows to delete, and the old finished ones kept because their parent is."""
    cutoff = now - older_than
    chosen = {r.run_id: r for r in rows
              if r.summary.status in statuses and (r.summary.updated_at or r.created_at) < cutoff}
    existing = {r.run_id for r in rows}
    kept: list[str] = []
    changed = True
    while changed:  # a child goes only with its parent (a chain of forks, all the way)
        changed = False
        for run_id, row in list(chosen.items()):
            link = row.options.get("parent")  # a sub-workflow's child names its parent
            parent = row.parent_run or (link.get("run") if isinstance(link, dict) else None)
            if parent is not None and parent in existing and parent not in chosen:
                del chosen[run_id]
                kept.append(run_id)
                changed = True
    return list(chosen.values()), kept


async def prune(*, older_than: float, statuses: tuple[str, ...] | None = None,
                dry_run: bool = False, store: str | Store | None = None) -> Pruned:
    """Delete the finished runs last updated more than ``older_than`` seconds ago (of
    ``statuses``, default every finished one); see the module's text."""
    wanted = tuple(s.upper() for s in statuses) if statuses else FINISHED
    refused = [s for s in wanted if s not in FINISHED]
    if refused:
        raise UsageError(f"prune deletes finished runs only ({', '.join(FINISHED)}); "
                         f"{', '.join(refused)} is not one: a waiting, pending or running "
                         "run is never pruned")
    if older_than < 0:
        raise UsageError("--older-than is a duration such as 30d, 12h or 90m")
    st = store if isinstance(store, Store) else open_store(store)
    try:
        rows = await st.list_runs(limit=ALL_RUNS)
        chosen, kept = select(rows, older_than, wanted, time.time())
        out = Pruned(runs=chosen, kept_children=kept, dry_run=dry_run)
        out.records = sum(r.summary.last_seq for r in chosen)
        if dry_run or not chosen:
            return out
        out.bytes_before = await st.size_bytes()
        deleted, out.records = await st.delete_finished([r.run_id for r in chosen])
        gone = set(deleted)
        out.runs = [r for r in chosen if r.run_id in gone]
        await st.reclaim()
        out.bytes_after = await st.size_bytes()
        return out
    finally:
        if not isinstance(store, Store):
            await st.close()


__all__ = ["Pruned", "prune", "select"]
