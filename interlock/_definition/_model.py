"""The workflow definition: what a file (or the Python builder) declares.

A workflow, its nodes (and their retry, approval, Ray and sub-workflow blocks), its state
fields, limits and triggers; its edges are `_edge`'s, and the value types (durations,
sizes, counts, names) and the strict base models `_values`'. This module knows nothing of
the engine. Both front ends -- the YAML/JSON file (`_spec.py`) and the Python builder
(`_workflow.py`) -- produce a `WorkflowSpec`; everything downstream (validation,
planning, running, the log) reads only this model. Its JSON dump is what a run stores as
its definition.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from .._errors import UsageError
from .._json import JSONObject
from ._edge import EdgeSpec
from ._values import (
    NAME_RE,
    Count,
    Duration,
    Extensible,
    NameList,
    Size,
    Strict,
    parse_duration,
)

START = "START"
END = "END"
RESERVED_NAMES = frozenset({START, END, "config", "run"})
# The state field an error edge's target reads the caught error from: the
# engine writes it, a workflow may not declare it.
ERROR_FIELD = "error"
CALL_RE = re.compile(r"^[A-Za-z_][\w.]*:[\w.<>]+(#\d+)?$")

Reducer = Literal["replace", "append", "extend", "merge", "add"]


class RetrySpec(Strict):
    """``retry: {attempts, backoff, max_backoff, jitter, errors}``."""

    attempts: Count = Field(default=1, ge=1, le=100)
    backoff: Annotated[float, BeforeValidator(parse_duration), Field(ge=0)] = 0.0
    max_backoff: Duration | None = None
    jitter: bool = False
    errors: list[str] = Field(default_factory=list)


class ApprovalSpec(Strict):
    """``approval: {show, input, on_modify, approvers, timeout, on_timeout}`` -- a human
    gate. ``input``: a JSON Schema the decision's ``data`` must satisfy."""

    show: NameList = Field(default_factory=list)
    input: dict[str, Any] | None = None
    on_modify: NameList = Field(default_factory=list)
    approvers: NameList = Field(default_factory=list)
    timeout: Duration | None = None
    on_timeout: str = "reject"


class RaySpec(Strict):
    """``resources: {num_cpus, num_gpus, memory}`` of an ``executor: ray`` node: what its
    Ray task (or async actor) asks the cluster for (Ray's defaults: 1 CPU for a task)."""

    num_cpus: float | None = Field(default=None, ge=0)
    num_gpus: float | None = Field(default=None, ge=0)
    memory: Size | None = None  # bytes, or '2GB' / '512MiB'

    def options(self) -> dict[str, float | int]:
        """The Ray ``.options(...)`` these ask for."""
        return {k: v for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                                  ("memory", self.memory)) if v is not None}


class SubflowRef(Strict):
    """A ``workflow:`` node's child, pinned: the file it was read from (as the parent
    names it; None for a builder's `Workflow`) and the child's whole definition, which
    is part of the parent's definition and hash -- a resume runs this, not the file as
    it is now. A file names the child by its path; the front end (`_spec.load_spec`)
    reads it and stores it in this form."""

    file: str | None = None
    definition: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _path_form(cls, data: object) -> object:
        if isinstance(data, str):
            raise ValueError(f"workflow: {data!r} is a path, which only a workflow read from "
                             "a file (interlock.load) or the builder (wf.subworkflow) can "
                             "resolve")
        return data


class NodeSpec(Extensible):
    """One node. ``call`` is ``module:function``; short form in a file: ``name: module:fn``."""

    call: str | None = None
    reads: NameList | None = None
    writes: NameList | None = None
    timeout: Duration | None = None
    retry: RetrySpec | None = None
    isolation: Literal["thread", "process"] | None = None
    memory: Size | None = None  # with isolation: process, an address-space limit
    # where the body runs: here (the default), or as a Ray task on a cluster
    executor: Literal["local", "ray"] | None = None
    resources: RaySpec | None = None  # with executor: ray, what its task asks for
    tokens: Count | None = Field(default=None, ge=0)
    confirm: bool = False
    approval: ApprovalSpec | None = None
    agent: dict[str, Any] | None = None
    # a call node's own parameters, passed as ``ctx.args`` (one function, several nodes)
    args: dict[str, Any] | None = None
    # a sub-workflow: the child, the child's input fields as CEL over this
    # workflow's state (default: the fields of the same names), what of its final state
    # is written (all of it; ``[fields]``; or one field's value) under ``output_key``
    workflow: SubflowRef | None = None
    input: dict[str, str] | None = None
    output: str | list[str] | None = None
    output_key: str | None = None
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: object) -> object:
        if isinstance(data, str):
            return {"call": data}
        return data

    @field_validator("call")
    @classmethod
    def _call_shape(cls, value: str | None) -> str | None:
        if value is not None and not CALL_RE.match(value):
            raise ValueError(
                f"call must look like 'package.module:function', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> NodeSpec:
        kinds = [k for k in ("call", "approval", "agent", "workflow")
                 if getattr(self, k) is not None]
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise ValueError(
                "a node needs exactly one of 'call', 'approval', 'agent' or 'workflow' "
                f"(found: {found})"
            )
        if self.workflow is None:
            extra = [k for k in ("input", "output", "output_key") if getattr(self, k) is not None]
            if extra:
                raise ValueError(f"{', '.join(map(repr, extra))} belong to a 'workflow:' node "
                                 "(a sub-workflow)")
        if self.executor == "ray":
            if self.call is None:
                raise ValueError(
                    "executor: ray runs a call node's function as a Ray task; an approval, "
                    "agent or workflow node has no function of its own to send (put "
                    "executor: ray on the nodes that do the work)")
            if self.isolation is not None:
                raise ValueError(
                    f"executor: ray and isolation: {self.isolation} both say where the body "
                    "runs; a Ray task is already a process of its own: keep one of them")
        elif self.resources is not None:
            raise ValueError("'resources' are what a Ray task asks the cluster for; they go "
                             "with executor: ray")
        if self.args is not None and self.call is None:
            raise ValueError("'args' are passed to a call node's function as ctx.args; "
                             "an approval or agent node has no function to pass them to")
        return self

    def on_executor(self, executor: Literal["local", "ray"]) -> NodeSpec:
        """This node with its body run by ``executor`` (a worker's ``--executor``): a
        call node that names no executor and no isolation of its own; others as they
        are."""
        if self.call is None or self.executor is not None or self.isolation is not None:
            return self
        return self.model_copy(update={"executor": executor})

    @property
    def kind(self) -> Literal["call", "approval", "agent", "workflow"]:
        if self.approval is not None:
            return "approval"
        if self.agent is not None:
            return "agent"
        if self.workflow is not None:
            return "workflow"
        return "call"

    # "Which field does node N write" has its home here, next to the fields that answer
    # it, rather than on the `NodeKind` protocol: the patch check of a gate
    # (`_engine._approvals`) sees a `WorkflowSpec` and no kinds (those are injected at
    # layer 7), and an agent's ``output_key`` is plain data of its ``agent:`` block.
    def output_field(self, name: str) -> str | None:
        """The one field node ``name`` writes its result to: an approval's decision under
        its name, an agent's reply and a sub-workflow's result under their
        ``output_key`` (default: the name); None for a call node (it returns an update)."""
        if self.approval is not None:
            return name
        if self.agent is not None:
            return str(self.agent.get("output_key") or name)
        if self.workflow is not None:
            return self.output_key or name
        return None

    def written(self, name: str) -> frozenset[str] | None:
        """The fields node ``name`` writes: its `output_field`, or what a call node
        declares in ``writes``; None when a call node does not say (it may write any)."""
        own = self.output_field(name)
        if own is not None:
            return frozenset((own,))
        return frozenset(self.writes) if self.writes is not None else None


# what a field with a reducer starts as when it declares no default: so a
# condition or a template can read it before the first write, as LangGraph's channels
_EMPTY: dict[str, Callable[[], object]] = {"append": list, "extend": list, "merge": dict,
                                        "add": int}
# what a default must be for each reducer (the reducer accumulates into it)
_DEFAULT_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "append": (list, "a list"), "extend": (list, "a list"), "merge": (dict, "an object"),
    "add": ((int, float), "a number")}


class FieldSpec(Strict):
    """``state: {f: {reducer: append, default: [...]}}``. A field with a reducer starts
    empty (``[]``, ``{}``, ``0``) unless it declares a ``default``; a field without one
    is absent until written, unless it declares a ``default`` (``null`` included)."""

    reducer: Reducer = "replace"
    default: Any = None  # only if declared (`declares_default`): null is a default too

    @model_validator(mode="after")
    def _default_fits(self) -> FieldSpec:
        kind = _DEFAULT_KINDS.get(self.reducer)
        if kind is None or not self.declares_default or self.default is None:
            return self
        types, what = kind
        if not isinstance(self.default, types) or isinstance(self.default, bool):
            raise ValueError(f"default: the reducer {self.reducer!r} accumulates into "
                             f"{what}, so the default is {what} (e.g. "
                             f"{L_EXAMPLES[self.reducer]}), not {type(self.default).__name__}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # a declared default is part of the definition even when it equals the model's
        # own (``default: null``): the definition says what the field starts as
        data = handler(self)
        if self.declares_default and isinstance(data, dict):
            data["default"] = self.default
        return data

    @property
    def declares_default(self) -> bool:
        return "default" in self.model_fields_set

    def start(self) -> tuple[bool, object]:
        """Whether the field has a value before anything writes it, and a fresh copy of it."""
        if self.declares_default:
            return True, copy.deepcopy(self.default)
        empty = _EMPTY.get(self.reducer)
        return (True, empty()) if empty is not None else (False, None)


L_EXAMPLES = {"append": "[]", "extend": "[]", "merge": "{}", "add": "0"}


# A run stops (step_limit) after this many node executions unless its workflow or the
# run declares limits.steps: a loop whose exit condition never holds fails in seconds
# instead of running for ever (LangGraph's recursion_limit plays this part). Written
# into run.started, so the log says which limit applied.
DEFAULT_STEPS = 10_000


class LimitsSpec(Strict):
    tokens: Count | None = Field(default=None, ge=0)
    steps: Count | None = Field(default=None, ge=1)
    timeout: Duration | None = None


class TriggerSpec(Strict):
    """One of ``triggers:``: what starts runs of the workflow by itself --
    ``{schedule: CRON, input}`` (UTC; five fields, or six with seconds first),
    ``{every: 30s, input}`` (the multiples of the interval since the Unix epoch), or
    ``{poll: module:function, every: 30s}`` (one run per new key the function returns).
    ``id``: what the runs' ids are derived from (default: a digest of the trigger)."""

    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,40}$")
    schedule: str | None = None
    every: Duration | None = None
    poll: str | None = None
    input: dict[str, Any] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _one_kind(self) -> TriggerSpec:
        if (self.schedule is None) == (self.every is None and self.poll is None) \
                or (self.schedule is not None and (self.every or self.poll)):
            raise ValueError("a trigger is {schedule: CRON}, {every: DURATION} or {poll: "
                             "module:function, every: DURATION}: exactly one of them")
        if self.poll is not None:
            if self.every is None:
                raise ValueError("a poll trigger needs every: (how often to call it), e.g. "
                                 "{poll: flows.sources:new_errors, every: 30s}")
            if not CALL_RE.match(self.poll):
                raise ValueError(f"poll must look like 'package.module:function', got "
                                 f"{self.poll!r}")
            if self.input is not None:
                raise ValueError("a poll trigger's runs take their input from what the "
                                 "function returns ([{key, input}]); remove input:")
        if self.schedule is not None:
            fields = self.schedule.split()
            if len(fields) not in (5, 6):
                raise ValueError(f"schedule {self.schedule!r} has {len(fields)} fields; cron "
                                 "has five (minute hour day month weekday), or six with "
                                 "seconds first, e.g. '*/15 * * * *'")
        return self

    @property
    def kind(self) -> Literal["schedule", "every", "poll"]:
        if self.schedule is not None:
            return "schedule"
        return "poll" if self.poll is not None else "every"


class WorkflowSpec(Extensible):
    """A whole workflow, as declared. Frozen; equal specs mean equal workflows."""

    workflow: str = Field(min_length=1)
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    input: NameList = Field(default_factory=list)
    state: dict[str, FieldSpec] = Field(default_factory=dict)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    nodes: dict[str, NodeSpec]
    edges: list[EdgeSpec] = Field(default_factory=list)
    triggers: list[TriggerSpec] = Field(default_factory=list)  # what starts runs by itself
    # a conversation: the agent node that converses; its file needs no edges
    chat: str | None = Field(default=None, min_length=1)

    # Where each part came from: path tuple -> (line, col), plus the file name.
    # Not part of the definition's identity.
    _source: SourceMap | None = PrivateAttr(default=None)
    # the sub-workflows as read from their files (with their own source maps), by node:
    # for validation's positions; the definition holds them pinned either way
    _children: dict[str, WorkflowSpec] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _chat_edges(cls, data: Any) -> Any:
        # a conversation's file needs no edges: START -> its chat node -> END
        if isinstance(data, dict) and isinstance(data.get("chat"), str) \
                and not data.get("edges"):
            node = data["chat"]
            data = {**data, "edges": [{"from": START, "to": node}, {"from": node, "to": END}]}
        return data

    @field_validator("chat")
    @classmethod
    def _chat_node(cls, value: str | None, info: ValidationInfo) -> str | None:
        # (a field's check: its error is placed at the file's ``chat:`` line)
        nodes = info.data.get("nodes")
        if value is None or nodes is None:  # (nodes that did not validate: said already)
            return value
        ns = nodes.get(value)
        if ns is None or ns.agent is None:
            agents = [n for n, spec in nodes.items() if spec.agent is not None]
            close = difflib.get_close_matches(value, agents, n=1)
            what = "it is not an agent node" if ns else "there is no such node"
            fix = (f"did you mean {close[0]!r}?" if close else
                   f"name one of its agent nodes ({', '.join(agents)})" if agents else
                   f"declare nodes: {{{value}: {{agent: {{...}}}}}}")
            raise ValueError(f"{value!r} names the agent node that converses, but "
                             f"{what} (nodes: {', '.join(nodes)}); {fix}")
        return value

    @field_validator("state", mode="before")
    @classmethod
    def _state_short(cls, value: object) -> object:
        # ``events: append`` is accepted as short for ``events: {reducer: append}``.
        if isinstance(value, dict):
            return {k: {"reducer": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, value: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
        for name in value:
            _check_name(name, "node")
        return value

    @field_validator("state", "input")
    @classmethod
    def _field_names(cls, value: list[str] | dict[str, FieldSpec]
                     ) -> list[str] | dict[str, FieldSpec]:
        for name in value:
            _check_name(name, "state field")
        return value

    def __eq__(self, other: object) -> bool:
        # Equal definitions are equal workflows, wherever they came from (file or builder).
        if not isinstance(other, WorkflowSpec):
            return NotImplemented
        return self.definition() == other.definition()

    def __hash__(self) -> int:
        return hash(self.workflow)

    def defaults(self) -> dict[str, object]:
        """What each declared field starts as before anything writes it (`FieldSpec.start`),
        fresh copies: the fields with a reducer (empty, or their default) and those
        without one that declare a default."""
        out: dict[str, object] = {}
        for name, fs in self.state.items():
            has, value = fs.start()
            if has:
                out[name] = value
        return out

    def known_fields(self) -> set[str]:
        """The fields this workflow is known to have: its input and state, what its nodes
        declare writing, and what each node writes (`NodeSpec.written`)."""
        known = set(self.input) | set(self.state)
        for name, ns in self.nodes.items():
            known |= set(ns.writes or ()) | (ns.written(name) or frozenset())
        return known

    def definition(self) -> JSONObject:
        """The JSON-ready definition (what a run stores and hashes)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def _check_name(name: str, what: str) -> None:
    if not NAME_RE.match(name):
        raise ValueError(
            f"{what} name {name!r} must be an identifier (letters, digits, _), "
            "so that conditions can read it"
        )
    if name in RESERVED_NAMES:
        raise ValueError(f"{what} name {name!r} is reserved")


class SourceMap:
    """Maps a path inside the definition (``('edges', 3, 'when')``) to a file position."""

    def __init__(self, file: str | None, positions: dict[tuple[object, ...], tuple[int, int]]):
        self.file = file
        self.positions = positions

    def locate(self, path: tuple[object, ...]) -> tuple[int, int] | None:
        """The position of ``path``, or of its closest located ancestor."""
        while True:
            pos = self.positions.get(path)
            if pos is not None:
                return pos
            if not path:
                return None
            path = path[:-1]


def check_limits(limits: Mapping[str, object], *, base: Mapping[str, object] | None = None
                 ) -> dict[str, object]:
    """Per-run limit overrides, validated (durations parsed); UsageError when wrong."""
    unknown = set(limits) - set(LimitsSpec.model_fields)
    if unknown:
        raise UsageError(f"unknown limit(s) {sorted(unknown)}; limits are "
                         f"{sorted(LimitsSpec.model_fields)}")
    try:
        checked = LimitsSpec.model_validate({**(base or {}), **limits})
    except ValidationError as exc:
        raise UsageError(f"invalid {_pydantic_message(exc, 'limits')}") from None
    merged = checked.model_dump(exclude_none=True)
    return {k: merged[k] for k in limits if k in merged}


def _pydantic_message(exc: ValidationError, prefix: str) -> str:
    return "; ".join(f"{'.'.join(map(str, (prefix, *e['loc'])))}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
