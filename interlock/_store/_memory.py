"""``memory://`` -- a store in this process's memory: no durability, for tests and benchmarks."""

from __future__ import annotations

import threading
import time
from typing import Any

from .._json import JSONObject
from .._log import Entry
from ._base import (
    FINISHED,
    Claim,
    ClaimError,
    ClaimLost,
    ConflictError,
    LeaseRenewer,
    RunExists,
    RunNotFound,
    RunRow,
    Store,
    Summary,
    light_row,
    owner_gone,
)


class MemoryStore(Store):
    leases_in_writes = True
    fences_appends = True

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        # the lease keeper's thread renews leases (`_Renewer`); claims and fenced appends
        # take this lock too, so that a renewal's check and write are one step
        self._lease_lock = threading.Lock()
        self._runs: dict[str, RunRow] = {}
        self._entries: dict[str, list[Entry]] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}

    async def create_run(self, row: RunRow, entries: list[Entry]) -> None:
        if row.run_id in self._runs:
            raise RunExists(row.run_id)
        self._check_seq(row.run_id, [], entries)
        self._runs[row.run_id] = row.copy()  # the caller's row stays the caller's
        self._entries[row.run_id] = list(entries)

    async def append(self, run_id: str, entries: list[Entry], summary: Summary,
                     release: str | None = None, *, claim: Claim | None = None) -> None:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotFound(run_id)
        if claim is not None and row.generation != claim.generation:
            raise ClaimLost(run_id, row.owner, row.generation, claim.generation)
        log = self._entries[run_id]
        # a batch comes from one LogWriter, numbered without gaps: its ends tell
        if entries and (entries[0].seq != len(log) + 1
                        or entries[-1].seq != len(log) + len(entries)):
            self._check_seq(run_id, log, entries)  # raises, saying which record does not fit
        log.extend(entries)
        row.summary = summary  # a fresh object per append (Journal.flush); reads copy it
        if release is not None and row.owner == release:
            row.owner, row.lease_until = None, None

    @staticmethod
    def _check_seq(run_id: str, log: list[Entry], entries: list[Entry]) -> None:
        expected = len(log) + 1
        for e in entries:
            if e.seq > expected == len(log) + 1:  # a gap after the log: not another writer
                raise ConflictError(
                    f"run {run_id!r}: record {e.seq} does not follow the stored log, which "
                    f"ends at seq {expected - 1}: the records before it were never stored (an "
                    "earlier append of this writer failed); nothing of this append was stored")
            if e.seq != expected:
                raise ConflictError(
                    f"run {run_id!r}: record {e.seq} conflicts with the stored log "
                    f"(next free seq is {len(log) + 1}); another writer got there first"
                )
            expected += 1

    def _row(self, run_id: str) -> RunRow:
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFound(run_id) from None

    async def get_run(self, run_id: str) -> RunRow:
        return self._row(run_id).copy()

    async def entries(self, run_id: str, after: int = 0) -> list[Entry]:
        self._row(run_id)
        return self._entries[run_id][after:]

    async def entries_page(self, run_id: str, after: int = 0, limit: int = 1000
                           ) -> list[Entry]:
        self._row(run_id)
        return self._entries[run_id][after:after + limit]

    async def list_runs(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100) -> list[RunRow]:
        rows = [r for r in self._runs.values()
                if (status is None or r.summary.status == status)
                and (workflow is None or r.workflow == workflow)]
        rows.sort(key=lambda r: r.created_at, reverse=True)
        return [r.copy() for r in rows[:limit]]

    async def list_page(self, *, status: str | None = None, workflow: str | None = None,
                        limit: int = 100, before: tuple[float, str] | None = None,
                        updated_after: float | None = None) -> list[RunRow]:
        rows = [r for r in self._runs.values()
                if (status is None or r.summary.status == status)
                and (workflow is None or r.workflow == workflow)
                and (before is None or (r.created_at, r.run_id) < before)
                and (updated_after is None or r.summary.updated_at > updated_after)]
        rows.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return [light_row(r) for r in rows[:max(limit, 0)]]

    async def claim(self, run_id: str, owner: str, lease: float, *,
                    force: bool = False) -> int:
        row = self._row(run_id)
        with self._lease_lock:
            now = time.time()
            if (not force and row.owner not in (None, owner) and row.lease_until is not None
                    and row.lease_until > now and not owner_gone(row.owner)):
                raise ClaimError(run_id, row.owner, row.lease_until - now)
            row.owner, row.lease_until = owner, now + lease
            row.generation += 1
            return row.generation

    async def heartbeat(self, run_id: str, owner: str, lease: float,
                        generation: int | None = None) -> None:
        self._renew(run_id, owner, lease, generation)

    def _renew(self, run_id: str, owner: str, lease: float, generation: int | None) -> None:
        row = self._row(run_id)
        with self._lease_lock:
            if row.owner != owner or generation not in (None, row.generation):
                raise ClaimLost(run_id, row.owner, row.generation, generation)
            row.lease_until = time.time() + lease

    def lease_renewer(self) -> LeaseRenewer:
        return _Renewer(self)

    async def release(self, run_id: str, owner: str) -> None:
        row = self._row(run_id)
        if row.owner == owner:
            row.owner, row.lease_until = None, None

    async def request_cancel(self, run_id: str, by: str | None) -> None:
        self._row(run_id).extra["cancel"] = {"by": by, "at": time.time()}

    async def cancel_requested(self, run_id: str) -> JSONObject | None:
        value = self._row(run_id).extra.get("cancel")
        return dict(value) if value else None

    async def offer_decision(self, run_id: str, gate: str, decision: dict[str, Any]
                             ) -> dict[str, Any] | None:
        kept = self._row(run_id).extra.setdefault("decisions", {})
        if gate in kept:
            return dict(kept[gate])
        kept[gate] = dict(decision)
        return None

    async def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        kept = self._row(run_id).extra.get("decisions") or {}
        return {k: dict(v) for k, v in kept.items()}

    async def save_snapshot(self, run_id: str, seq: int, data: bytes) -> None:
        self._row(run_id)
        current = self._snapshots.get(run_id)
        if current is None or seq > current[0]:
            self._snapshots[run_id] = (seq, bytes(data))

    async def load_snapshot(self, run_id: str) -> tuple[int, bytes] | None:
        self._row(run_id)
        return self._snapshots.get(run_id)

    async def delete_finished(self, run_ids: list[str]) -> tuple[list[str], int]:
        deleted, records = [], 0
        for run_id in run_ids:
            row = self._runs.get(run_id)
            if row is None or row.summary.status not in FINISHED or row.owner is not None:
                continue
            del self._runs[run_id]
            records += len(self._entries.pop(run_id, ()))
            self._snapshots.pop(run_id, None)
            deleted.append(run_id)
        return deleted, records

    async def size_bytes(self) -> int | None:
        return sum(len(e.data) + len(e.hash) for log in self._entries.values() for e in log) \
            + sum(len(data) for _, data in self._snapshots.values())


class _Renewer(LeaseRenewer):
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def renew(self, run_id: str, claim: Claim, lease: float) -> None:
        self.store._renew(run_id, claim.owner, lease, claim.generation)
