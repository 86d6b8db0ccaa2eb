"""The API's request and response bodies (pydantic): what /openapi.json describes."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from interlock import RunResult
from interlock.support import RUN_ID_PATTERN, not_json_at

RUN_ID = RUN_ID_PATTERN  # the engine's: one grammar for the CLI, Python and the API


class _Body(BaseModel):
    """A request body: JSON data that can be stored as it came (no NaN or infinity,
    no lone surrogate), refused with where it is not."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _stored_as_sent(self) -> _Body:
        bad = not_json_at(self.model_dump())
        if bad is not None:
            raise ValueError(f"{bad[1]} at {bad[0]}: send JSON data")
        return self


class Problem(BaseModel):
    """An error (RFC 9457, ``application/problem+json``)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str


class Health(BaseModel):
    status: Literal["ok"]
    store: str = Field(description="the store's URL, any password removed")
    store_file: str | None = Field(None, description="a SQLite store's file, absolute "
                                   "(sqlite:///x.db is x.db in the server's folder)")
    version: str
    workflows: int
    workers: int
    running: int = Field(description="executions holding a worker now")


class Me(BaseModel):
    name: str = Field(description="the token's name; local without --auth")
    roles: list[str]
    authenticated: bool = Field(description="false when the server runs without --auth")


class WorkflowInfo(BaseModel):
    name: str
    description: str
    hash: str
    kind: str = Field(default="graph", description="chat: a conversation (its file's "
                      "chat:), its runs are conversations; graph: a workflow")


class Graph(BaseModel):
    nodes: list[dict[str, object]]
    edges: list[dict[str, object]]
    mermaid: str
    # the drawing (interlock/server/_layout.py): node boxes {name, x, y, w, h}, edge routes
    # {edge, source, target, kind, points, label, title, label_box}, width, height
    layout: dict[str, object] | None = None
    # a run's graph only (``GET /api/runs/{id}/graph``), when the run was migrated:
    # the last ``run.migrated`` {seq, from_hash, to_hash, by, at_node}; the graph is
    # the definition it moved the run onto, and its edge indexes are those of the records
    # after that seq only (docs/versions.md)
    migrated: dict[str, object] | None = None


class WorkflowDetail(WorkflowInfo):
    definition: dict[str, object]
    graph: Graph


class RunObject(BaseModel):
    """A run: exactly what ``interlock status RUN_ID --json`` prints (the engine's
    `RunResult.to_json`); ``code_changed`` only when a node still to run has code that
    changed since the run started."""

    run_id: str
    workflow: str
    status: str
    state: dict[str, object]
    steps: int
    tokens: int
    error: dict[str, object] | None
    waiting: dict[str, object] | None
    code_changed: list[str] | None = Field(
        default=None, description="the nodes still to run whose code changed since the run "
        "started (or was migrated); absent when none did")

    @model_serializer(mode="wrap")
    def _without_absent(self, next_: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        out: dict[str, object] = next_(self)
        if out.get("code_changed") is None:
            out.pop("code_changed", None)
        return out


assert set(RunObject.model_fields) == {f.name for f in dataclasses.fields(RunResult)}


class RunRowOut(BaseModel):
    """A run in a list: what ``interlock runs --json`` prints for it."""

    run_id: str
    workflow: str
    status: str
    steps: int
    tokens: int
    created_at: float
    updated_at: float
    parent_run: str | None
    parent_seq: int | None
    error: dict[str, object] | None
    waiting: dict[str, object] | None


class RunPage(BaseModel):
    runs: list[RunRowOut]
    next: str | None = Field(description="the cursor of the next page; null on the last")
    scanned: int | None = Field(default=None, description="a search's page: how many runs "
                                "it read to find these (at most 2,000: then `next` goes on "
                                "with the older ones); absent when not searched")

    @model_serializer(mode="wrap")
    def _without_absent(self, next_: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        out: dict[str, object] = next_(self)
        if out.get("scanned") is None:
            out.pop("scanned", None)
        return out


class Record(BaseModel):
    """A log record, as ``interlock trace --json`` prints it (other keys by type)."""

    model_config = ConfigDict(extra="allow")
    seq: int
    type: str
    node: str | None
    at: float | str | None
    duration_ms: float | None
    attempt: int | None
    tokens: int | None
    error: object


class StartRun(_Body):
    input: dict[str, object] = Field(default_factory=dict)
    config: dict[str, object] = Field(default_factory=dict)
    run_id: str | None = Field(default=None, pattern=RUN_ID)


class DecisionIn(_Body):
    decision: Literal["approve", "reject", "modify"]
    comment: str | None = Field(default=None, max_length=10_000)
    patch: dict[str, object] | None = None
    at: str | None = Field(default=None, max_length=200)
    node: str | None = Field(default=None, max_length=200)
    data: object = Field(default=None,
                         description="approve/reject: what the gate's input: schema asks for")
    by: str | None = Field(default=None, max_length=200,
                           description="who decides; ignored when the server has --auth "
                                       "(the token's name is recorded)")
    via: str | None = Field(default=None, max_length=40, pattern=r"^[a-z][a-z0-9_-]*$",
                            description="where the decision was made (dashboard, api, ...): "
                                        "recorded with it; default api")
    requested_at: float | None = Field(
        default=None, description="with `node`: the asking this decision answers (the "
        "gate's `requested_at` in `waiting.pending`, `since` in /api/approvals); refused "
        "(409, nothing recorded) once the gate was asked again -- a later visit, an "
        "unknown outcome -- so a decision made on what a person saw decides only that")


class CancelIn(_Body):
    """Nothing yet; a cancel is sent as JSON (``{}``) all the same."""


class ResumeIn(_Body):
    config: dict[str, object] = Field(default_factory=dict)


class ForkIn(_Body):
    """``POST /api/runs/{id}/fork``: a new run from the state at record ``at`` (as
    ``interlock fork``), with an optional state patch, config and the new run's id."""

    at: int = Field(ge=1, description="the seq of the record to fork from")
    patch: dict[str, object] | None = None
    config: dict[str, object] = Field(default_factory=dict)
    run_id: str | None = Field(default=None, pattern=RUN_ID)


class MigrateIn(_Body):
    """``POST /api/runs/{id}/migrate``: the definition the run moves onto
    (default: the one this server has registered under the run's workflow name)."""

    definition: dict[str, object] | None = Field(
        default=None, description="a workflow definition (as a file holds it, in JSON); "
        "default: this server's registered workflow of the run's name")
    at: str | None = Field(default=None, description="where the run continues in the new "
                           "graph, instead of the gate it waits at or the node that failed")
    by: str | None = Field(default=None, description="who (ignored with --auth: the token's "
                           "name)")
    comment: str | None = None
    dry_run: bool = False


class MigrationOut(BaseModel):
    """What a migration found and did: every difference, every reason it was refused (a
    refusal answers 409 with them in its detail), the seq of ``run.migrated``."""

    run_id: str
    workflow: str
    status: str
    from_hash: str
    to_hash: str
    at_node: str | None
    differences: list[str]
    refusals: list[str]
    dry_run: bool
    recorded: int | None


class VerificationOut(BaseModel):
    """`interlock verify` of a run, made by the server in its store with its log key."""

    run_id: str = Field(description="the run verified, or its first child run that is not ok")
    ok: bool
    records: int = Field(description="the records checked")
    seq: int | None = Field(description="the first bad record; null when not ok and no "
                            "record is bad: not checked at all when `records` is 0 (a keyed "
                            "log without the server's key for it), or checked as a plain "
                            "chain and intact when it is more (a log that is not keyed, on "
                            "a server with a key: the key proves nothing about it)")
    message: str = Field(description="what is wrong, and what to do")
    keyed: bool = Field(description="the chain is keyed and was checked with the key")
    notes: list[str] = Field(description="findings that do not break the log")
    children: list[str] = Field(description="the child runs verified with it")
    located: bool = Field(description="false: seq is where the break shows, not the first "
                          "bad record")
    migrations: list[dict[str, object]] = Field(
        default_factory=list, description="each run.migrated of an intact log, whose "
        "segments were checked under their own definitions: {seq, by, from_hash, to_hash}")


class ModifyInfo(BaseModel):
    at: list[str] = Field(description="the nodes a modify may re-enter at (approval "
                          "on_modify); the first is the default")
    patch_schema: dict[str, object] = Field(description="a JSON Schema of the patches the gate "
                                         "accepts: its known fields, a reducer field's kind")


class OutcomeInfo(BaseModel):
    action: str = Field(description="what ran: a tool (and its node), a node or a map item")
    arguments: dict[str, object]
    started_at: str = Field(description="when it started, UTC")
    explain: list[str] = Field(description="what happened and what each decision does: "
                               "approve runs it AGAIN, reject records it as not done")
    data_example: dict[str, object] = Field(description="an approve with data of this shape "
                                            "({\"result\": ...}) records the outcome checked "
                                            "by hand, without running it again")


class Approval(BaseModel):
    run_id: str
    workflow: str
    node: str
    show: dict[str, object]
    decisions: list[str]
    since: float | None
    deadline: float | None
    approvers: list[str] = Field(description="names and role:NAME entries that may decide; "
                                             "empty: anyone with the approver role")
    kind: str | None = Field(default=None, description="approval, confirm, tool (a guarded "
                             "tool call) or unknown_outcome (an action that started and "
                             "left no outcome); a child run's gate has the child gate's "
                             "kind")
    input: dict[str, object] | None = Field(default=None, description="the JSON Schema an "
                                         "approve's data must satisfy (approval input:)")
    modify: ModifyInfo | None = Field(default=None, description="what a modify must be; "
                                      "null when the gate does not accept modify")
    outcome: OutcomeInfo | None = Field(default=None, description="an unknown_outcome "
                                        "gate's action, arguments, start and what each "
                                        "decision does; null for another gate")


class Visit(BaseModel):
    """A node's visit: what it read when it started (from the fold) and what it did."""

    node: str
    visit: int | None
    item: int | None = Field(description="a mapped node's item index")
    status: str = Field(description="running, retrying, waiting, decided, completed, failed")
    input: dict[str, object] = Field(description="its reads: fields (all the state when it "
                                  "declares none; an approval's show: fields)")
    update: dict[str, object] | None
    error: object
    tokens: int
    duration_ms: float | None = Field(description="its attempts' durations, summed")
    attempts: int
    decision: str | None = Field(description="a gate's decision")
    seqs: list[int] = Field(description="its records")
