"""The commands that execute or change a run: ``run``, ``resume``, ``fork``, ``cancel``."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ._common import (
    EXIT_FAILED,
    CliError,
    ConfigSet,
    _load_json,
    _parse_object,
    call_engine,
    config_overrides,
    exit_code_for,
    json_option,
    load_workflow,
    missing_keys,
    note_abandoned_threads,
    parse_sets,
    read_input,
    set_option,
    store_option,
    warn_undeclared,
    with_store,
)
from ._decided import NoteOnDecided, decided_record, note, say, waiting_before
from ._format import where_options
from ._progress import Progress
from ._remote import Remote, server_options

if TYPE_CHECKING:
    from .. import RunResult, Store, Workflow


# -- run --------------------------------------------------------------------------------------


@click.command(short_help="Run a workflow.")
@click.argument("workflow", metavar="WORKFLOW")
@click.option("--input", "input_json", metavar="JSON",
              help='The run\'s input as a JSON object, e.g. \'{"error_event": {...}}\'.')
@click.option("--input-file", metavar="PATH",
              help="Read the run's input (a JSON object) from PATH ('-' for stdin).")
@set_option
@click.option("--run-id", metavar="ID", help="Use this run id instead of a generated one "
              "(1-128 letters, digits, '.', '_', ':', '-'; the API names it in URLs).")
@click.option("--detach", is_flag=True,
              help="Record the run as PENDING and exit 0 without executing it (the run id "
                   "on stdout): `interlock worker` on the same store executes it.")
@json_option
@store_option
def run(workflow: str, input_json: str | None, input_file: str | None, sets: tuple[str, ...],
        run_id: str | None, detach: bool, as_json: bool, store_url: str | None) -> None:
    """Run WORKFLOW (a .yaml/.json file) until it completes, fails or waits for approval.

    With --detach, record it for a worker instead (exit 0; `interlock status RUN_ID`
    follows it)."""
    data = read_input(input_json, input_file)
    config_sets, limits = parse_sets(sets)
    wf = load_workflow(workflow)
    # an agent's key missing here: this process would fail at that node, after the run
    # is recorded and the nodes before it ran -- refused now (a worker may have the key)
    keys = [] if detach else [w for w in wf.warnings if w.code == "api-key"]
    for warning in wf.warnings:
        if warning not in keys:
            click.echo(str(warning), err=True)
    if keys:
        raise CliError(missing_keys(keys, "record the run for a worker or server whose "
                                    "environment has the key: interlock run "
                                    f"{shlex.quote(workflow)} ... --detach"))
    warn_undeclared(config_sets, wf.spec.config, workflow)
    config = config_overrides(wf.spec.config, config_sets)
    from .. import make_run_id

    rid = run_id or make_run_id()
    if detach:
        pending = call_engine(wf.submit(data, store=store_url, run_id=rid,
                                        config=config or None, limits=limits or None))
        if as_json:
            click.echo(json.dumps(pending.to_json(), ensure_ascii=False))
        else:
            click.echo(rid)
            click.echo(f"pending: run {rid} of {wf.name} is recorded; `interlock worker` "
                       "on this store executes it", err=True)
        return
    progress = Progress(rid, live=not as_json)
    progress.where = where_options(store_url)
    result = _execute(wf, data, store_url, rid, config, limits, progress)
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        progress.print_summary(result)
    note_abandoned_threads()
    sys.exit(exit_code_for(result.status))


def _execute(wf: Workflow, data: dict[str, Any], store_url: str | None, run_id: str,
             config: dict[str, Any], limits: dict[str, Any], progress: Progress) -> RunResult:
    """``wf.run`` with the engine's usage and store errors turned into `CliError`."""
    return call_engine(wf.run(data, store=store_url, run_id=run_id, config=config or None,
                              limits=limits or None, listener=progress), progress)


# -- resume -----------------------------------------------------------------------------------


@click.command(short_help="Continue a run, or decide a waiting one.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--approve", is_flag=True, help="Approve the waiting gate.")
@click.option("--reject", is_flag=True, help="Reject the waiting gate.")
@click.option("--modify", "patch_json", metavar="PATCH_JSON",
              help='Correct state fields (a JSON object, e.g. \'{"severity": "low"}\') and '
                   "re-run from a node of the gate's approval.on_modify list; on a guarded "
                   'tool call, \'{"arguments": {...}}\' runs it with edited arguments.')
@click.option("--at", "at_node", metavar="NODE",
              help="With --modify: the node to re-enter at (default: the first of "
                   "approval.on_modify).")
@click.option("--gate", "gate", metavar="NODE",
              help="With a decision: the gate it decides, as waiting.pending names it (a "
                   "node; NODE[i] for item i of a map; parent_node/child_gate for a child "
                   "run's gate). Default: the gate waiting longest (the first line says "
                   "which, and which gates still wait). A mapped gate's bare NODE is "
                   "refused while more than one of its items waits.")
@click.option("--data", "data_json", metavar="JSON",
              help="With --approve or --reject: the input the gate's approval.input "
                   "schema asks for (JSON); the gate's record carries it as data.")
@click.option("--by", metavar="NAME",
              help="Who decides; recorded in the log and checked against the gate's "
                   "approvers:. Not taken from $USER: without it the decision is anonymous, which "
                   "a gate that lists approvers: refuses.")
@click.option("--comment", metavar="TEXT", help="A note recorded with the decision.")
@set_option
@click.option("--force", is_flag=True,
              help="Take the run over even though another process holds its lease. Only "
                   "when that process is really gone (e.g. on another machine that died): "
                   "two processes executing one run would both run its nodes.")
@click.option("--detach", is_flag=True,
              help="Record the decision (or the resume) and exit 0 without executing: the "
                   "run is PENDING until `interlock worker` continues it.")
@click.option("--strict-code", is_flag=True,
              help="Refuse (exit 2, nothing recorded) to continue a run whose nodes' code "
                   "changed since it started, instead of warning and recording "
                   "run.code_changed.")
@json_option
@store_option
@server_options
def resume(run_id: str, approve: bool, reject: bool, patch_json: str | None, at_node: str | None,
           gate: str | None, data_json: str | None, by: str | None, comment: str | None,
           sets: tuple[str, ...], force: bool, detach: bool, strict_code: bool, as_json: bool,
           store_url: str | None,
           server_url: str | None, token: str | None) -> None:
    """Continue RUN_ID from its log, or decide the approval it is waiting for.

    A crashed or failed run continues where it stopped: nodes that completed are
    not run again, the interrupted (or failed) ones are. A run waiting for
    approval needs exactly one of --approve, --reject or --modify (with --data
    when the gate's approval.input asks for it; on a guarded tool call, --modify
    '{"arguments": {...}}' edits the call and --comment reaches the model). The
    run executes the workflow definition it started with, not the file as it is now.

    Exits like `run`: 0 completed, 1 failed, 2 refused (the reason is printed),
    3 waiting again, 4 rejected; with --detach, 0 once recorded.
    """
    from ..support import set_strict_code

    set_strict_code(True if strict_code else None)  # (None: as $INTERLOCK_STRICT_CODE says)
    decision = _resume_decision(approve, reject, patch_json, at_node, gate, data_json, by,
                                comment)
    config_sets, limits = parse_sets(sets)
    _check_remote_options(server_url, strict_code, detach)
    if server_url:
        _remote_resume(Remote(server_url, token, store_url), run_id, decision, config_sets,
                       limits, force, as_json, where_options(None, server_url, token))
    config = config_overrides({}, config_sets) if config_sets else {}
    if any(len(path) > 1 for path, _ in config_sets):
        config = _resume_config(run_id, store_url, config_sets)
    if detach:
        _detached_resume(run_id, decision, store_url, config, limits, force, as_json)
    progress = Progress(run_id, live=not as_json)
    progress.where = where_options(store_url)

    handed: list[str] = []
    # which gate the decision decided, said as it is recorded (before the run goes on)
    listener = NoteOnDecided(progress, decision)

    async def go(st: Store) -> RunResult:
        from .. import trace
        from ..support import resume_gate

        await _refuse_unkeyed(st, run_id, decision)  # (as `run` refuses; not --detach)
        await _warn_undeclared(st, run_id, config_sets)
        before = await trace(run_id, store=st)
        progress.replay(before)
        result, owner = await resume_gate(run_id, decision, store=st, config=config or None,
                                          limits=limits or None, force=force,
                                          listener=listener)
        if owner is not None:
            handed.append(owner)
        if not listener.said:  # recorded, not executed here (another process has the run)
            await _say_decided(st, run_id, decision, before[-1]["seq"] if before else 0)
        return result

    result = call_engine(with_store(store_url, go), progress)
    if handed:  # recorded; the process executing the run continues that branch
        _handed_off(run_id, result, handed[0], as_json)
    _finish(result, progress, as_json)


async def _refuse_unkeyed(st: Store, run_id: str, decision: Any) -> None:
    """Refuse a foreground ``resume`` that may reach an agent without its API key here
    (``support.resume_keys_missing``), saying what to do instead."""
    from ..support import resume_keys_missing

    keys = await resume_keys_missing(st, run_id, decision)
    if not keys:
        return
    lines = "\n  ".join(k.message for k in keys)
    what = "resume" if decision is None else "decision"
    raise CliError(f"run {run_id} was not continued (nothing is recorded): an agent node "
                   f"it may reach from where it stopped has no API key here\n  {lines}\n  "
                   f"set the variable and try again, or record the {what} for a worker or "
                   "server whose environment has the key: interlock resume "
                   f"{shlex.quote(run_id)} ... --detach")


def _resume_decision(approve: bool, reject: bool, patch_json: str | None, at_node: str | None,
                     gate: str | None, data_json: str | None, by: str | None,
                     comment: str | None) -> Any:
    """`resume`'s decision from its options (None: a plain resume), made via the CLI."""
    if approve and reject:  # (one option with two flag values would let the last one win)
        raise CliError("use one of --approve, --reject or --modify, not --approve and --reject")
    kind = "approve" if approve else "reject" if reject else None
    decision = _decision(kind, patch_json, at_node, by, comment, data_json)
    if gate is not None:
        if decision is None:
            raise CliError("--gate NODE goes with a decision (--approve, --reject or "
                           "--modify): it names the gate decided")
        decision = replace(decision, node=gate)
    if decision is not None:
        decision = replace(decision, via="cli")
    return decision


async def _say_decided(st: Store, run_id: str, decision: Any, after: int) -> None:
    """Say which gate ``decision`` decided when it did not name it exactly (`note`), from
    the run's records: its ``approval.decided`` after seq ``after``."""
    from .. import trace

    if decision is None:
        return
    records = await trace(run_id, store=st)
    rec = decided_record(decision, (r for r in records if r["seq"] > after))
    if rec is not None:
        say(note(decision, rec, waiting_before(records, rec["seq"])))


def _check_remote_options(server_url: str | None, strict_code: bool, detach: bool) -> None:
    """Refuse `resume` options that only make sense with --store when --server is given."""
    if server_url and strict_code:
        raise CliError("--strict-code goes with --store: through --server, the server decides "
                       "(`interlock serve --strict-code`)")
    if server_url and detach:
        raise CliError("--detach goes with --store: through --server, the server executes "
                       "the run, or records it for workers when it runs with --workers 0")


def _handed_off(run_id: str, result: RunResult, owner: str, as_json: bool) -> NoReturn:
    """The decision recorded while another process executes the run: say so, exit 0."""
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        click.echo(f"recorded: run {run_id} is being executed by {owner}, which "
                   "continues the gate's branch; `interlock status "
                   f"{run_id}` shows where it stands", err=True)
    sys.exit(0)


def _detached_resume(run_id: str, decision: Any, store_url: str | None,
                     config: dict[str, Any], limits: dict[str, Any], force: bool,
                     as_json: bool) -> NoReturn:
    """`resume --detach`: the decision (or the resume) recorded, the run left PENDING."""
    from .. import resume as resume_run

    async def go(st: Store) -> RunResult:
        after = (await st.get_run(run_id)).summary.last_seq
        result = await resume_run(run_id, decision, store=st, config=config or None,
                                  limits=limits or None, force=force, detach=True)
        await _say_decided(st, run_id, decision, after)
        return result

    result = call_engine(with_store(store_url, go))
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        click.echo(f"pending: run {run_id} is {result.status}; `interlock worker` on this "
                   "store continues it", err=True)
    sys.exit(0)


def _remote_resume(remote: Any, run_id: str, decision: Any, config_sets: list[ConfigSet],
                   limits: dict[str, Any], force: bool, as_json: bool,
                   where: str = "") -> NoReturn:
    """`resume` through a server: it records the decision (or resumes) and executes the
    run; this follows the run's events until it stops or waits, then prints as `resume`."""
    if limits or force or any(len(path) > 1 for path, _ in config_sets):
        raise CliError("with --server, resume takes --set KEY=VALUE for top-level config "
                       "keys only (no limits.*, no nested keys) and no --force: the server "
                       "executes the run")
    said = decision is None
    try:
        earlier = remote.records(run_id)  # (a 404 for an unknown run)
        before = len(earlier)
        if decision is not None:
            remote.decide(run_id, decision)
            # which gate it decided, said now (the server goes on executing the run)
            said = _say_remote(decision, earlier + remote.records(run_id, before), before)
        else:
            config = config_overrides({}, config_sets) if config_sets else {}
            remote.call("POST", f"/api/runs/{run_id}/resume", json={"config": config})
        remote.follow(run_id, before)
        result = remote.result(run_id)
        records = remote.records(run_id)
    finally:
        remote.close()
    if not said:  # (recorded later: by the process that executes the run)
        _say_remote(decision, records, before)
    progress = Progress(run_id, live=False)
    progress.where, progress.remote = where, True
    progress.replay(records)
    _finish(result, progress, as_json)


def _say_remote(decision: Any, records: list[dict[str, Any]], before: int) -> bool:
    """`note` for ``decision`` from a server's ``records`` (its ``approval.decided``
    after the first ``before``); whether it was found."""
    rec = decided_record(decision, records[before:])
    if rec is not None:
        say(note(decision, rec, waiting_before(records, rec["seq"])))
    return rec is not None


def _decision(kind: str | None, patch_json: str | None, at_node: str | None,
              by: str | None, comment: str | None, data_json: str | None = None) -> Any:
    """The `Decision` the options ask for, or None to just continue the run."""
    from .. import UsageError, approve, modify, reject

    if data_json is not None and kind is None:
        raise CliError("--data goes with --approve or --reject: it is the input the gate's "
                       "approval.input asks for" + (" (a --modify patch is its own data)"
                                                    if patch_json is not None else ""))
    if kind is not None and patch_json is not None:
        raise CliError(f"use one of --approve, --reject or --modify, not --{kind} and --modify")
    if at_node is not None and patch_json is None:
        raise CliError("--at NODE goes with --modify: it names where the corrected run "
                       "re-enters the graph")
    if patch_json is not None:
        patch = _parse_object(patch_json, "--modify", "state fields to replace")
        try:
            return modify(patch, at_node, by=by, comment=comment)
        except UsageError as exc:
            raise CliError(f"--modify: {exc}") from None
    if kind is None:
        if by is not None or comment is not None:
            raise CliError("--by and --comment go with a decision (--approve, --reject or "
                           "--modify)")
        return None
    data = _load_json(data_json, "--data", "the gate's input") if data_json is not None \
        else None
    return (approve if kind == "approve" else reject)(by, comment, data=data)


def _resume_config(run_id: str, store_url: str | None,
                   config_sets: list[ConfigSet]) -> dict[str, Any]:
    """Config overrides for a resume: a nested ``--set a.b=V`` keeps the siblings of the
    config the run has now (its file's config with the overrides it was given)."""

    async def current(st: Store) -> dict[str, Any]:
        from ..support import load_run

        return dict((await load_run(st, run_id)).view.config)

    return config_overrides(call_engine(with_store(store_url, current)), config_sets)


async def _warn_undeclared(st: Store, run_id: str, config_sets: list[ConfigSet]) -> None:
    """`warn_undeclared` against the definition the run started with (what it executes)."""
    if not config_sets:
        return
    from .. import InterlockError
    from ..support import parse_definition as parse

    try:
        row = await st.get_run(run_id)
    except InterlockError:  # no such run: the resume or fork that follows says so
        return
    warn_undeclared(config_sets, parse(row.definition).config,
                    f"the workflow of run {run_id!r} ({row.workflow})")


def _finish(result: RunResult, progress: Progress, as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        progress.print_summary(result)
    note_abandoned_threads()
    sys.exit(exit_code_for(result.status))


# -- fork -------------------------------------------------------------------------------------


@click.command(short_help="Start a new run from a point in an old one.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--at", "at_seq", type=click.IntRange(min=1), required=True, metavar="SEQ",
              help="The record to fork at (see `interlock trace`): the new run starts from "
                   "the state after it.")
@set_option
@click.option("--patch", "patch_json", metavar="JSON",
              help='Replace state fields in the new run, e.g. \'{"severity": "low"}\'.')
@click.option("--run-id", "new_run_id", metavar="ID",
              help="The new run's id instead of a generated one (as run --run-id).")
@json_option
@store_option
def fork(run_id: str, at_seq: int, sets: tuple[str, ...], patch_json: str | None,
         new_run_id: str | None, as_json: bool, store_url: str | None) -> None:
    """Start a new run from RUN_ID's state at record SEQ, with changed config (--set)
    or state (--patch), and drive it like `run`. RUN_ID itself is not touched.

    Exits like `run`: 0 completed, 1 failed, 2 invalid usage, 3 waiting, 4 rejected.
    """
    patch = _parse_object(patch_json, "--patch", "state fields") if patch_json else None
    config_sets, limits = parse_sets(sets)
    config = config_overrides({}, config_sets) if config_sets else {}
    if any(len(path) > 1 for path, _ in config_sets):
        config = _resume_config(run_id, store_url, config_sets)
    from .. import make_run_id

    rid = new_run_id or make_run_id()
    progress = Progress(rid, live=not as_json)
    progress.where = where_options(store_url)

    async def go(st: Store) -> RunResult:
        from .. import fork as fork_run
        from .. import trace

        await _warn_undeclared(st, run_id, config_sets)
        progress.replay([r for r in await trace(run_id, store=st) if r["seq"] <= at_seq])
        return await fork_run(run_id, at_seq, store=st, config=config or None, patch=patch,
                              new_run_id=rid, limits=limits or None, listener=progress)

    result = call_engine(with_store(store_url, go), progress)
    _finish(result, progress, as_json)


# -- cancel -----------------------------------------------------------------------------------


@click.command(short_help="Cancel a running or waiting run.")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--by", "by", metavar="NAME", help="Who cancels (recorded in the log).")
@click.option("--wait", "wait", type=click.FloatRange(min=0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="How long to wait for the process executing the run to stop it.")
@store_option
@server_options
def cancel(run_id: str, by: str | None, wait: float, store_url: str | None,
           server_url: str | None, token: str | None) -> None:
    """Cancel RUN_ID. A run waiting for a human, failed, or whose process died is
    cancelled at once; a run being executed by another process is asked to stop (its
    nodes in flight are cancelled, isolated processes killed). Exits 0 once the run is
    CANCELLED, 1 if the executing process did not stop it within --wait seconds."""
    from .. import RunResult
    from .. import cancel as run_cancel

    if server_url:
        remote = Remote(server_url, token, store_url)
        try:  # (the server records its token's name, or `local`, as who cancelled)
            result = RunResult(**remote.call("POST", f"/api/runs/{run_id}/cancel", json={}))
        finally:
            remote.close()
    else:
        result = call_engine(run_cancel(run_id, by=by, store=store_url, wait=wait))
    if result.status == "CANCELLED":
        click.echo(f"cancelled: {run_id}" + (f" by {by}" if by else ""))
        return
    click.echo(f"not yet cancelled: {run_id} is {result.status}; the process executing it "
               "has been asked to stop (check with `interlock status`)")
    sys.exit(EXIT_FAILED)
