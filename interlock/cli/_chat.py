"""Conversations from the command line: ``interlock send`` and ``interlock chat``.

``send RUN_ID TEXT`` sends one message and returns when the turn stops, printing the
reply (``--json``: the run object); it exits 3 when the conversation waits (for its next
message, or for a gate the turn reached), 0 when it ended, 1 when the turn failed, 2 when
the message is refused. ``chat FILE [--session RUN_ID]`` holds a conversation: each line
of standard input is a message, replies, tool calls and child runs are printed as they
happen, a gate reached during a turn is shown with how to decide it (or decided inline:
``/approve``, ``/reject [COMMENT]``), and ``/end`` ends it.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ._common import (
    EXIT_FAILED,
    CliError,
    call_engine,
    exit_code_for,
    json_option,
    load_workflow,
    missing_keys,
    note_abandoned_threads,
    read_input,
    store_option,
    with_store,
)
from ._format import where_options
from ._remote import Remote, server_options

if TYPE_CHECKING:
    from .. import RunResult, Store


def last_reply(result: RunResult | Mapping[str, Any]) -> str | None:
    """The reply the turn ended with: the waiting gate's ``last_reply``, or (the
    conversation ended) the chat node's field in state."""
    data = result.to_json() if hasattr(result, "to_json") else dict(result)
    waiting = data.get("waiting") or {}
    show = waiting.get("show") or {}
    if waiting.get("kind") == "message":
        reply = show.get("last_reply")
        return reply if isinstance(reply, str) else None
    state = data.get("state") or {}
    for value in state.values():
        if isinstance(value, str):
            return value
    return None


def _print_turn(data: Mapping[str, Any], run_id: str, where: str = "",
                remote: bool = False, ended: bool = False) -> None:
    """The turn's reply on stdout, or (stderr) what the conversation waits for with the
    command that goes on -- carrying ``where``, the options that reach the same store or
    server (``remote``: a server's)."""
    status = data.get("status")
    waiting = data.get("waiting") or {}
    show = waiting.get("show") or {}
    if status == "WAITING_INPUT" and show.get("turn_error"):
        click.echo(f"the turn failed: {show['turn_error']}", err=True)
        return
    if status == "WAITING_INPUT" or status == "COMPLETED":
        reply = last_reply(data)
        # (`/end` gets no reply: the state holds the previous turn's)
        if reply is not None and not (ended and status == "COMPLETED"):
            click.echo(reply)
        if status == "COMPLETED":
            click.echo(f"the conversation {run_id} has ended", err=True)
        return
    if status == "WAITING_APPROVAL":
        click.echo(f"waiting for a decision at {waiting.get('node')!r}: "
                   f"{json.dumps(waiting.get('show'), ensure_ascii=False)}", err=True)
        from ..support import decide_hint

        click.echo(f"decide with: {decide_hint(run_id, waiting, where)}", err=True)
        return
    error = data.get("error") or {}
    click.echo(f"the turn {str(status).lower()}: {error.get('message', '')}", err=True)
    if status == "FAILED":  # what can be done, as `status` says it
        from ._gate_hints import failed_hint

        click.echo(failed_hint(run_id, data.get("error"), where, remote), err=True)


@click.command(short_help="Send a message to a conversation.")
@click.argument("run_id", metavar="RUN_ID")
@click.argument("text", metavar="TEXT")
@click.option("--by", metavar="NAME", help="Who sends it (recorded with the message).")
@json_option
@store_option
@server_options
def send(run_id: str, text: str, by: str | None, as_json: bool, store_url: str | None,
         server_url: str | None, token: str | None) -> NoReturn:
    """Send TEXT to the conversation RUN_ID (a run of a chat: workflow) and run its turn.

    Prints the reply (--json: the run object). Exits 3 when the conversation waits for
    its next message or for a gate the turn reached, 0 when it ended (`/end`), 1 when
    the turn failed, 2 when the message is refused (the run does not wait for one).
    """
    if server_url:
        remote = Remote(server_url, token, store_url)
        where = where_options(None, server_url, token)
        try:
            before = len(remote.records(run_id))
            try:
                remote.call("POST", f"/api/runs/{run_id}/messages",
                            json={"text": text, "by": by})
            except CliError as exc:  # refused: said again with --server in its command
                if not str(exc.message).startswith("the message to run"):
                    raise
                run = remote.result(run_id)
                raise _refused(run_id, run.status, run.waiting, where) from None
            remote.follow(run_id, before)
            data = remote.result(run_id).to_json()
        finally:
            remote.close()
        _done(data, run_id, as_json, where, remote=True, ended=_ends(text))

    async def go(st: Store) -> RunResult:
        from .. import send as send_message
        from ..support import MessageRefused

        try:
            return await send_message(run_id, text, by=by, store=st)
        except MessageRefused as exc:  # said again with --store in its command
            if exc.status is None:
                raise
            raise _refused(run_id, exc.status, exc.waiting, where_options(store_url)) \
                from None

    result = call_engine(with_store(store_url, go))
    _done(result.to_json(), run_id, as_json, where_options(store_url), ended=_ends(text))


def _ends(text: str) -> bool:
    """Whether ``text`` is the message that ends the conversation (it gets no reply)."""
    from ._chat_lines import END

    return text.strip() == END


def _refused(run_id: str, status: str, waiting: Mapping[str, Any] | None,
             where: str) -> CliError:
    """The refusal of a message, its command carrying ``where``."""
    from ..support import message_refusal

    return CliError(message_refusal(run_id, status, waiting, where))


def _done(data: Mapping[str, Any], run_id: str, as_json: bool, where: str,
          remote: bool = False, ended: bool = False) -> NoReturn:
    if as_json:
        click.echo(json.dumps(dict(data), ensure_ascii=False))
    else:
        _print_turn(data, run_id, where, remote, ended)
    note_abandoned_threads()
    sys.exit(EXIT_FAILED if turn_failed(data) else exit_code_for(str(data.get("status"))))


def turn_failed(data: Mapping[str, Any]) -> bool:
    """Whether the turn just run failed on a limit of its own (the conversation waits
    for the next message: ``waiting.show.turn_error``)."""
    waiting = data.get("waiting") or {}
    show = waiting.get("show") or {}
    return waiting.get("kind") == "message" and bool(show.get("turn_error"))


@click.command(short_help="Hold a conversation in the terminal.")
@click.argument("workflow", metavar="FILE")
@click.option("--session", "session", metavar="RUN_ID",
              help="Continue this conversation instead of starting a new one.")
@click.option("--input", "input_json", metavar="JSON", help="The conversation's input.")
@click.option("--by", metavar="NAME",
              help="Who talks and decides (recorded with each message and each /approve or "
                   "/reject). Not taken from $USER: without it both are anonymous, as with "
                   "`interlock resume`, and a gate that lists approvers: refuses.")
@store_option
@server_options
def chat(workflow: str, session: str | None, input_json: str | None, by: str | None,
         store_url: str | None, server_url: str | None, token: str | None) -> None:
    """Talk with the agent of a chat: workflow FILE: each line of standard input is a
    message, its reply is printed as it arrives; `/end` ends the conversation.

    Exits 0 when the conversation ended, 3 when standard input ended first (the
    conversation waits: --session continues it), 1 when a turn failed.

    A gate the turn reaches is shown; `/approve [COMMENT]` or `/reject [COMMENT]`
    decides it in place. Without --session a new conversation starts (its id is printed
    on stderr: `--session ID` continues it later, from any process).
    """
    if server_url:
        from ._chat_remote import RemoteTerminal

        remote = Remote(server_url, token, store_url)
        terminal = RemoteTerminal(remote, by)
        status = terminal.run(workflow, session, input_json)
        terminal.left(status, terminal.waiting, workflow,
                      where_options(None, server_url, token), terminal.error, remote=True)
        sys.exit(exit_code_for(status))
    wf = load_workflow(workflow)
    if wf.spec.chat is None:
        raise CliError(f"{workflow} is not a conversation: declare chat: NODE (the agent "
                       "node that converses) in it")
    keys = [w for w in wf.warnings if w.code == "api-key"]  # each turn would fail here
    if keys:
        raise CliError(missing_keys(keys, "talk to it through a server whose environment "
                                    "has the key: interlock chat "
                                    f"{shlex.quote(workflow)} --server URL"))
    data = read_input(input_json, None)
    from ._chat_live import Terminal

    status = Terminal(wf, store_url, by).run(data, session, workflow)
    note_abandoned_threads()
    sys.exit(exit_code_for(status))
