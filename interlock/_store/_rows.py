"""The row codec the SQLite and PostgreSQL stores share: a run's columns and their
order, a `RunRow` to and from them (JSON as text), a summary's values, the two lists'
queries, the check that appended entries continue the stored log, the claim rule, and an
`Entry` read back from a record's JSON and hash."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from .._log import Entry, json_default
from ._base import ConflictError, RunRow, Summary, owner_gone

# the name both stores write in their interlock_meta (each has its own version number)
SCHEMA_NAME = "interlock"

_RUN_COLUMNS = (
    "run_id, workflow, status, definition, definition_hash, input, options, created_at, "
    "updated_at, last_seq, last_hash, steps, tokens, error, waiting, parent_run, parent_seq, "
    "owner, lease_until, extra, generation"
)

# `_RUN_COLUMNS` of a run: its row's, then its spec's (`run_params` order otherwise)
_SPEC_COLUMNS = ("definition", "input", "options")
_RUN_NAMES = [c.strip() for c in _RUN_COLUMNS.split(",")]
# a list's row (`Store.list_page`): the runs table's columns alone, its spec's read as {}
_LIGHT_COLUMNS = ", ".join("'{}'" if c in _SPEC_COLUMNS else c for c in _RUN_NAMES)


# a run's values for `_RUN_COLUMNS`, and a summary's for its columns (`summary_params`)
RunParams = tuple[str, str, str, str, str, str, str, float, float, int, str, int, int,
                  str | None, str | None, str | None, int | None, str | None, float | None,
                  str, int]
SummaryParams = tuple[str, float, int, str, int, int, str | None, str | None]


def json_text(value: object) -> str:
    """``value`` as JSON text, keys in their given order (a definition's order matters)."""
    return orjson.dumps(value, default=json_default).decode("utf-8")


def json_opt(value: Mapping[str, object] | None) -> str | None:
    return None if value is None else json_text(value)


def from_json(text: str | None) -> Any:  # JSON, typed as RunRow's fields are
    return None if text is None else orjson.loads(text)


def record_node(entry: Entry) -> str | None:
    """The record's ``node`` field, for the ``records.node`` column (the entry carries
    it: `LogWriter` sets it, and so do the stores when they read entries back)."""
    return entry.node


def check_first_seqs(run_id: str, last: int, entries: Iterable[Entry]) -> None:
    """Entries must continue the stored log (``last`` = its highest seq) without a gap."""
    expected = last + 1
    for e in entries:
        if e.seq > expected == last + 1:  # a gap after the log: not another writer
            raise ConflictError(
                f"run {run_id!r}: record {e.seq} does not follow the stored log, which ends "
                f"at seq {expected - 1}: the records before it were never stored (an earlier "
                "append of this writer failed); nothing of this append was stored")
        if e.seq != expected:
            raise ConflictError(
                f"run {run_id!r}: record {e.seq} conflicts with the stored log "
                f"(next free seq is {last + 1}); another writer got there first"
            )
        expected += 1


def run_params(row: RunRow) -> RunParams:
    """``row`` as the values of `_RUN_COLUMNS`, in order."""
    s = row.summary
    return (
        row.run_id, row.workflow, s.status, json_text(row.definition), row.definition_hash,
        json_text(row.input), json_text(row.options), row.created_at, s.updated_at,
        s.last_seq, s.last_hash, s.steps, s.tokens, json_opt(s.error), json_opt(s.waiting),
        row.parent_run, row.parent_seq, row.owner, row.lease_until, json_text(row.extra),
        row.generation,
    )


def summary_params(summary: Summary) -> SummaryParams:
    """For ``SET status, updated_at, last_seq, last_hash, steps, tokens, error, waiting``."""
    s = summary
    return (s.status, s.updated_at, s.last_seq, s.last_hash, s.steps, s.tokens,
            json_opt(s.error), json_opt(s.waiting))


def _filters(mark: str, status: str | None, workflow: str | None
             ) -> tuple[list[str], list[str | float]]:
    """The conditions on a run's status and workflow both lists take, and their values."""
    where: list[str] = []
    params: list[str | float] = []
    if status is not None:
        where.append(f"status = {mark}")
        params.append(status)
    if workflow is not None:
        where.append(f"workflow = {mark}")
        params.append(workflow)
    return where, params


def list_query(mark: str, source: str, status: str | None, workflow: str | None,
               limit: int) -> tuple[str, list[str | float]]:
    """`Store.list_runs`'s SELECT (whole rows, from ``source``: the runs table, or what
    joins it to the runs' specs) and its parameters (``mark``: the driver's placeholder)."""
    where, params = _filters(mark, status, workflow)
    sql = f"SELECT {_RUN_COLUMNS} FROM {source}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY created_at DESC LIMIT {mark}"
    params.append(limit)
    return sql, params


def page_query(mark: str, status: str | None, workflow: str | None,
               before: tuple[float, str] | None, updated_after: float | None,
               limit: int, *, order_id: str = "run_id") -> tuple[str, list[str | float]]:
    """`Store.list_page`'s SELECT over the runs table and its parameters (``mark``: the
    driver's placeholder; ``order_id``: how run ids compare, the same in the keyset
    condition as in the ORDER BY)."""
    where, params = _filters(mark, status, workflow)
    if updated_after is not None:
        where.append(f"updated_at > {mark}")
        params.append(updated_after)
    if before is not None:
        # a range on created_at (the indexes' order) and the tie broken by run id
        where.append(f"created_at <= {mark} AND (created_at < {mark} OR {order_id} < {mark})")
        params += [before[0], before[0], before[1]]
    sql = f"SELECT {_LIGHT_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY created_at DESC, {order_id} DESC LIMIT {mark}"
    params.append(max(limit, 0))
    return sql, params


def row_from(values: Sequence[Any]) -> RunRow:
    """A `RunRow` from a result row in `_RUN_COLUMNS` order."""
    (run_id, workflow, status, definition, definition_hash, input_, options, created_at,
     updated_at, last_seq, last_hash, steps, tokens, error, waiting, parent_run, parent_seq,
     owner, lease_until, extra, generation) = values
    return RunRow(
        run_id=run_id,
        workflow=workflow,
        definition=from_json(definition),
        definition_hash=definition_hash,
        input=from_json(input_),
        options=from_json(options),
        created_at=created_at,
        summary=Summary(
            status=status, last_seq=last_seq, last_hash=last_hash, steps=steps, tokens=tokens,
            error=from_json(error), waiting=from_json(waiting), updated_at=updated_at,
        ),
        parent_run=parent_run,
        parent_seq=parent_seq,
        owner=owner,
        lease_until=lease_until,
        extra=from_json(extra) or {},
        generation=int(generation or 0),
    )


def claim_refused(row_owner: str | None, lease_until: float | None, owner: str, now: float,
                  force: bool) -> bool:
    """The claim rule shared by every backend (see `interlock._store._memory`)."""
    return (not force and row_owner not in (None, owner) and lease_until is not None
            and lease_until > now and not owner_gone(row_owner or ""))



# -- reading records back ---------------------------------------------------------------

def stored_entry(seq: int, data: bytes, hash_: str) -> Entry:
    """An `Entry` read back from a store that keeps only a record's JSON and hash: its
    type and node are the JSON's (a record that is not a JSON object -- a tampered one --
    gets none, and `verify` reports it)."""
    try:
        rec = orjson.loads(data)
    except orjson.JSONDecodeError:
        rec = None
    if type(rec) is not dict:
        return Entry(seq, "", data, hash_, None)
    rtype, node = rec.get("type"), rec.get("node")
    return Entry(seq, rtype if type(rtype) is str else "", data, hash_,
                 node if type(node) is str else None)


def _as_bytes(value: object) -> bytes:
    """A cell someone changed to another type, as bytes (verify then reports the record)."""
    return bytes(value) if isinstance(value, bytes | bytearray | memoryview) \
        else str(value).encode("utf-8")


