"""The support surface for tools built on interlock: the command line, a server, a worker.

``import interlock`` is the API for running workflows. This module adds what a tool
around it needs beyond that, and is as stable as ``interlock`` itself (the command
line uses nothing else):

Types
    `Record` (a log record: a JSON object), `Entry` (a record as stored: its bytes and
    chain hash), `RunRow` and `Summary` (a stored run's row), `Claim` (who executes a
    run, under which claim generation) and `LeaseRenewer` (what a store renews leases
    with, off the event loop), `EdgeSpec` and `NodeSpec`
    (parts of a `interlock.WorkflowSpec`), `RunView` (a run folded from its log: what a
    ``listener=`` receives with each record).

Definitions
    `load_spec` (a workflow file to a `interlock.WorkflowSpec`, checked for shape only:
    nothing is imported), `parse_definition` (the same from data, e.g. a run's stored
    definition), `to_mermaid` and `to_dot` (the graph as text).

Stored runs
    `load_run` (a run's row, its log checked and folded), `trace_pages` (its trace a
    page at a time, from any seq) and `TRACE_PAGE`, `LogCheck` (`interlock.verify`'s
    checks, fed a page of entries at a time), `owner_gone` (whether a run's executing
    process is gone), `TERMINAL_TYPES` (the record types that end a run, with the
    status each gives), `append_note` (a record that changes nothing -- a server's
    ``notify.sent`` -- appended under the run's claim), `node_visits` (each node visit's
    input, update, tokens, duration and error, from the fold), `default_store_url`
    (the store a command uses when none is named), `sqlite_file` (a SQLite store URL's
    absolute file), `store_file_note` and `store_absolute_hint` (what a start line says
    of that file: new, or meant as ``sqlite:////...``), `install_hint` (the command that
    installs an optional extra, for a checkout or a package install),
    `resume_keys_missing` (the agent nodes a resume may reach whose API key variable
    is unset here: ``interlock resume`` refuses such a resume, as ``run`` refuses a run).

Executing (for a server, a worker)
    `Started` (`interlock.Workflow.start`: a run created, executed later by
    `Started.execute`), `approvers_refuse` (why a decider, with the roles a tool vouches
    for, may not decide a gate; ``interlock.Decision(roles=...)`` carries them to the
    engine, which checks the same), `Pool` (executions, a bounded number at a time,
    takeover and drain; `Draining` when it stops; a `Factory` makes one execution),
    `Worker` (``interlock worker``: claims runnable runs from a store and executes them;
    `POLL_SECONDS`, `DRAIN_SECONDS` its defaults), `load_workflows` (``--workflows``
    files and folders, by workflow name);
    `patch_schema` (a JSON Schema of the modify patches a run's gate accepts, for a
    client to check one before sending it); `close_stranded` (a list of waiting runs' look:
    closes the waiting children whose parent no longer waits through them).

Threads
    `abandoned_threads` (how many threads of sync nodes that timed out are still
    running in this process: a tool that exits should not wait for them),
    `executing_node` (the node whose ``async def`` body a thread's stack is in: what a
    watchdog of a blocked event loop names).

Export
    `export_run` (a run as JSON lines, a header then its records) and `verify_export`
    (those lines verified with no store).

Retention
    `prune_runs` (delete finished runs older than a cut-off; `Pruned` says what went) and
    `parse_duration` ('30d', '12h', '90m' -> seconds).

Metrics
    `Metrics` (Prometheus metrics: from a store when scraped, from the runs this
    process executes through its ``observe`` listener; needs ``prometheus-client``).
    `redact` (a store URL without its password).

Coverage
    `workflows_in` (the workflows that have runs in a store, each as its newest run
    defines it; `interlock.coverage` takes one).

Limits
    `limits` (the module of every bound, each a `limits.Limit` with its environment
    variable and default; docs/security.md lists them), `read_at_most`, `too_big`,
    `too_deep`, `too_deep_at`, `not_json_at` (applying them to data a tool reads),
    `RUN_ID_PATTERN` (the run ids a person or a tool may choose), `NotAnApprover` (a
    decision refused by ``approvers:``).

Hints
    `decide_hint` (how to decide a waiting gate, one line: ``interlock resume RUN --gate
    GATE --approve (or --reject)``), `decide_command` (one decision's command),
    `decision_flags` (the ``resume`` options of each decision a gate accepts),
    `store_word` (a store URL for a printed ``--store``: its password left out): the
    commands every tool prints for a person to copy. `MessageRefused` (a message to a
    conversation that does not wait for one: its ``status`` and ``waiting``) and
    `message_refusal` (why, with the command that goes on, carrying a tool's options).

Conversations
    `TOKEN_SINK` (a context variable: where a conversation's reply goes as the provider
    streams it, ``sink({"run_id", "node", "turn", "text"})``; ``interlock chat`` and a
    server's event stream set it).

It imports the engine (``import interlock`` alone does not): import it where it is used.
"""

from __future__ import annotations

from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import _gate_text as gate_text
from ._definition import _limits as limits
from ._definition._bounds import (
    RUN_ID_PATTERN,
    not_json_at,
    read_at_most,
    too_big,
    too_deep,
    too_deep_at,
)
from ._definition._edge import EdgeSpec
from ._definition._model import NodeSpec
from ._definition._render import to_dot, to_mermaid
from ._definition._spec import load_spec
from ._definition._spec import parse as parse_definition
from ._definition._values import parse_duration
from ._engine import _guards
from ._engine._approvals import (
    GateNotWaiting,
    NoSuchGate,
    NotAnApprover,
    approvers_refuse,
    patch_schema,
)
from ._engine._fold import RunView
from ._errors import Draining
from ._extras import install_hint
from ._hints import decide_command, decide_hint, decision_flags, store_word
from ._keys import NoKey, key_refusal, missing_key, unkeyed
from ._log import TERMINAL_TYPES, Entry, Record
from ._observe._coverage import workflows_in
from ._observe._metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ._observe._metrics import Metrics
from ._ops._code import CodeChanged, set_strict_code
from ._ops._export import export as export_run
from ._ops._export import verify_export
from ._ops._final import final_failure
from ._ops._load import TRACE_PAGE, load_run
from ._ops._messages import MessageRefused
from ._ops._messages import refusal as message_refusal
from ._ops._migrate import Migration, MigrationRefused
from ._ops._migrate import migrate as migrate_run
from ._ops._orphans import close_stranded
from ._ops._prune import Pruned
from ._ops._prune import prune as prune_runs
from ._ops._resume_keys import keys_missing as resume_keys_missing
from ._ops._runs import GateDecision, GateTaken, append_note, decide_gate, resume_gate, trace_pages
from ._ops._verify import LogCheck
from ._ops._visits import node_visits
from ._store import (
    Claim,
    LeaseRenewer,
    RunRow,
    Summary,
    default_store_url,
    owner_gone,
    sqlite_file,
    store_file_note,
)
from ._store import absolute_hint as store_absolute_hint
from ._worker._triggers import Firer, NotFired
from ._worker._triggers import describe as describe_trigger
from ._worker._workers import DRAIN_SECONDS, POLL_SECONDS, Factory, Pool, Worker
from ._workflow import Started, load_workflows
from .agents._providers import TOKEN_SINK


def run_json(row: RunRow) -> dict[str, Any]:
    """A stored run's row as ``interlock runs --json`` (and the server's run lists) show it."""
    s = row.summary
    return {"run_id": row.run_id, "workflow": row.workflow, "status": s.status,
            "steps": s.steps, "tokens": s.tokens, "created_at": row.created_at,
            "updated_at": s.updated_at, "parent_run": row.parent_run,
            "parent_seq": row.parent_seq, "parent": row.options.get("parent"),
            "error": s.error, "waiting": s.waiting}


def redact(url: str) -> str:
    """A store URL without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def abandoned_threads() -> int:
    """Threads left running by sync nodes that timed out in this process (a thread
    cannot be interrupted; ``isolation: process`` has such a node killed instead)."""
    return _guards.abandoned


def executing_node(frame: FrameType | None) -> str | None:
    """The name of the node whose ``async def`` body the stack ending at ``frame`` runs
    (e.g. another thread's, from ``sys._current_frames()``), or None."""
    code = _guards.in_loop.__code__
    while frame is not None:
        if frame.f_code is code:
            pn = getattr(frame.f_locals.get("a"), "pn", None)
            name = getattr(pn, "name", None)
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


__all__ = [
    "DRAIN_SECONDS",
    "METRICS_CONTENT_TYPE",
    "POLL_SECONDS",
    "RUN_ID_PATTERN",
    "TERMINAL_TYPES",
    "TOKEN_SINK",
    "TRACE_PAGE",
    "Claim",
    "CodeChanged",
    "Draining",
    "EdgeSpec",
    "Entry",
    "Factory",
    "Firer",
    "GateDecision",
    "GateNotWaiting",
    "GateTaken",
    "LeaseRenewer",
    "LogCheck",
    "MessageRefused",
    "Metrics",
    "Migration",
    "MigrationRefused",
    "NoKey",
    "NoSuchGate",
    "NodeSpec",
    "NotAnApprover",
    "NotFired",
    "Pool",
    "Pruned",
    "Record",
    "RunRow",
    "RunView",
    "Started",
    "Summary",
    "Worker",
    "abandoned_threads",
    "append_note",
    "approvers_refuse",
    "close_stranded",
    "decide_command",
    "decide_gate",
    "decide_hint",
    "decision_flags",
    "default_store_url",
    "describe_trigger",
    "executing_node",
    "export_run",
    "final_failure",
    "gate_text",
    "install_hint",
    "key_refusal",
    "limits",
    "load_run",
    "load_spec",
    "load_workflows",
    "message_refusal",
    "migrate_run",
    "missing_key",
    "node_visits",
    "not_json_at",
    "owner_gone",
    "parse_definition",
    "parse_duration",
    "patch_schema",
    "prune_runs",
    "read_at_most",
    "redact",
    "resume_gate",
    "resume_keys_missing",
    "run_json",
    "set_strict_code",
    "sqlite_file",
    "store_absolute_hint",
    "store_file_note",
    "store_word",
    "to_dot",
    "to_mermaid",
    "too_big",
    "too_deep",
    "too_deep_at",
    "trace_pages",
    "unkeyed",
    "verify_export",
    "workflows_in",
]
