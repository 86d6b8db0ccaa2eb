"""A run taken away from its store: ``interlock export`` writes it as JSON
lines, ``interlock verify --file`` proves it with no store.

The first line is the run's header: what its row holds (id, workflow, definition and
its hash, input, options -- how its chain is keyed --, parent, and its summary with
the last seq and the last chain hash). Every following line is one record, the exact
bytes the store keeps and the chain hashed, in seq order. Verifying recomputes the
chain from those bytes (with ``$INTERLOCK_LOG_KEY`` for a keyed log), folds the
records with the definition, and checks the end against the header: a record changed,
added, removed or cut off the tail does not chain to the header's last hash. The header
is the anchor, so an export is as trustworthy as the way its header reached you -- or,
for a keyed log, as the key: without the key nobody can write a chain that verifies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson

from .. import _log as L
from .._errors import UsageError
from .._store import RunRow, Store, Summary, release_store
from ._load import TRACE_PAGE, open_store_arg, run_key
from ._verify import ChildLinks, LogCheck, Verification, migrated

FORMAT = "interlock-run"
VERSION = 1


def header(row: RunRow) -> dict[str, object]:
    """The first line of a run's export."""
    s = row.summary
    return {
        "format": FORMAT, "version": VERSION, "run_id": row.run_id, "workflow": row.workflow,
        "definition": row.definition, "definition_hash": row.definition_hash,
        "input": row.input, "options": row.options, "created_at": row.created_at,
        "parent_run": row.parent_run, "parent_seq": row.parent_seq,
        "summary": {"status": s.status, "last_seq": s.last_seq, "last_hash": s.last_hash,
                    "steps": s.steps, "tokens": s.tokens, "error": s.error,
                    "waiting": s.waiting, "updated_at": s.updated_at},
    }


async def export(run_id: str, *, store: str | Store | None = None) -> AsyncIterator[bytes]:
    """The run as JSON lines (each ending in a newline), a page of records at a time,
    then each of its child runs (sub-workflows) the same way: its header, its records."""
    st, owned = open_store_arg(store)
    try:
        async for line in _export(st, run_id):
            yield line
    finally:
        if owned:
            await release_store(st)


async def _export(st: Store, run_id: str, above: tuple[str, ...] = ()
                  ) -> AsyncIterator[bytes]:
    row = await st.get_run(run_id)
    links = ChildLinks(row, above)
    children = [c async for c in _children(st, links)]
    yield orjson.dumps({**header(row), "children": children}) + b"\n"
    # the records the header counts, no more: one appended while this reads (a running
    # run's, or a notify.sent after an ended run's final record) is the next export's
    end = row.summary.last_seq
    async for entries in st.iter_entries(run_id, page=TRACE_PAGE):
        for entry in entries:
            if entry.seq > end:
                break
            yield entry.data + b"\n"
        if entries and entries[-1].seq >= end:
            break
    for child in children:
        async for line in _export(st, child, links.path):
            yield line


async def _children(st: Store, links: ChildLinks) -> AsyncIterator[str]:
    """The child runs a run's log links to (``child.started`` of its workflow nodes,
    as `trace` and `verify` follow them: never a forged one, never a cycle)."""
    async for entries in st.iter_entries(links.row.run_id, page=TRACE_PAGE):
        for entry in entries:
            if entry.type == L.CHILD_STARTED:
                child = await links.follow(st, entry.record())
                if child is not None:
                    yield child


def _row(head: dict[str, Any]) -> RunRow:
    s = head["summary"]
    return RunRow(
        run_id=str(head["run_id"]), workflow=str(head["workflow"]),
        definition=dict(head["definition"]), definition_hash=str(head["definition_hash"]),
        input=dict(head.get("input") or {}), options=dict(head.get("options") or {}),
        created_at=float(head.get("created_at") or 0.0),
        summary=Summary(str(s["status"]), int(s["last_seq"]), str(s["last_hash"]),
                        int(s.get("steps") or 0), int(s.get("tokens") or 0), s.get("error"),
                        s.get("waiting"), float(s.get("updated_at") or 0.0)),
        parent_run=head.get("parent_run"), parent_seq=head.get("parent_seq"))


_HEADER = b'{"format":"' + FORMAT.encode() + b'"'


def verify_export(lines: Iterable[bytes], *, source: str = "the export") -> Verification:
    """Verify an exported run from its lines alone (no store), and every child run the
    export holds after it: each chain, each fold, and that each child the parent's
    header names is there and names the parent."""
    sections: list[list[bytes]] = []
    for raw in lines:
        if raw.startswith(_HEADER) or not sections:
            sections.append([])
        sections[-1].append(raw)
    if not sections:
        sections = [[]]
    results = [_verify_one(section, source) for section in sections]
    heads = [orjson.loads(section[0]) for section in sections[1:]]
    first = results[0]
    if not first.ok:
        return first
    named = orjson.loads(sections[0][0]).get("children") or []
    parents = {first.run_id}
    by_id = {h["run_id"]: (h, r) for h, r in zip(heads, results[1:], strict=True)}
    wanted = list(named)
    for head, _ in by_id.values():
        wanted += [c for c in head.get("children") or () if c not in wanted]
    for child in wanted:
        if child not in by_id:
            return Verification(first.run_id, False, first.records, None,
                                f"the export names the child run {child!r} but does not hold "
                                "it (export it whole with `interlock export`)")
    for child_id, (head, result) in by_id.items():
        if not result.ok:
            return result
        parent = (head.get("options") or {}).get("parent") or {}
        if parent.get("run") not in parents | set(by_id):
            return Verification(child_id, False, result.records, 1,
                                "the child run does not name a run of this export as its "
                                "parent")
    return dataclasses.replace(first, children=tuple(by_id))


def _verify_one(lines: Iterable[bytes], source: str) -> Verification:
    """`verify_export` of one run: its header line, then its records."""
    it = iter(lines)
    first = next(it, b"").strip()
    if not first:
        raise UsageError(f"{source} is empty (no header line), not an interlock run "
                         "export: did the command that wrote it fail? (`interlock export RUN_ID > "
                         "FILE` leaves an empty file when the export fails)")
    try:
        head = orjson.loads(first)
        if head.get("format") != FORMAT:
            raise ValueError(f"its first line is not an interlock run's header (format "
                             f"{head.get('format')!r})")
        if head.get("version") != VERSION:
            raise ValueError(f"it is version {head.get('version')!r} of the format; this "
                             f"interlock reads version {VERSION}")
        row = _row(head)
    except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{source} is not an interlock run export (made by `interlock "
                         f"export RUN_ID`): {exc}") from None
    check = LogCheck(row)
    _, key = run_key(row) if check.problem is None else (False, None)
    prev, page, moves = L.GENESIS, [], []
    for seq, raw in enumerate(it, start=1):
        data = raw.rstrip(b"\r\n")
        if seq == 1:
            mismatch = _header_mismatch(head, data)
            if mismatch is not None:
                return Verification(row.run_id, False, 1, 1, mismatch)
        entry = _entry(seq, data, prev, key)
        prev = entry.hash
        page.append(entry)
        if len(page) >= TRACE_PAGE:
            check.feed(page)
            moves += migrated(page)
            page = []
    check.feed(page)
    moves += migrated(page)
    result = check.result()
    if result.ok and moves:
        return dataclasses.replace(result, migrations=tuple(moves))
    if result.ok or result.seq is None or check.last is None or check.problem is not None:
        return result
    # the records chain and fold: what is wrong is where they end
    last, expected = check.last, row.summary
    if last.seq != expected.last_seq:
        return Verification(row.run_id, False, result.records, last.seq,
                            f"the export ends at record {last.seq}, and its first line says "
                            f"the run's last record is {expected.last_seq} (records were "
                            f"{'cut off the end' if last.seq < expected.last_seq else 'added'})")
    if last.hash != expected.last_hash:
        # an export holds the chain hash only at the end (the header's): which record
        # changed is not known here -- the store's log, whose records each keep theirs, is
        return Verification(row.run_id, False, result.records, last.seq,
                            f"the records do not hash to the chain hash the export's first "
                            f"line ends with: at least one of records 1..{last.seq} was "
                            "changed (an export keeps no hash per record to say which); "
                            f"compare with the store's log: interlock verify {row.run_id}",
                            located=False)
    return result


def _header_mismatch(head: dict[str, object], first: bytes) -> str | None:
    """What of the header the chain does not vouch for, checked against ``run.started``
    (which it does): the workflow and the input. (The run id is in no record: it is the
    name the export goes by.)"""
    try:
        rec = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None  # the chain check reports it
    if not isinstance(rec, dict):
        return None
    for what in ("workflow", "input"):
        if rec.get(what, {} if what == "input" else None) != head.get(what):
            return (f"the export's first line and its run.started record disagree about "
                    f"the run's {what} (the chain vouches for the record, not the line)")
    return None


def _entry(seq: int, data: bytes, prev: str, key: L.ChainKey | None) -> L.Entry:
    """A line as the store would hand it out: its hash is the chain's, computed here (a
    changed record shows as a chain that does not end where the header says)."""
    try:
        rec = orjson.loads(data)
        rtype, node = str(rec.get("type")), rec.get("node")
        own = rec.get("seq")
        if type(own) is int:
            seq = own  # (a missing or reordered record is reported by its number)
    except (orjson.JSONDecodeError, AttributeError):
        rtype, node = "", None  # the chain check reports it as not valid JSON
    return L.Entry(seq, rtype, data, L.chain(prev, data, key),
                   node if isinstance(node, str) else None)


__all__ = ["FORMAT", "VERSION", "export", "header", "verify_export"]
