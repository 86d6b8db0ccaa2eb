"""`Workflow`: the Python builder, the loaded file, and the way to run either.

Both front ends meet here. ``interlock.load(path)`` parses a file into a
`WorkflowSpec`; ``interlock.Workflow("name")`` collects the same shape through
builder calls (`_builder.Builder`, the half of `Workflow` that collects them). Either
way the workflow is validated once (`_validate.check`), compiled into a `Plan`, and run
by the `Runner` (`_runner`) into a store.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _log as L
from ._builder import Builder, node_options
from ._definition._bounds import check_config, check_data, check_run_id
from ._definition._model import DEFAULT_STEPS, WorkflowSpec, check_limits
from ._definition._plan import Plan
from ._definition._spec import load_spec, parse
from ._definition._state import check_whole_values
from ._engine._approvals import Decision
from ._engine._fold import RunResult, RunView, result_of
from ._errors import ConflictError, Diagnostic, StoreError, UsageError, WorkflowError
from ._json import JSONObject
from ._observe._otel import RunSpans, run_spans, with_spans
from ._ops._claims import make_run_id
from ._ops._execute import create, drive, start
from ._ops._load import open_store_arg
from ._plugins._compile import check_spec, compile_spec, reading_plan
from ._store import Store, release_store

Listener = Callable[[L.Record, RunView], None]


class Workflow(Builder):
    """A workflow: build it in Python, or get one from `load`; then ``await wf.run(...)``.

    Builder methods return ``self`` (or, used as a decorator, the function), and every
    file construct has one: `node` (``args=`` for ``ctx.args``), `approval`, `edge`
    (fan-out, joins, ``when``, ``otherwise``, ``max``, ``on_error``), `switch`, `router`,
    `choose`, `map`, `agent`, `subworkflow`. ``state`` maps a field to its reducer
    (``"append"``) or to the file's mapping (``{"reducer": "append", "default": [...]}``).
    All but `subworkflow` (which loads and compiles a child) are `Builder`'s; this class
    adds validation, compiling and running.
    """

    def __init__(self, name: str, *, description: str = "",
                 config: Mapping[str, object] | None = None, input: Iterable[str] = (),
                 state: Mapping[str, str | Mapping[str, object]] | None = None,
                 limits: Mapping[str, object] | None = None) -> None:
        super().__init__(name, description=description, config=config, input=input,
                         state=state, limits=limits)
        self._plan: Plan | None = None
        self._warnings: list[Diagnostic] = []
        self._definition: JSONObject | None = None
        self._definition_hash: str | None = None
        self._declared_limits: dict[str, object] | None = None

    @classmethod
    def from_spec(cls, spec: WorkflowSpec) -> Workflow:
        wf = cls.__new__(cls)
        wf._data = {}
        wf._callables = {}
        wf._spec = spec
        wf._plan = None
        wf._warnings = []
        wf._definition = None
        wf._definition_hash = None
        wf._declared_limits = None
        return wf

    # -- the builder (its other methods are `Builder`'s) ---------------------------

    def subworkflow(self, name: str, workflow: Workflow | str | os.PathLike[str], *,
                    input: Mapping[str, str] | None = None,
                    output: str | Iterable[str] | None = None,
                    output_key: str | None = None, **options: object) -> Workflow:
        """Add a node that runs ``workflow`` (a `Workflow`, or the path of a file) as a
        child run. ``input`` maps the child's input fields to CEL expressions
        over this workflow's state (default: the fields of the same names); the child's
        final state -- or its field ``output``, or its fields ``[output, ...]`` -- is
        written under ``output_key`` (default: the node's name). The child's definition
        is pinned in this one's. Other options are the node keys of `node` (timeout,
        retry, tokens, reads, description)."""
        if isinstance(workflow, Workflow):
            child, file = workflow, None
        else:
            child, file = load(workflow), os.fspath(workflow)
        data = self._mutable()
        if name in data["nodes"]:
            raise UsageError(f"node {name!r} is already defined")
        node: dict[str, object] = {"workflow": {"file": file, "definition": child.definition()}}
        if input is not None:
            node["input"] = dict(input)
        if output is not None:
            node["output"] = output if isinstance(output, str) else list(output)
        if output_key is not None:
            node["output_key"] = output_key
        for path, fn in child.callables.items():  # what running the child needs
            self._callables[f"{name}/{path}"] = fn
        data["nodes"][name] = {**node, **node_options(options)}
        return self

    # -- validation --------------------------------------------------------------------

    @property
    def spec(self) -> WorkflowSpec:
        """The validated definition (freezes the builder)."""
        if self._spec is None:
            self._spec = parse(self._data)
        return self._spec

    def check(self) -> list[Diagnostic]:
        """Every diagnostic (errors and warnings) without raising."""
        return check_spec(self.spec, self._callables).diagnostics

    def compile(self) -> Plan:
        """Validate and compile once. Raises WorkflowError listing every error."""
        if self._plan is None:
            self._plan, self._warnings = compile_spec(self.spec, self._callables)
        return self._plan

    def reading_plan(self) -> Plan:
        """The graph for reading stored runs: expressions compiled, nothing imported."""
        return self._plan if self._plan is not None else reading_plan(self.spec)

    @property
    def callables(self) -> Mapping[str, Callable[..., object]]:
        """The Python functions given to the builder, by the call path the definition
        names them with (what a resume needs besides the stored definition)."""
        return dict(self._callables)

    @property
    def warnings(self) -> list[Diagnostic]:
        self.compile()
        return list(self._warnings)

    def definition(self) -> JSONObject:
        """The JSON definition a run stores (computed once: the spec is frozen)."""
        if self._definition is None:
            self._definition = self.spec.definition()
        return self._definition

    def definition_hash(self) -> str:
        if self._definition_hash is None:
            self._definition_hash = hashlib.sha256(L.dumps(self.definition())).hexdigest()
        return self._definition_hash

    def _limits(self) -> dict[str, object]:
        """The declared limits as a run records them (computed once: the spec is frozen),
        with `DEFAULT_STEPS` when the workflow declares no ``steps``."""
        if self._declared_limits is None:
            self._declared_limits = {"steps": DEFAULT_STEPS,
                                     **self.spec.limits.model_dump(exclude_none=True)}
        return self._declared_limits

    # -- running -----------------------------------------------------------------------

    async def run(self, input: Mapping[str, object] | None = None, *,
                  store: str | Store | None = None, run_id: str | None = None,
                  config: Mapping[str, object] | None = None,
                  limits: Mapping[str, object] | None = None,
                  listener: Listener | None = None) -> RunResult:
        """Start a run and drive it until it completes, fails or waits for a human.

        ``store`` is a URL (``sqlite:///runs.db``, ``postgresql://...``, ``memory://``)
        or a `Store`; the default is ``$INTERLOCK_STORE`` or ``./.interlock/runs.db``.
        ``config`` overrides the workflow's ``config:``, ``limits`` its ``limits:``.
        """
        plan = self.compile()
        spec = plan.spec
        data = _check_input(spec, input)
        cfg, lim = _effective(spec, config, limits, self._limits())
        st, owned = open_store_arg(store)
        spans: RunSpans | None = None
        try:
            rid = run_id or make_run_id()
            check_run_id(rid)
            started: dict[str, object] = {}
            spans = run_spans(rid, spec.workflow)  # None unless tracing is configured
            if spans is not None:
                started["trace"] = spans.ids
                listener = with_spans(listener, spans)
            return await start(plan, st, rid, definition=self.definition(),
                               definition_hash=self.definition_hash(), input=data, config=cfg,
                               limits=lim, options={"config": dict(config or {}),
                                                    "limits": dict(limits or {})},
                               started=started, listener=listener)
        except BaseException as exc:
            if spans is not None:  # (a run that ended has ended its spans already)
                spans.abort(exc, "REFUSED" if isinstance(exc, StoreError) else None)
            raise
        finally:
            if spans is not None:
                spans.end()
            if owned:
                await release_store(st)

    async def start(self, input: Mapping[str, object] | None = None, *, store: Store,
                    run_id: str | None = None, config: Mapping[str, object] | None = None,
                    limits: Mapping[str, object] | None = None,
                    listener: Listener | None = None) -> Started:
        """Create the run (its row and ``run.started``) without executing it: `run` in
        two halves, for a tool that answers at once and executes later (a server's
        queue). `Started.execute` claims and drives it; until then it is RUNNING with no
        owner, which a restarted server takes over."""
        plan = self.compile()
        spec = plan.spec
        data = _check_input(spec, input)
        cfg, lim = _effective(spec, config, limits, self._limits())
        rid = run_id or make_run_id()
        check_run_id(rid)
        spans = run_spans(rid, spec.workflow)  # its span covers the wait in the queue too
        try:
            view, writer, _ = await create(
                plan, store, rid, definition=self.definition(),
                definition_hash=self.definition_hash(), input=data, config=cfg, limits=lim,
                options={"config": dict(config or {}), "limits": dict(limits or {})},
                started={"trace": spans.ids} if spans is not None else None,
                listener=with_spans(listener, spans), claimed=False)
        except BaseException as exc:  # refused (the id is taken, the store failed)
            if spans is not None:
                spans.abort(exc, "REFUSED")
            raise
        return Started(plan, store, rid, view, writer, listener, spans)

    async def submit(self, input: Mapping[str, object] | None = None, *,
                     store: str | Store | None = None, run_id: str | None = None,
                     config: Mapping[str, object] | None = None,
                     limits: Mapping[str, object] | None = None) -> RunResult:
        """Record a run as PENDING without executing it (``interlock run --detach``): a
        worker (``interlock worker``, or `interlock.support.Worker`) on the same store claims and
        executes it. The input, config and limits are checked here, as `run` checks
        them; the result is the run as ``status`` shows it (PENDING, 0 steps).

        A builder-made workflow's Python functions are not stored: the worker must have
        them (``--workflows`` with a file naming them by ``module:function``).
        """
        plan = self.compile()
        spec = plan.spec
        data = _check_input(spec, input)
        cfg, lim = _effective(spec, config, limits, self._limits())
        st, owned = open_store_arg(store)
        try:
            rid = run_id or make_run_id()
            check_run_id(rid)
            view, _, _ = await create(
                plan, st, rid, definition=self.definition(),
                definition_hash=self.definition_hash(), input=data, config=cfg, limits=lim,
                options={"config": dict(config or {}), "limits": dict(limits or {})},
                detached=True)
            return result_of(rid, spec.workflow, view)
        finally:
            if owned:
                await release_store(st)

    def submit_sync(self, input: Mapping[str, object] | None = None,
                    **kwargs: Any) -> RunResult:
        """`submit` for scripts (no event loop may be running)."""
        _no_running_loop("submit_sync", "submit")
        return asyncio.run(self.submit(input, **kwargs))

    def run_sync(self, input: Mapping[str, object] | None = None, **kwargs: Any) -> RunResult:
        """`run` for scripts: blocks until the run stops (no event loop may be running)."""
        _no_running_loop("run_sync", "run")
        return asyncio.run(self.run(input, **kwargs))

    async def resume(self, run_id: str, decision: Decision | None = None, *,
                     store: str | Store | None = None,
                     config: Mapping[str, object] | None = None,
                     limits: Mapping[str, object] | None = None, force: bool = False,
                     listener: Listener | None = None) -> RunResult:
        """Continue a stopped run (crashed, failed, or waiting) from its log.

        The run executes the definition it started with -- this workflow only
        supplies the Python functions of builder-made nodes.
        """
        from ._ops._runs import resume

        return await resume(run_id, decision, store=store, workflow=self, config=config,
                            limits=limits, force=force, listener=listener)

    async def send(self, run_id: str, text: str, *, by: str | None = None,
                   store: str | Store | None = None,
                   listener: Listener | None = None) -> RunResult:
        """Send a message to a conversation (a run of a ``chat:`` workflow) and
        run its turn: the result is the run as the turn left it (WAITING_INPUT with the
        reply in ``waiting.show``, WAITING_APPROVAL at a gate the turn reached, COMPLETED
        when the conversation ended). Refused (`UsageError`) when it waits for no message."""
        from ._ops._messages import send

        return await send(run_id, text, by=by, store=store, workflow=self, listener=listener)

    def resume_sync(self, run_id: str, decision: Decision | None = None,
                    **kwargs: Any) -> RunResult:
        """`resume` for scripts: blocks until the run stops (no event loop may be running)."""
        _no_running_loop("resume_sync", "resume")
        return asyncio.run(self.resume(run_id, decision, **kwargs))


class Started:
    """A run created by `Workflow.start` and not executed yet."""

    def __init__(self, plan: Plan, store: Store, run_id: str, view: RunView,
                 writer: L.LogWriter, listener: Listener | None,
                 spans: RunSpans | None = None) -> None:
        self._args = (plan, store, run_id, view, writer)
        self._listener = listener
        self._spans = spans  # its OpenTelemetry spans (None when tracing is off)
        self._executed = False
        self.run_id = run_id
        self.result = result_of(run_id, plan.spec.workflow, view)  # as it was created

    async def execute(self, *, listener: Listener | None = None,
                      store: Store | None = None) -> RunResult:
        """Claim the run and drive it (once). If its log moved since it was created (a
        cancel, a takeover), nothing runs: `ConflictError`. ``store``: the same store
        through another connection (a server executes its runs on event loops of their
        own, each with its own connection)."""
        if self._executed:
            raise UsageError(f"run {self.run_id!r} was already executed")
        self._executed = True
        plan, created_in, run_id, view, writer = self._args
        store = store or created_in
        try:
            return await drive(plan, store, run_id, view, writer,
                               listener=with_spans(listener or self._listener, self._spans),
                               fresh=True)
        except BaseException as exc:  # not executed (cancelled while queued), or stopped
            if self._spans is not None:
                self._spans.abort(exc, "REFUSED" if isinstance(exc, ConflictError) else None)
            raise
        finally:
            if self._spans is not None:
                self._spans.end()


def _no_running_loop(sync: str, coro: str) -> None:
    """A clear error where ``asyncio.run`` would refuse (and leave a coroutine unawaited)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UsageError(f"{sync}() was called inside a running event loop (a coroutine, a "
                     f"notebook): use `await workflow.{coro}(...)` there")


def _check_input(spec: WorkflowSpec, input: Mapping[str, object] | None) -> JSONObject:
    if input is None:
        input = {}
    if not isinstance(input, Mapping):
        raise UsageError(f"a run's input is a mapping of fields, got {type(input).__name__}")
    missing = [k for k in spec.input if k not in input]
    if missing:
        raise UsageError(
            f"workflow {spec.workflow!r} declares input: [{', '.join(spec.input)}]; the run's "
            f"input lacks {', '.join(map(repr, missing))}")
    what = "the run's input"
    check_data(input, what)  # its depth: before it is converted (orjson stops at 255)
    try:
        data: JSONObject = L.to_json_value(dict(input))  # our copy, or a new dict
        size = len(L.dumps(data))  # what run.started will hold of it
    except TypeError as exc:
        raise UsageError(f"the run's input is not JSON data: {exc}") from None
    check_data(None, what, size)
    check_whole_values(data, {k: v.reducer for k, v in spec.state.items()}, "the run's input")
    return data


def _effective(spec: WorkflowSpec, config: Mapping[str, object] | None,
               limits: Mapping[str, object] | None, declared: Mapping[str, object]
               ) -> tuple[JSONObject, dict[str, object]]:
    """A run's config and limits: ``declared`` (`Workflow._limits`) with the overrides."""
    check_config(config)
    cfg = {**spec.config, **(config or {})}
    lim = {**declared, **check_limits(limits, base=declared)} if limits else dict(declared)
    return L.to_json_value(cfg), lim


def load(source: str | os.PathLike[str] | Mapping[str, object]) -> Workflow:
    """Load and validate a workflow from a YAML/JSON file (or a dict in the file's shape).

    Raises WorkflowError with ``file:line:col`` for every problem found.
    """
    spec = load_spec(dict(source) if isinstance(source, Mapping) else source)
    wf = Workflow.from_spec(spec)
    wf.compile()
    return wf


# folders a --workflows walk does not enter (caches, environments, version control)
_NOT_WALKED = frozenset({"__pycache__", "node_modules", "site-packages", "venv"})


def load_workflows(paths: Sequence[str]) -> dict[str, Workflow]:
    """Each file (or each ``*.yaml``/``*.yml``/``*.json`` in a folder and its subfolders,
    hidden ones and caches aside, that is a workflow: a mapping with a ``workflow:`` key --
    a folder's data files beside them, such as an example's ``scenarios.json`` or a JSON
    array, are skipped, said in one log line), by workflow name."""
    found: dict[str, tuple[Workflow, Path]] = {}
    for given in paths:
        p = Path(given)
        if p.is_dir():
            walked = _walk(p)
            files = [f for f in walked if _is_workflow_file(f)]
            _say_skipped(given, [f for f in walked if f not in files])
        elif p.exists():
            files = [p]
        else:
            raise UsageError(f"--workflows {given}: no such file or folder")
        for f in files:
            try:
                wf = load(f)
            except WorkflowError as exc:
                raise UsageError(f"--workflows {given}: {f} is not a valid workflow:\n"
                                 + "\n".join(map(str, exc.diagnostics))) from None
            if wf.name in found and found[wf.name][1] != f:
                raise UsageError(f"--workflows: {found[wf.name][1]} and {f} are both "
                                 f"workflow {wf.name!r}; a name must be unique")
            found[wf.name] = (wf, f)
    return {name: wf for name, (wf, _) in found.items()}


def _say_skipped(given: str, skipped: list[Path]) -> None:
    """One line for the files of the folder ``given`` that are not workflows (each one's
    reason: at DEBUG)."""
    if not skipped:
        return
    names = ", ".join(str(f) for f in skipped[:3]) + (
        f", ... ({len(skipped) - 3} more)" if len(skipped) > 3 else "")
    logging.getLogger("interlock").info(
        "--workflows %s: skipped %d file%s that %s not a workflow (no top-level workflow: "
        "key; data beside the workflows, say): %s", given, len(skipped),
        "" if len(skipped) == 1 else "s", "is" if len(skipped) == 1 else "are", names)


def _walk(folder: Path) -> list[Path]:
    """The ``*.yaml``/``*.yml``/``*.json`` files under ``folder``, in path order."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_WALKED)
        out += [Path(root) / n for n in names if Path(n).suffix in (".yaml", ".yml", ".json")
                and not n.startswith(".")]
    return sorted(out)


def _is_workflow_file(path: Path) -> bool:
    """Whether a file in a ``--workflows`` folder is a workflow: its top level is a mapping
    with a ``workflow:`` key. Anything else that parses -- a JSON array, a list, a scalar,
    a mapping of data -- is skipped (why: a DEBUG log line); a file that does not parse is taken
    as a workflow, so that its error is shown."""
    import yaml

    from ._definition import _limits
    from ._definition._bounds import read_at_most

    limit = _limits.WORKFLOW_FILE_BYTES.get()
    try:
        with path.open("rb") as f:
            raw = read_at_most(f, limit)
        data = None if raw is None else yaml.load(
            raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, OSError, UnicodeDecodeError, ValueError, RecursionError):
        return True
    if isinstance(data, Mapping) and "workflow" in data:
        return True
    shape = ("larger than a workflow file may be" if raw is None
             else "a mapping without a top-level workflow: key" if isinstance(data, Mapping)
             else f"its top level is {'a list' if isinstance(data, list) else 'a value'}, "
                  "not a mapping with a workflow: key")
    logging.getLogger("interlock").debug("--workflows: skipped %s: not a workflow file (%s)",
                                         path, shape)
    return False
