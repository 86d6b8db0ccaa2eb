"""An action whose outcome is unknown (approved, started, its process SIGKILLed before the
outcome was recorded) is as unmistakable where a person decides outside the CLI as in it:
``--notify``'s webhook message, the Slack and Google Chat gate messages (whose Approve
button would run it AGAIN), and the MCP tools' ``decide`` hints, elicitation question and
task status -- when it started as UTC time, what ran with which arguments, what each
decision does, and how the outcome checked by hand is recorded. The kill is real: the
node SIGKILLs its own process in the middle of the action."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _workflows import ONE, ONODES
from test_server import Served, pythonpath
from test_slack import FakeSlack, project, served, slack  # noqa: F401 (fixtures)

from interlock.server._google_chat import GoogleChat
from interlock.server._notify import payload
from interlock.server._slack import Slack

NODES = ONODES  # (the name test_chat_stale_clicks imports)
UTC = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
EPOCH = re.compile(r"\d{10}\.\d+")
URL = "http://ops.example:8765"


def interlock(root: Path, store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock", *args, "--store", store],
                          cwd=root, env={**os.environ, "PYTHONPATH": pythonpath(root)},
                          capture_output=True, text=True, timeout=120)


def stranded(root: Path, store: str, run_id: str) -> None:
    """``run_id`` of ONE approved, its action killed mid-way, resumed: the run waits at
    its unknown_outcome gate."""
    (root / "onodes.py").write_text(ONODES)
    (root / "one.yaml").write_text(ONE)
    started = interlock(root, store, "run", "one.yaml", "--run-id", run_id,
                        "--input", '{"disk": "sda"}')
    assert started.returncode == 3, started.stderr
    (root / "kill.me").touch()
    killed = interlock(root, store, "resume", run_id, "--approve", "--by", "al")
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    resumed = interlock(root, store, "resume", run_id)
    assert resumed.returncode == 3, resumed.stderr


@pytest.fixture(scope="module")
def unknown(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The unknown_outcome gate's ``approval.requested`` record, and the run object
    (``status --json``) waiting at it."""
    root = tmp_path_factory.mktemp("unknown")
    store = f"sqlite:///{root / 'runs.db'}"
    stranded(root, store, "u1")
    records = json.loads(interlock(root, store, "trace", "u1", "--json").stdout)
    [rec] = [r for r in records if r["type"] == "approval.requested"
             and r.get("kind") == "unknown_outcome"]
    run = json.loads(interlock(root, store, "status", "u1", "--json").stdout)
    assert run["waiting"]["kind"] == "unknown_outcome"
    return rec, run


def said_plainly(text: str) -> None:
    assert "OUTCOME UNKNOWN" in text, text
    assert "node 'fix' was approved and started" in text, text
    assert "the process running it died" in text
    assert UTC.search(text), text  # when it started, readable (not an epoch float)
    assert not EPOCH.search(text), text
    assert '"disk": "sda"' in text  # its arguments
    assert "runs it AGAIN" in text
    assert "records it as not done" in text
    assert '{"result": {"FIELD": "VALUE"}}' in text  # the outcome checked by hand


def test_the_notify_message_says_approving_runs_it_again(
        unknown: tuple[dict[str, Any], dict[str, Any]]) -> None:
    rec, _ = unknown
    message = payload("one", "u1", rec, URL)
    said_plainly(message["text"])  # a webhook that shows only the text
    assert message["text"].endswith(f"<{URL}/approvals?run_id=u1>")
    said_plainly(json.dumps(message["blocks"], ensure_ascii=False).replace("\\", ""))
    assert "approve in the inbox with data" in message["text"]


def test_the_slack_message_asks_before_an_approve_runs_it_again(
        unknown: tuple[dict[str, Any], dict[str, Any]]) -> None:
    rec, _ = unknown
    message = Slack.message(None, "one", "u1", "fix", rec, URL)  # type: ignore[arg-type]
    said_plainly(json.dumps(message["blocks"], ensure_ascii=False).replace("\\", ""))
    buttons = {b["action_id"]: b for block in message["blocks"] if block["type"] == "actions"
               for b in block["elements"]}
    approve = buttons["interlock.approve"]
    assert approve["text"]["text"] == "Approve: run it AGAIN"
    assert approve["style"] == "danger"
    assert "runs it AGAIN" in approve["confirm"]["text"]["text"]
    assert len(approve["confirm"]["text"]["text"]) <= 300  # Slack's bound
    assert approve["confirm"]["confirm"]["text"] == "Run it again"
    assert buttons["interlock.reject"]["text"]["text"] == "Reject: not done"
    # another gate's message is as it was
    plain = Slack.message(None, "one", "u1", "g", {  # type: ignore[arg-type]
        "node": "g", "kind": "approval", "decisions": ["approve", "reject"]}, URL)
    assert "OUTCOME UNKNOWN" not in json.dumps(plain)
    assert not [b for block in plain["blocks"] if block["type"] == "actions"
                for b in block["elements"] if "confirm" in b]


def test_the_google_chat_card_says_approving_runs_it_again(
        unknown: tuple[dict[str, Any], dict[str, Any]]) -> None:
    rec, _ = unknown
    message = GoogleChat.message(None, "one", "u1", "fix", rec, URL)  # type: ignore[arg-type]
    assert "OUTCOME UNKNOWN" in message["text"] and "runs it AGAIN" in message["text"]
    card = message["cardsV2"][0]["card"]
    assert card["header"]["subtitle"] == "OUTCOME UNKNOWN"
    said_plainly(json.dumps(card, ensure_ascii=False).replace("\\", "")
                 .replace("&quot;", '"'))
    labels = [b["text"] for w in card["sections"][0]["widgets"] if "buttonList" in w
              for b in w["buttonList"]["buttons"]]
    assert labels[:2] == ["Approve: run it AGAIN", "Reject: not done"]


def test_the_mcp_answers_explain_it_and_offer_no_bare_approve(
        unknown: tuple[dict[str, Any], dict[str, Any]]) -> None:
    pytest.importorskip("mcp")
    from interlock.mcp._tasks import task_of
    from interlock.mcp._tools import _question, decide_hints

    _, run = unknown
    waiting = run["waiting"]
    hints = decide_hints("u1", waiting, URL, " --store sqlite:////srv/runs.db")
    said_plainly("\n".join(hints["outcomes"]["fix"]))  # type: ignore[index]
    # the command spells out each choice: a pasted bare --approve would run it again
    assert hints["cli"] == ("interlock resume u1 --gate fix --approve | --reject | --approve "
                            "--data '{\"result\": {\"FIELD\": \"VALUE\"}}' --store "
                            "sqlite:////srv/runs.db")
    data = [line for line in hints["outcomes"]["fix"] if "checked by hand" in line]  # type: ignore[index]
    assert shlex.split(data[0].split("`")[1])[-4:] == [
        "--data", '{"result": {"FIELD": "VALUE"}}', "--store", "sqlite:////srv/runs.db"]
    question = _question(run, waiting)
    assert question.message.startswith("OUTCOME UNKNOWN")
    said_plainly(question.message + json.dumps(question.requested_schema).replace("\\", ""))
    task = task_of(run, (0.0, 0.0))
    assert task["status"] == "input_required"
    assert "OUTCOME UNKNOWN" in task["statusMessage"]
    assert "runs it AGAIN" in task["statusMessage"]


def test_a_cli_run_s_unknown_outcome_is_posted_to_slack_explained(
        served: Served, slack: FakeSlack, project: Path) -> None:  # noqa: F811
    """The server executes nothing of it: its watch finds the gate in the store."""
    stranded(project, f"sqlite:///{project / 'runs.db'}", "s9")
    posts = slack.wait("chat.postMessage")
    while not any("OUTCOME UNKNOWN" in json.dumps(p) for p in posts):
        posts = slack.wait("chat.postMessage", len(posts) + 1)  # (the confirmation's)
    [post] = [p for p in posts if "OUTCOME UNKNOWN" in json.dumps(p)]
    said_plainly(json.dumps(post["blocks"], ensure_ascii=False).replace("\\", ""))
    assert "confirm" in post["blocks"][-1]["elements"][0]


def test_an_mcp_form_records_the_outcome_checked_by_hand_instead_of_running_it_again(
        tmp_path: Path) -> None:
    """The elicitation form of an unknown outcome has a field for the outcome checked by
    hand: approved with it, the run completes with that result, the action not run."""
    pytest.importorskip("mcp")
    import asyncio

    import mcp_types as types

    from interlock import load, open_store
    from interlock.mcp._local import LocalRuns
    from interlock.mcp._runs import Caller
    from interlock.mcp._tools import CHECKED, _decision, _question

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    stranded(tmp_path, store, "m1")
    run = json.loads(interlock(tmp_path, store, "status", "m1", "--json").stdout)
    form = _question(run, run["waiting"])
    assert CHECKED in form.requested_schema["properties"]
    assert f"approve with {CHECKED!r} filled in: records the outcome" in form.message
    answer = types.ElicitResult(action="accept", content={
        "decision": "approve", CHECKED: '{"fixed": "by hand"}'})
    decision = _decision(answer, "fix", Caller("al"))
    assert decision is not None and decision.data == {"result": {"fixed": "by hand"}}

    async def decide() -> dict[str, Any]:
        st = open_store(store)
        try:
            runs = LocalRuns({"one": load(str(tmp_path / "one.yaml"))}, st)

            async def progress(rec: object) -> None:
                pass

            return await runs.decide("m1", decision, Caller("al"), progress)
        finally:
            await st.close()

    cwd = os.getcwd()
    os.chdir(tmp_path)  # (the node module resolves from the project)
    sys.path.insert(0, str(tmp_path))
    try:
        done = asyncio.run(decide())
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
    assert done["status"] == "COMPLETED", done
    assert done["state"]["fixed"] == "by hand"
    assert (tmp_path / "fix.log").read_text().split() == ["fix"]  # not run again
