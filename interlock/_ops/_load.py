"""Loading a stored run: its row read, its chain and summary checked, its workflow rebuilt
from the stored definition, its records folded (`load_run`); `status`, the run as its
log tells it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .. import _log as L
from .._definition._model import WorkflowSpec
from .._definition._plan import Plan
from .._definition._spec import parse
from .._engine import _snapshot as snapshots
from .._engine._expand import Expander
from .._engine._fold import RunResult, RunView, result_of
from .._errors import InterlockError, LogError, UsageError, WorkflowError
from .._json import JSONObject
from .._plugins._compile import compile_spec, reading_plan
from .._store import RunRow, Store, acquire_store, release_store
from ._code import drift

TRACE_PAGE = 2000  # records read from the store at a time by `trace_pages`


class Functions(Protocol):
    """What a resume needs of a `Workflow` besides the stored definition: the Python
    functions of its builder-made nodes, by call path."""

    @property
    def callables(self) -> Mapping[str, Callable[..., object]]: ...


log = logging.getLogger("interlock")

RESUMABLE = {"RUNNING", "RETRYING", "FAILED", "PENDING"}
TERMINAL_STATUSES = frozenset(L.TERMINAL_TYPES.values())
ENDED = frozenset({"COMPLETED", "REJECTED", "CANCELLED"})  # (a FAILED run may go on)


def open_store_arg(store: str | Store | None) -> tuple[Store, bool]:
    """A `Store` for an argument that may be a URL; True when it is the URL's shared
    store (`acquire_store`), which the caller gives back with `release_store`."""
    if isinstance(store, Store):
        return store, False
    return acquire_store(store), True


@dataclass
class Loaded:
    row: RunRow
    entries: list[L.Entry]  # the records folded from the log (after the snapshot, if one)
    spec: WorkflowSpec  # the definition the run started with
    plan: Plan  # its plan: executable (functions resolved) or for reading only
    view: RunView
    last: tuple[int, str]  # seq and chain hash of the run's last record
    key: L.ChainKey | None = None  # the run's chain key, when it is keyed and we have it
    keyed: bool = False
    notes: list[str] = field(default_factory=list)  # what a reader should be told

    def writer(self) -> L.LogWriter:
        """A writer that continues the run's log."""
        if self.keyed and self.key is None:
            raise UsageError(_key_missing(self.row))
        return L.LogWriter(*self.last, key=self.key)


def definition_hash(definition: Mapping[str, object]) -> str:
    return hashlib.sha256(L.dumps(definition)).hexdigest()


def chain_options(key: L.ChainKey | None) -> dict[str, object]:
    """What a new run's row and its run.started say of its chain (nothing when plain)."""
    return {} if key is None else {"chain": L.KEYED, "key_id": key.id}


_BROKEN_LOG_ADVICE = ("`interlock verify {run_id}` shows where the chain breaks; a broken log is "
                "never continued: restore the run from a backup or an export (`interlock "
                "export` made before the change, checked with `interlock verify --file`)")


def _key_missing(row: RunRow) -> str:
    return (f"run {row.run_id!r} has a keyed log (key id {row.options.get('key_id')}): set "
            f"{L.LOG_KEY_ENV} to the key it was written with to check or continue it")


def run_key(row: RunRow) -> tuple[bool, L.ChainKey | None]:
    """Whether the run's chain is keyed, and the key to check it with (None: not at hand).

    A key that is set but is not the run's is refused: every hash would disagree.
    """
    if row.options.get("chain") is None:
        return False, None
    if row.options.get("chain") != L.KEYED:
        raise UsageError(f"run {row.run_id!r}: its log uses the chain "
                         f"{row.options.get('chain')!r}, which this interlock does not know; "
                         "upgrade interlock")
    key = L.env_key()
    if key is not None and key.id != row.options.get("key_id"):
        raise UsageError(f"run {row.run_id!r} was written with the log key "
                         f"{row.options.get('key_id')}, but {L.LOG_KEY_ENV} holds the key "
                         f"{key.id}; set it to the run's key")
    return True, key


def check_tail(row: RunRow, entries: list[L.Entry], start: int, start_hash: str) -> str | None:
    """Why the log's end disagrees with the run's summary, if it does.

    The summary is written in the same transaction as the records, and read before
    them, so the log may have grown since (another process appending) but never end
    before the summary's last record, nor hold another record there.
    """
    s = row.summary
    last = entries[-1].seq if entries else start
    if last < s.last_seq:
        return (f"the log ends at record {last}, but the run's summary says it has "
                f"{s.last_seq} records: records were removed from its end")
    if s.last_seq == start:
        at_hash = start_hash
    elif s.last_seq > start:
        at_hash = entries[s.last_seq - start - 1].hash
    else:
        return None  # before the snapshot: the caller folds the whole log and asks again
    if at_hash != s.last_hash:
        return (f"record {s.last_seq} is not the one the run's summary names (its hash "
                "differs): the log was changed at its end")
    return None


def plan_maker(workflow: Functions | None = None, *, executable: bool = False,
               executor: Literal["local", "ray"] | None = None
               ) -> Callable[[JSONObject], Plan]:
    """How a stored definition becomes a plan: executable (its functions resolved, the
    builder's ``workflow`` functions by call path; bodies on ``executor``) or for reading
    only. The fold uses it again for a ``run.migrated``'s definition."""
    def make(definition: JSONObject) -> Plan:
        spec = parse(definition)
        if executor is not None:  # where this process runs the bodies (a worker's --executor)
            spec = spec.model_copy(update={"nodes": {
                name: ns.on_executor(executor) for name, ns in spec.nodes.items()}})
        if not executable:
            return reading_plan(spec)
        return compile_spec(spec, workflow.callables if workflow is not None else {})[0]
    return make


async def load_run(store: Store, run_id: str, *, workflow: Functions | None = None,
                   executable: bool = False, upto: int | None = None,
                   executor: Literal["local", "ray"] | None = None) -> Loaded:
    """Read a run, check its chain, rebuild its workflow from the stored definition and fold.

    ``executable`` resolves the node functions (needed to continue the run); reading
    needs only the graph. ``upto`` folds the records up to that seq only (from the
    start); otherwise the latest snapshot is used when it is bound to the log (its
    digest in the ``snapshot.taken`` record after it, which the chain covers) and only
    the records after it are read, checked and folded. A log that is broken, or whose
    end disagrees with the run's summary, is refused.
    """
    row = await store.get_run(run_id)
    _check_definition(row)
    keyed, key = run_key(row)
    if keyed and key is None and executable:
        raise UsageError(_key_missing(row))
    notes = [f"its log is keyed (key id {row.options.get('key_id')}) and {L.LOG_KEY_ENV} is "
             "not set: its hashes were not checked"] if keyed and key is None else []
    plans = plan_maker(workflow, executable=executable, executor=executor)
    plan = plans(row.definition)
    spec = plan.spec
    view: RunView | None = None
    start, start_hash = 0, L.GENESIS
    entries: list[L.Entry] = []
    if upto is None:
        view, start, start_hash, entries = await _from_snapshot(store, row, plan, notes)
    if start == 0:
        entries = await store.entries(run_id)
    _check_log(row, entries, start, start_hash, key, keyed)
    if view is None:
        view = RunView(plan)
    view.plans = plans  # a run.migrated's definition, read as this one is
    view.snapshot_at = start
    for entry in entries:
        if upto is not None and entry.seq > upto:
            break
        rec = entry.record()
        if entry.type == L.SNAPSHOT_TAKEN:
            view.snapshot_at = int(rec.get("covers") or 0)
        view.apply(rec)
    last = (entries[-1].seq, entries[-1].hash) if entries else (start, start_hash)
    if view.plan is not plan:  # migrated: the run goes on under its new definition
        plan, spec = view.plan, view.plan.spec
    for note in notes:
        log.warning("run %s: %s", run_id, note)
    return Loaded(row, entries, spec, plan, view, last, key, keyed, notes)


# The load's checks, in order, each before anything is built on what it checks:
#   1. the stored definition against the hash ``run.started`` recorded (`_check_definition`):
#      an edited definition would run (or show) another workflow under the old log;
#   2. a keyed log without its key: readable, its hashes unchecked (a note), never
#      continued (`UsageError`: its next records could not be chained without the key);
#   3. a snapshot only when the record after it binds its digest into the chain and it
#      is not past the log's end (`_from_snapshot`); otherwise the whole log is folded;
#   4. the chain of every record read (`_check_log`), then the log's end against the
#      run's summary: a record lost, added or changed is refused, not folded.


def _check_definition(row: RunRow) -> None:
    if definition_hash(row.definition) != row.definition_hash:
        raise LogError(f"run {row.run_id!r}: the stored definition does not match the hash "
                       "recorded when the run started: it was changed in the store since; "
                       "nothing reads or continues the run until it is restored (from a "
                       f"backup, or an export: `interlock verify --file`); `interlock verify "
                       f"{row.run_id}` reports it", run_id=row.run_id)


async def _from_snapshot(store: Store, row: RunRow, plan: Plan, notes: list[str]
                         ) -> tuple[RunView | None, int, str, list[L.Entry]]:
    """The view restored from the run's snapshot, its seq and chain hash, and the entries
    after it; ``(None, 0, GENESIS, [])`` when there is none or it may not be used (why
    goes in ``notes``)."""
    run_id = row.run_id
    snap = await store.load_snapshot(run_id)
    restored = snapshots.load(plan, snap[1]) if snap is not None else None
    if restored is None or snap is None:
        return None, 0, L.GENESIS, []
    view, start_hash = restored
    start = view.seq
    entries = await store.entries(run_id, after=start)
    why = snapshots.unbound(snap[1], start, entries)
    if why is None and row.summary.last_seq < start:
        why = "it is past the end of the log"
    if why is not None:
        notes.append(f"the snapshot at record {start} was not used: {why}; "
                     "the whole log was folded instead")
        return None, 0, L.GENESIS, entries
    return view, start, start_hash, entries


def _check_log(row: RunRow, entries: list[L.Entry], start: int, start_hash: str,
               key: L.ChainKey | None, keyed: bool) -> None:
    run_id = row.run_id
    problem = L.verify_chain(entries, start=start, prev_hash=start_hash, key=key,
                             hashes=not keyed or key is not None)
    if problem is not None:
        raise LogError(f"run {run_id!r}: the log is broken at record {problem.seq} "
                       f"({problem.message}); {_BROKEN_LOG_ADVICE.format(run_id=run_id)}",
                       run_id=run_id)
    tail = check_tail(row, entries, start, start_hash)
    if tail is not None:
        raise LogError(f"run {run_id!r}: {tail}; {_BROKEN_LOG_ADVICE.format(run_id=run_id)}",
                       run_id=run_id)


async def load_resumable(st: Store, run_id: str, workflow: Functions | None) -> Loaded:
    """`load_run` of a run to continue; one whose code no longer loads and that ended
    long ago (it may name functions renamed since) is refused as an ended run."""
    try:
        return await load_run(st, run_id, workflow=workflow, executable=True)
    except WorkflowError:
        status = (await st.get_run(run_id)).summary.status
        if status in ("COMPLETED", "REJECTED", "CANCELLED"):
            raise UsageError(f"run {run_id!r} is {status}; only a failed, interrupted or "
                             "waiting run can be resumed") from None
        raise


async def status(run_id: str, *, store: str | Store | None = None) -> RunResult:
    """The run as its log tells it (with the nodes still to run whose code changed)."""
    st, owned = open_store_arg(store)
    try:
        loaded = await load_run(st, run_id)
        result = result_of(run_id, loaded.row.workflow, loaded.view)
        if loaded.view.status not in ENDED:
            changed, _ = await drift(st, run_id, loaded.plan, loaded.view)
            if changed:
                result = dataclasses.replace(result, code_changed=sorted(changed))
        return result
    finally:
        if owned:
            await release_store(st)


async def expander(st: Store, row: RunRow, after: int = 0) -> Expander | None:
    """What reads the run's records as format 1 writes them (`_engine._expand`), from
    record ``after`` on, with the plan in force there (the definition of the last
    ``run.migrated`` before it, else the run's); None when its definition no longer
    loads (read as stored). A server's event stream asks at every commit: the plans, and
    what each run's log says up to where it was last read (`read_to`), are kept
    (`_EXPANDING`); the records between are read once, for a ``run.migrated``."""
    plans, known = _EXPANDING
    plan = plans.get(row.definition_hash)
    if plan is None:
        try:
            plan = reading_plan(parse(row.definition))
        except (InterlockError, ValueError):
            return None
        if len(plans) >= _EXPANDING_KEPT:
            plans.clear()
        plans[row.definition_hash] = plan
    exp = Expander(plan, plans=plan_maker())
    if not after:
        return exp
    key = (row.run_id, row.created_at)
    seen = known.get(key)
    if seen is not None and seen.format < 2:  # (format 1 implies nothing, and stays 1)
        exp.format = seen.format
        return exp
    if seen is None or seen.upto < after:  # read what is not known yet, up to ``after``
        upto = 0
        if seen is not None:
            exp.format, exp.plan, upto = seen.format, seen.plans[-1][1], seen.upto
        while upto < after:
            entries = await st.entries_page(row.run_id, upto, min(1000, after - upto))
            if not entries:
                break
            for entry in entries:
                if entry.seq == 1 or entry.type == L.RUN_MIGRATED:
                    exp(entry.record())
                    read_to(row, exp, entry.seq)
            upto = entries[-1].seq
            if exp.format < 2:  # (format 1 implies nothing: no plan needed)
                break
        read_to(row, exp, after)
        return exp
    exp.format = seen.format
    exp.plan = next(p for at, p in reversed(seen.plans) if at <= after)
    return exp


def imply(row: RunRow, exp: Expander, records: list[dict[str, Any]]) -> None:
    """Log format 2: what each of a page of the run's ``records`` (in log order) implies,
    in its ``implies`` (`_engine._expand`); the next page's reader starts after them."""
    for rec in records:
        implied = exp(rec)[1:]
        if implied:
            rec["implies"] = implied
    if records:
        read_to(row, exp, records[-1]["seq"])


def read_to(row: RunRow, exp: Expander, seq: int) -> None:
    """The run's log has been read through ``exp`` up to record ``seq``: its format and
    plan there are known (`expander` starts there again without reading)."""
    known = _EXPANDING[1]
    key = (row.run_id, row.created_at)
    seen = known.get(key)
    if seen is None:
        if len(known) >= _EXPANDING_KEPT:
            known.clear()
        known[key] = seen = _Read(exp.format, [(0, exp.plan)], seq)
    if seq <= seen.upto:
        return
    seen.format, seen.upto = exp.format, seq
    if seen.plans[-1][1] is not exp.plan:  # a run.migrated read meanwhile
        seen.plans.append((seq, exp.plan))


@dataclass(slots=True)
class _Read:
    """What a run's log says up to record ``upto``: its format, and the plan from each
    seq on (the run's, then each ``run.migrated``'s)."""
    format: int
    plans: list[tuple[int, Plan]]
    upto: int


_EXPANDING: tuple[dict[str, Plan], dict[tuple[str, float], _Read]] = ({}, {})
_EXPANDING_KEPT = 1024
