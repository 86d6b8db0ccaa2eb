"""Verifying a stored run, a page at a time: its chain, first record, definition, fold,
summary and snapshot (`LogCheck`), and its child runs; which ``child.started`` records
are links to child runs (`ChildLinks`, `forged`), as every reader follows them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from .. import _log as L
from .._definition._model import NodeSpec
from .._definition._spec import parse
from .._engine import _snapshot as snapshots
from .._engine._fold import RunView
from .._engine._gates import shown
from .._errors import InterlockError, RunNotFound, UsageError
from .._plugins._compile import reading_plan
from .._store import RunRow, Store, release_store
from ._load import (
    RESUMABLE,
    TRACE_PAGE,
    _key_missing,
    definition_hash,
    open_store_arg,
    plan_maker,
    run_key,
)

# a run that completed, was rejected or was cancelled is over (a FAILED one may be
# resumed): what may follow its final record -- a server's notes that it told a chat,
# and a fork's first record (a fork's log is a copy of the run it was forked from)
_OVER = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})
_AFTER_END = L.AFTER_END | {L.RUN_FORKED}


class ChildLinks:
    """Which ``child.started`` records of a run are links to its child runs, as every
    reader (`trace`, `export`, `verify`) follows them: one the engine wrote (`forged`
    finds none), of a run not already nested (a crash may log a child's start twice),
    whose row names this run -- or a run it was forked from -- as its parent. ``above``:
    the runs this one is nested under (never followed again: no cycle)."""

    def __init__(self, row: RunRow, above: tuple[str, ...] = ()) -> None:
        self.row = row
        self.path = (*above, row.run_id)
        self.nodes: Mapping[str, NodeSpec] | None = None  # the definition's, when first needed
        self.seen: set[str] = set()
        self._lineage: set[str] | None = None

    async def follow(self, st: Store, rec: L.Record) -> str | None:
        """The child run ``rec`` links to, the first time it is met, else None."""
        if rec.get("type") != L.CHILD_STARTED:
            return None
        if self.nodes is None:
            try:
                self.nodes = parse(self.row.definition).nodes
            except InterlockError:  # a definition changed in the store: verify says so
                self.nodes = {}
        if forged(self.nodes, self.path, rec):
            return None
        child = str(rec["run_id"])
        if child in self.seen:
            return None
        self.seen.add(child)
        try:
            parent = ((await st.get_run(child)).options.get("parent") or {}).get("run")
            if self._lineage is None:
                self._lineage = await _lineage(st, self.row.run_id)
        except RunNotFound:
            return None
        return child if parent in self._lineage else None


def forged(nodes: Mapping[str, NodeSpec], path: tuple[str, ...], rec: L.Record) -> str | None:
    """Why ``rec``, of one of the engine's namespaces that the fold does not check
    (``child.``, ``snapshot.``, ``notify.``), is not a record interlock wrote there, or
    None. ``nodes``: the run's definition's; ``path``: the run's id last, after the runs
    it is nested under. (A node may not write these types, `ctx.log`: such a record was
    written to the store by hand, or by a node before they were reserved.)"""
    rtype = str(rec.get("type"))
    space = rtype.split(".", 1)[0]
    if space not in ("child", "snapshot", "notify"):
        return None
    node = rec.get("node")
    if space == "child":
        spec = nodes.get(node) if isinstance(node, str) else None
        if rtype != L.CHILD_STARTED or spec is None or (
                spec.workflow is None and not _workflow_tools(spec)):
            return (f"a {rtype} record of {node!r}, which is not a sub-workflow node: the "
                    "engine did not write it (a forged child link)")
        child = rec.get("run_id")
        if not isinstance(child, str) or not child:
            return f"a {rtype} record of {node!r} that names no child run"
        if child in path:
            return (f"a {rtype} record of {node!r} names the run {child!r}, which holds it: "
                    "a cycle of child runs (a forged child link)")
        return None
    if rtype == L.SNAPSHOT_TAKEN and node is None and rec.get("covers") == rec.get("seq", 0) - 1:
        return None
    if rtype == "notify.sent" and node is None:
        return None
    return (f"a {rtype} record{f' of {node!r}' if node else ''} that interlock did not write "
            f"(the {space}. namespace is interlock's own)")


def _workflow_tools(spec: NodeSpec) -> bool:
    """Whether an agent node has a workflow among its tools (a child run per call)."""
    tools = (spec.agent or {}).get("tools") if isinstance(spec.agent, dict) else None
    return any(isinstance(t, dict) and t.get("workflow") for t in tools or ())


@dataclass(frozen=True, slots=True)
class Verification:
    run_id: str
    ok: bool
    records: int
    seq: int | None = None  # the first bad record
    message: str = ""
    keyed: bool = False  # the chain is keyed, and was checked with the key
    notes: tuple[str, ...] = ()  # findings that do not break the log (a forged snapshot)
    children: tuple[str, ...] = ()  # the child runs verified with it (sub-workflows)
    # False: ``seq`` is where the break shows, not the first bad record, which is not
    # known (an export's records that do not end at its header's chain hash)
    located: bool = True
    # each run.migrated of an intact log, whose segments were checked under their own
    # definitions: {seq, by, from_hash, to_hash}
    migrations: tuple[dict[str, object], ...] = ()

    @property
    def plain(self) -> bool:
        """Not verified as keyed, but checked as a plain chain and intact (`verify`'s
        ``plain``: a log that is not keyed, while a key is set): not ok, no bad record,
        the records counted -- where "not verified" at all counts none."""
        return not self.ok and self.seq is None and self.records > 0


def migrated(entries: list[L.Entry]) -> list[dict[str, object]]:
    """The ``run.migrated`` records among ``entries``, as `Verification` reports them."""
    out: list[dict[str, object]] = []
    for e in entries:
        if e.type == L.RUN_MIGRATED:
            rec = e.record()
            out.append({"seq": e.seq, "by": rec.get("by"), "from_hash": rec.get("from_hash"),
                        "to_hash": rec.get("to_hash")})
    return out


class LogCheck:
    """`verify`'s checks made one page of entries at a time (`feed`, then `result`), so
    that a long log is never held whole -- by ``interlock verify`` and by ``interlock
    trace``, which verifies as it goes: the chain (keyed or plain), the first record and
    the definition, the fold, the summary, and the snapshot (``snapshot``: the run's
    stored one, as ``(seq, data)``; a mismatch is a note, not a broken log).
    """

    def __init__(self, row: RunRow, snapshot: tuple[int, bytes] | None = None,
                 above: tuple[str, ...] = (), plain: list[str] | None = None) -> None:
        self.row = row
        self.path = (*above, row.run_id)  # the runs it is nested under, then its own
        self.records = 0
        self.last: L.Entry | None = None
        self.problem: Verification | None = None
        self.view: RunView | None = None
        self.snapshot = snapshot
        self.notes: list[str] = []
        self.keyed, self.key = False, None
        # the log cannot be checked with the key at hand (none, another, or one for a
        # plain log): "not verified" (``seq`` None), not a broken log -- no record was read
        try:
            self.keyed, self.key = run_key(row)
        except UsageError as exc:
            self._unchecked(str(exc))
            return
        if self.keyed and self.key is None:
            self._unchecked(_key_missing(row))
        elif not self.keyed and L.env_key() is not None and plain is not None:
            plain.append(row.run_id)  # its plain chain checked: `verify`'s ``plain``
        elif not self.keyed and L.env_key() is not None:
            self._unchecked(f"{L.LOG_KEY_ENV} is set, but the log of run {row.run_id!r} is "
                            "not keyed, so the key proves nothing about it: a run started "
                            "without the key, or a log rewritten without it, look the same; "
                            f"unset {L.LOG_KEY_ENV} to check its plain chain")

    def _unchecked(self, message: str) -> None:
        self.problem = Verification(self.row.run_id, False, 0, None, message)

    def _fail(self, seq: int, message: str) -> None:
        self.problem = Verification(self.row.run_id, False, self.records, seq, message)

    def feed(self, entries: list[L.Entry]) -> None:
        if self.problem is not None or not entries:
            return
        first = self.last is None
        found = L.verify_chain(entries, start=self.records, key=self.key,
                               prev_hash=self.last.hash if self.last else L.GENESIS)
        self.records += len(entries)
        if found is not None:
            return self._fail(found.seq, found.message)
        if first and not self._first(entries[0]):
            return None
        self._check_snapshot(entries)
        assert self.view is not None
        for entry in entries:
            if self.view.status in _OVER and entry.type not in _AFTER_END:
                return self._fail(entry.seq, f"the {entry.type} record comes after the run "
                                             f"ended ({self.view.status}): only notify.sent "
                                             "may follow a run's final record")
            try:
                rec = entry.record()
                why = forged(self.view.plan.spec.nodes, self.path, rec) \
                    if entry.type.split(".", 1)[0] in ("child", "snapshot", "notify") else None
                if why is not None:
                    return self._fail(entry.seq, f"the log holds {why}")
                if entry.type == L.RUN_MIGRATED and self.view.migration is None and \
                        rec.get("from_hash") != self.row.definition_hash:
                    return self._fail(entry.seq, "the run.migrated record's from_hash is not "
                                                 "the definition the run started with")
                self.view.apply(rec)
            except (InterlockError, KeyError, IndexError, TypeError, ValueError) as exc:
                return self._fail(entry.seq,
                                  f"the record does not follow from the ones before: {exc}")
        self.last = entries[-1]
        return None

    async def settle(self, st: Store, rounds: int = 3) -> None:
        """When the log read ends past the summary read before it (records appended
        while it was read: a running run's, a ``notify.sent`` after an ended run's final
        record), read the summary again and the records appended since, a few rounds at
        most: a log that outgrows its summary for good is still reported."""
        for _ in range(rounds):
            if self.problem is not None or self.last is None or \
                    self.last.seq <= self.row.summary.last_seq:
                return
            fresh = await st.get_run(self.row.run_id)
            self.row = dataclasses.replace(self.row, summary=fresh.summary)
            async for entries in st.iter_entries(self.row.run_id, after=self.last.seq,
                                                 page=TRACE_PAGE):
                self.feed(entries)

    def _first(self, entry: L.Entry) -> bool:
        row = self.row
        if entry.type != L.RUN_STARTED:
            self._fail(1, "the log does not begin with run.started")
            return False
        rec = entry.record()
        if definition_hash(row.definition) != row.definition_hash or \
                rec.get("definition_hash") != row.definition_hash:
            self._fail(1, "the stored definition does not match the hash recorded when the "
                          "run started")
            return False
        if (rec.get("chain"), rec.get("key_id")) != \
                (row.options.get("chain"), row.options.get("key_id")):
            self._fail(1, "the run's row and its run.started record disagree about how its "
                          "log is chained")
            return False
        # each segment of a migrated run under its own definition
        self.view = RunView(reading_plan(parse(row.definition)), plans=plan_maker())
        return True

    def _check_snapshot(self, entries: list[L.Entry], *, end: bool = False) -> None:
        """Whether the record after the snapshot vouches for it, once it is read (or
        at the ``end`` of the log, when there is none)."""
        if self.snapshot is None:
            return
        seq, raw = self.snapshot
        after = [e for e in entries if e.seq == seq + 1]
        if after or end or self.records > seq + 1:
            why = snapshots.unbound(raw, seq, after)
            if why is not None:
                self.notes.append(f"the snapshot at record {seq} does not match the log "
                                  f"({why}); it is not used: status and resume fold the "
                                  "whole log")
            self.snapshot = None

    def result(self) -> Verification:
        run_id = self.row.run_id
        if self.problem is not None:
            return Verification(run_id, False, self.records, self.problem.seq,
                                self.problem.message)
        if self.last is None or self.view is None:
            return Verification(run_id, False, 0, 1, "the log does not begin with run.started")
        self._check_snapshot([], end=True)  # a snapshot past the end of the log
        s, view, last = self.row.summary, self.view, self.last
        # the status a run's row is written with (`_journal.Journal.flush`): WAITING_APPROVAL
        # while a gate waits, also when its fold says the executor has work (a decision
        # recorded for a worker -- ``--detach`` -- while other gates still wait)
        status = shown(view)[0] if view.gates else view.status
        if s.status == view.status:  # (a row written before gates were shown so)
            status = view.status
        facts = [("status", s.status, status), ("last seq", s.last_seq, last.seq),
                 ("last hash", s.last_hash, last.hash), ("steps", s.steps, view.steps),
                 ("tokens", s.tokens, view.tokens)]
        for what, stored, folded in facts:
            if stored != folded and not (what == "status" and stored in RESUMABLE
                                         and folded in RESUMABLE):
                return Verification(run_id, False, self.records, last.seq,
                                    f"the run's summary says {what} = {stored!r} but its log "
                                    f"gives {folded!r}")
        return Verification(run_id, True, self.records, keyed=self.keyed,
                            notes=tuple(self.notes))


async def verify(run_id: str, *, store: str | Store | None = None, plain: bool = False,
                 share_loop: bool = False) -> Verification:
    """Check the hash chain, the definition and the fold against the run's summary, a
    page of records at a time.

    A keyed log is checked with ``$INTERLOCK_LOG_KEY`` (without it, it cannot be
    checked: not ok). With the key set, a log that is not keyed is not ok either: it
    cannot prove that a holder of the key wrote it -- and is not checked at all (unset
    the key to check its plain chain), unless ``plain``: then its plain chain and the
    rest are checked, and an intact one is still not ok, with no bad record
    (`Verification.plain`; a server's verify, which cannot unset its key).

    ``share_loop``: give the event loop back every `SHARE_EVERY` records checked, so a
    long log does not stall the loop's other tasks (a server's requests and streams).
    """
    st, owned = open_store_arg(store)
    try:
        unkeyed: list[str] = []
        result = await _verify(st, run_id, (), unkeyed if plain else None, share_loop)
        if result.ok and unkeyed:
            return dataclasses.replace(result, ok=False, message=_plain_only(unkeyed))
        return result
    finally:
        if owned:
            await release_store(st)


SHARE_EVERY = 200  # records checked between two yields to the event loop (`share_loop`)


def _plain_only(runs: list[str]) -> str:
    logs = (f"run {runs[0]!r} was" if len(runs) == 1 else
            f"runs {', '.join(map(repr, runs))} were")
    return (f"plain chain intact, not keyed: {logs} written without {L.LOG_KEY_ENV} (a run "
            "started before the key was set, and a log rewritten without it, look the "
            "same), so the key proves nothing about it: anyone with write access to the "
            "store could have rewritten it")


async def _lineage(st: Store, run_id: str) -> set[str]:
    """A run and the runs it was forked from (whose records a fork's log copies)."""
    out: set[str] = set()
    rid: str | None = run_id
    while rid is not None and rid not in out:
        out.add(rid)
        rid = (await st.get_run(rid)).parent_run
    return out


async def _verify(st: Store, run_id: str, above: tuple[str, ...],
                  plain: list[str] | None = None, share_loop: bool = False) -> Verification:
    """`verify` of one run and, when it holds, of every child run its log names
    (``verify PARENT`` verifies every child chain): the first broken one is the
    result, under its own id. ``above``: the runs it is nested under (its parent last);
    ``plain``: where the runs checked as plain chains under a key are listed."""
    row = await st.get_run(run_id)
    check = LogCheck(row, await st.load_snapshot(run_id), above, plain)
    children: list[str] = []
    moves: list[dict[str, object]] = []
    # sharing the loop, smaller pages: each is checked between two yields, and read
    # that small too (the store's thread builds a page's entries holding the GIL, which
    # the loop's thread waits for)
    async for entries in st.iter_entries(run_id,
                                         page=SHARE_EVERY if share_loop else TRACE_PAGE):
        if share_loop:
            await _share()
        check.feed(entries)
        if check.problem is None and check.view is not None:
            # (LogCheck refused a child.started the engine did not write)
            children += [str(e.record().get("run_id")) for e in entries
                         if e.type == L.CHILD_STARTED]
            moves += migrated(entries)
    await check.settle(st)  # (a child.started is never appended after the summary's end)
    result = check.result()
    if result.ok and moves:
        result = dataclasses.replace(result, migrations=tuple(moves))
    parent = above[-1] if above else None
    if parent is not None and result.ok and \
            (row.options.get("parent") or {}).get("run") not in await _lineage(st, parent):
        return Verification(run_id, False, result.records, 1,
                            f"the child run does not name {parent!r} (or a run it was "
                            "forked from) as its parent")
    if not result.ok:
        return result
    verified: list[str] = []
    for child in dict.fromkeys(children):
        try:
            found = await _verify(st, child, (*above, run_id), plain, share_loop)
        except RunNotFound:
            return Verification(child, False, 0, None, f"the child run {child!r} that run "
                                f"{run_id!r} names is not in the store")
        if not found.ok:
            return found
        verified += [child, *found.children]
    return dataclasses.replace(result, children=tuple(verified))


async def _share() -> None:
    """Give the event loop back (`verify`'s ``share_loop``); a test holds a verify here."""
    await asyncio.sleep(0)
