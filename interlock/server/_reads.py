"""Reads that scale (issue 27): what the read endpoints share so that a request costs
what it shows, not what the store holds.

- `Approvals`: the inbox (``GET /api/approvals``) from the waiting runs' summaries,
  each approval object kept per run at the run's last seq: a request reads one light
  page of rows (`Store.list_page`) and computes only the gates that changed since.
- `page_cursor` / `cursor_key`: the runs list's keyset cursor (a page's ``next``).
- `records_body`: a log as a JSON array streamed a page at a time.
- `Polls`: one poll of the store per followed run, however many follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

import interlock
from interlock import RunNotFound, Store, StoreError
from interlock.support import (
    RunRow,
    close_stranded,
    gate_text,
    parse_definition,
    patch_schema,
    trace_pages,
)

from ._hub import Hub

log = logging.getLogger("interlock.server")

MAX_WAITING = 10_000  # the inbox's runs at most (as before: one list of waiting runs)
SPECS_KEPT = 256  # parsed definitions kept, by definition hash


# a runs list's cursor: ``CREATED_AT_RUNID`` -- every text of this form is a cursor (the
# API's schema says this pattern; the first ``_`` ends the number)
CURSOR = r"^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?_[^\x00]+$"
_CURSOR = re.compile(CURSOR)


class BadCursor(ValueError):
    """A ``cursor`` that is not of `CURSOR`'s form."""


def page_cursor(row: RunRow) -> str:
    """The cursor of the page after ``row`` (the last of a page)."""
    return f"{row.created_at!r}_{row.run_id}"


def cursor_key(cursor: str) -> tuple[float, str]:
    """``(created_at, run_id)`` from `page_cursor`'s text; `BadCursor` otherwise."""
    if _CURSOR.match(cursor) is None:
        raise BadCursor(cursor)
    number, _, run_id = cursor.partition("_")
    return float(number), run_id


async def records_body(run_id: str, store: Store, after: int, limit: int | None
                       ) -> AsyncIterator[bytes]:
    """The run's records after ``after`` (at most ``limit``) as one JSON array, sent a
    page of the store at a time: the server never holds the whole log."""
    yield b"["
    first, sent = True, 0
    page = min(limit, 2000) if limit is not None else None
    async for records in trace_pages(run_id, store=store, after=after, page=page):
        if limit is not None:
            records = records[:limit - sent]
        if not records:
            break
        body = b",".join(orjson.dumps(rec) for rec in records)
        yield body if first else b"," + body
        first = False
        sent += len(records)
        if limit is not None and sent >= limit:
            break
    yield b"]"


Gates = list[dict[str, Any]]  # (``Approvals.list`` shadows the name in its class)
Rows = list[RunRow]


# -- the inbox ------------------------------------------------------------------------

@dataclass
class _Kept:
    seq: int  # the run's last_seq when its approval was computed
    approvals: Gates  # one per gate it waits at (several at once)
    child: RunRow | None = None  # a child run's whole row (its options name its parent)
    looked: int | None = None  # its parent's last_seq when it was found still wanted


@dataclass
class Approvals:
    """The approval objects of the waiting runs, each computed once per run and seq.

    A request lists the waiting runs' light rows (their ``waiting`` summaries); a run
    whose last seq is the one its object was computed at is answered from here, any
    other (a new gate, a run that moved on and waits again) is computed from its
    definition (parsed once per definition hash) and, for a gate that accepts
    ``modify``, its state (a fold, with the run's snapshot). Runs no longer waiting are
    forgotten."""

    kept: dict[str, _Kept] = field(default_factory=dict)
    specs: dict[str, Any] = field(default_factory=dict)
    computed: int = 0  # approval objects computed (not answered from `kept`): for tests

    async def list(self, store: Store, run_id: str | None = None) -> list[dict[str, Any]]:
        """One row per waiting gate: a child run's gates are its parent's rows
        (``parent_node/gate``), not its own as well -- unless ``run_id`` asks for the
        child's (the gates of that run only)."""
        rows = await store.list_page(status="WAITING_APPROVAL", limit=MAX_WAITING)
        if await self._orphans(store, rows):  # closed by this look: listed as they are
            rows = await store.list_page(status="WAITING_APPROVAL", limit=MAX_WAITING)
        kept = {row.run_id: await self._kept(store, row) for row in rows}
        out = []
        for listed, one in kept.items():
            if run_id is not None:
                if listed == run_id:
                    out.extend(one.approvals)
            elif one.child is None or not _through_parent(one.child, kept):
                out.extend(one.approvals)
        if len(rows) < MAX_WAITING:  # every waiting run was listed: forget the others
            waiting = {row.run_id for row in rows}
            for run_id in [r for r in self.kept if r not in waiting]:
                del self.kept[run_id]
        return out

    async def _orphans(self, store: Store, rows: Rows) -> set[str]:
        """Each waiting run's approvals computed (or kept), and each waiting child whose
        parent no longer waits through it closed (`close_stranded`: a process died
        between the parent's record and the child's) -- looked at again only when its
        parent has moved since, or when this look could not settle it."""
        seqs = {row.run_id: row.summary.last_seq for row in rows}
        stranded = []
        for row in rows:
            kept = await self._kept(store, row)
            if kept.child is None:
                continue
            parent = kept.child.options["parent"]["run"]
            seq = seqs.get(parent)
            if seq is None:  # (not waiting: it went on, or ended)
                try:
                    seq = (await store.get_run(parent)).summary.last_seq
                except RunNotFound:
                    continue
            if kept.looked != seq:
                kept.looked = seq
                stranded.append(kept.child)
        if not stranded:
            return set()
        again: set[str] = set()  # not settled (the store failed): looked at next time
        closed = await close_stranded(store, stranded, again=again)
        for run_id in again:
            if (unsettled := self.kept.get(run_id)) is not None:
                unsettled.looked = None
        return closed

    async def _kept(self, store: Store, row: RunRow) -> _Kept:
        """``row``'s approvals, as kept at its last seq or computed now."""
        kept = self.kept.get(row.run_id)
        if kept is None or kept.seq != row.summary.last_seq:
            kept = self.kept[row.run_id] = await self._compute(store, row)
            self.computed += 1
        return kept

    async def _spec(self, full: RunRow) -> Any:
        spec = self.specs.get(full.definition_hash)
        if spec is None:
            spec = parse_definition(full.definition)
            if len(self.specs) >= SPECS_KEPT:
                self.specs.pop(next(iter(self.specs)))
            self.specs[full.definition_hash] = spec
        return spec

    async def _compute(self, store: Store, row: RunRow) -> _Kept:
        kept = _Kept(row.summary.last_seq, [])
        waiting = row.summary.waiting or {}
        if not waiting.get("node"):
            return kept
        try:
            full = await store.get_run(row.run_id)  # (its options name a child's parent)
            spec = await self._spec(full)
        except RunNotFound:
            return kept  # deleted since it was listed
        link = full.options.get("parent")
        if isinstance(link, dict) and isinstance(link.get("run"), str):
            kept.child = full
        gates = waiting.get("pending") or [waiting]  # (a log from before `pending`: one)
        for w in gates:
            if isinstance(w, dict) and w.get("node"):
                kept.approvals.append(await self._approval(store, row, spec, w))
        return kept

    async def _approval(self, store: Store, row: RunRow, spec: Any, w: dict[str, Any]
                        ) -> dict[str, Any]:
        node = w["node"]
        # a child run's gate says who may decide it (its definition's, not this run's); a
        # gate of this run's own is its node's (``deploy[2]``: a map item's, ``deploy``)
        ns = spec.nodes.get(str(node).split("[", 1)[0])
        approvers = list(w["approvers"]) if isinstance(w.get("approvers"), list) \
            else list(ns.approval.approvers) if ns is not None and ns.approval \
            and "/" not in node else []
        decisions = w.get("decisions") or []
        return {"run_id": row.run_id, "workflow": row.workflow, "node": node,
                "show": w.get("show") or {}, "decisions": decisions,
                "since": w.get("requested_at"), "deadline": w.get("deadline"),
                "approvers": approvers, "kind": w.get("kind"), "input": w.get("input"),
                "modify": await _modify(store, spec, row, w)
                if "modify" in decisions else None, "outcome": gate_text.outcome_info(w)}


def _through_parent(child: RunRow, listed: dict[str, _Kept]) -> bool:
    """Whether a child run's gates are listed as its waiting parent's rows
    (``parent_node/gate``, decided through the parent): one row per gate."""
    parent = listed.get(child.options["parent"]["run"])
    return parent is not None and any("/" in str(a["node"]) for a in parent.approvals)


async def _modify(store: Store, spec: Any, row: RunRow, waiting: dict[str, Any]
                  ) -> dict[str, Any]:
    """What a modify of this gate must be: where it may re-enter (``at``, the first
    being the default) and the JSON Schema of its ``patch``."""
    if waiting.get("kind") == "tool":  # a guarded tool call: its arguments' schema
        return {"at": [], "patch_schema": waiting.get("input") or {}}
    ns = spec.nodes.get(waiting.get("node"))
    at = list(ns.approval.on_modify) if ns is not None and ns.approval is not None else []
    state = (await interlock.status(row.run_id, store=store)).state
    return {"at": at, "patch_schema": patch_schema(spec, state)}


# -- followers of a run ---------------------------------------------------------------

class Follower:
    """One event stream on a run: the seq it has sent up to (``seq``)."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


class Polls:
    """One poll of the store per followed run, shared by all its followers.

    A stream on a run that this server does not execute learns of records committed
    elsewhere (the CLI, a worker, another server) from here: when the store's change
    detector tells of a commit (`Store.wait_changed`, within milliseconds: SQLite's
    ``data_version``, a commit to the file; PostgreSQL's ``LISTEN``, an append to this
    run) and at the latest every ``every`` seconds (the slow poll, behind a detector
    that missed one or a store without one), one task per run asks the store
    whether there is a record after the lowest seq any of its followers has sent (one
    indexed read of at most one record), and if there is, wakes them all through the
    `Hub` -- each then reads what it has not sent. A follower sets its ``seq`` before it
    waits and takes its `Hub` waiter before it reads: a record committed after its read
    is after its ``seq``, so the next poll wakes it (no gap), and it reads from its own
    ``seq`` (no duplicate)."""

    def __init__(self, store: Callable[[], Store], hub: Hub, every: float,
                 local: Callable[[str], bool]) -> None:
        self.store, self.hub, self.every, self.local = store, hub, every, local
        self._runs: dict[str, tuple[set[Follower], asyncio.Task[None]]] = {}
        self.reads = 0  # the store reads made (for tests: one per run per poll)

    @contextlib.contextmanager
    def following(self, run_id: str, seq: int) -> Iterator[Follower]:
        me = Follower(seq)
        entry = self._runs.get(run_id)
        if entry is None:
            followers: set[Follower] = set()
            task = asyncio.get_running_loop().create_task(self._poll(run_id, followers))
            entry = self._runs[run_id] = (followers, task)
        entry[0].add(me)
        try:
            yield me
        finally:
            entry[0].discard(me)
            if not entry[0] and self._runs.get(run_id) is entry:
                del self._runs[run_id]
                entry[1].cancel()

    async def _poll(self, run_id: str, followers: set[Follower]) -> None:
        seen: int | None = None
        while followers:
            try:  # the store's change detector, the poll every ``every`` behind it
                seen = await self.store().wait_changed(self.every, seen, run_id)
            except StoreError:
                await asyncio.sleep(self.every)
            if not followers or self.local(run_id):  # its own commits wake them
                continue
            after = min(f.seq for f in followers)
            self.reads += 1
            try:
                new = bool(await self.store().entries_page(run_id, after, 1))
            except RunNotFound:
                new = True  # deleted: they find out when they read
            except StoreError as exc:  # the store is away: try again next time
                log.warning("polling run %s for its followers: %s", run_id, exc)
                continue
            if new:
                self.hub.changed(run_id)

    async def close(self) -> None:
        tasks = [task for _, task in self._runs.values()]
        self._runs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["Approvals", "BadCursor", "Follower", "Polls", "cursor_key", "page_cursor",
           "records_body"]
