"""A chat button decides only the request it was posted for. A ``confirm: true`` action
is approved, its process is SIGKILLed in the middle of it (for real), and the resumed run
asks again (OUTCOME UNKNOWN: approving runs it AGAIN). The first message's Approve
button -- still on screen when the server could not update it -- must not decide that new
request: the click is answered "no longer waiting" and records nothing, while the new
message's button (Slack's "Run it again?" dialog, the card's "run it AGAIN") decides it.
Against a real ``interlock serve`` with the fake Slack Web API / Google Chat API of
test_slack / test_google_chat."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_google_chat import AUDIENCE, FakeGoogle, event, google, send, token  # noqa: F401
from test_outcome_messages import NODES, ONE, interlock
from test_server import Served, wait_status
from test_slack import FakeSlack, click, decided, posted, project, slack  # noqa: F401

pytest.importorskip("httpx")


def approved_then_killed(root: Path, run_id: str, posts: Any) -> None:
    """Run ONE (it waits at the confirmation of 'fix', posted: ``posts(1)``), approve it
    from the CLI and SIGKILL the action mid-way, resume: it asks again (``posts(2)``)."""
    (root / "onodes.py").write_text(NODES)
    (root / "flows" / "one.yaml").write_text(ONE)
    store = f"sqlite:///{root / 'runs.db'}"
    started = interlock(root, store, "run", "flows/one.yaml", "--run-id", run_id,
                        "--input", '{"disk": "sda"}')
    assert started.returncode == 3, started.stderr
    posts(1)  # the confirmation's message, before it is decided
    (root / "kill.me").touch()
    killed = interlock(root, store, "resume", run_id, "--gate", "fix", "--approve",
                       "--by", "al")
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    resumed = interlock(root, store, "resume", run_id)
    assert resumed.returncode == 3, resumed.stderr


def ran(root: Path) -> int:
    return (root / "fix.log").read_text().count("fix")


@pytest.fixture
def slack_served(project: Path, slack: FakeSlack) -> Iterator[Served]:  # noqa: F811
    server = Served(project, "--auth", "chat-auth.yaml", "--slack-channel", "CGATES",
                    "--notify-timeout", "5")
    yield server
    server.stop()
    assert not [line for line in server.lines if "Traceback" in line], "".join(server.lines)


def test_an_earlier_slack_message_s_button_does_not_decide_the_gate_asked_again(
        slack_served: Served, slack: FakeSlack, project: Path) -> None:  # noqa: F811
    served = slack_served
    approved_then_killed(project, "k1", lambda n: slack.wait("chat.postMessage", n))
    first, second = slack.wait("chat.postMessage", 2)[:2]
    assert "OUTCOME UNKNOWN" in json.dumps(second) and "OUTCOME" not in json.dumps(first)
    with served.client("tok-alice") as c, served.client() as anonymous:
        wait_status(c, "k1", "WAITING_APPROVAL")
        before = c.get("/api/runs/k1/records").json()
        assert len(decided(c, "k1")) == 1 and ran(project) == 1

        # the first message's plain Approve: refused, answered, nothing decided
        body, headers = click(slack, first, "UALICE", reply="/respond/1")
        r = anonymous.post("/api/integrations/slack/actions", content=body, headers=headers)
        assert r.status_code == 200, r.text
        [answer] = slack.wait("/respond/1")
        assert answer["response_type"] == "ephemeral", answer
        assert "No decision recorded" in answer["text"], answer
        assert "no longer waiting" in answer["text"] and "asked again" in answer["text"]
        assert "runs it AGAIN" in answer["text"], answer
        assert len(decided(c, "k1")) == 1
        assert c.get("/api/runs/k1").json()["waiting"]["kind"] == "unknown_outcome"
        # (the answer is on record; no other record was added)
        added = [r for r in c.get("/api/runs/k1/records").json() if r["seq"] > before[-1]["seq"]]
        assert {(r["type"], r.get("action")) for r in added} <= {
            ("notify.sent", "answer"), ("notify.sent", "update")}

        # a button of an older version (no request in its value) on the new message:
        # it can only be an earlier message's, so an unknown outcome refuses it
        old = json.loads(json.dumps(second))
        for block in old["blocks"]:
            for element in block.get("elements") or []:
                if "value" in element:
                    value = json.loads(element["value"])
                    assert value["request"] > json.loads(
                        first["blocks"][-1]["elements"][0]["value"])["request"]
                    del value["request"]
                    element["value"] = json.dumps(value)
        body, headers = click(slack, old, "UALICE", reply="/respond/2")
        assert anonymous.post("/api/integrations/slack/actions", content=body,
                              headers=headers).status_code == 200
        [answer] = slack.wait("/respond/2")
        assert "earlier message" in answer["text"], answer
        assert len(decided(c, "k1")) == 1 and ran(project) == 1

        # the new message's button decides it: the action runs again, once
        body, headers = click(slack, second, "UALICE", reply="/respond/3")
        r = anonymous.post("/api/integrations/slack/actions", content=body, headers=headers)
        assert r.status_code == 200, r.text
        wait_status(c, "k1", "COMPLETED")
        assert [d["decision"] for d in decided(c, "k1")] == ["approved", "approved"]
        assert ran(project) == 2
        assert not slack.of("/respond/3")


def test_an_earlier_google_chat_card_s_button_does_not_decide_the_gate_asked_again(
        project: Path, google: FakeGoogle) -> None:  # noqa: F811
    served = Served(project, "--auth", "chat-auth.yaml", "--google-chat-space", "spaces/AAA",
                    "--google-chat-audience", AUDIENCE, "--google-chat-keys",
                    "chat-keys.json")
    try:
        approved_then_killed(project, "k2", lambda n: google.wait("POST", n))
        (_, first, _), (_, second, _) = google.wait("POST", 2)[:2]
        assert "OUTCOME UNKNOWN" in json.dumps(second)
        with served.client("tok-alice") as c, served.client() as anonymous:
            wait_status(c, "k2", "WAITING_APPROVAL")
            r = send(anonymous, event(first, "users/111"), token())
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["privateMessageViewer"] == {"name": "users/111"}
            assert "no longer waiting" in answer["text"], answer
            assert len(decided(c, "k2")) == 1 and ran(project) == 1
            assert c.get("/api/runs/k2").json()["waiting"]["kind"] == "unknown_outcome"

            r = send(anonymous, event(second, "users/111"), token())
            assert r.status_code == 200 and r.json() == {}, r.text
            wait_status(c, "k2", "COMPLETED")
            assert len(decided(c, "k2")) == 2 and ran(project) == 2
    finally:
        served.stop()
    assert not [line for line in served.lines if "Traceback" in line], "".join(served.lines)


def test_an_earlier_message_updated_late_says_its_own_decision_not_the_later_one(
        project: Path, slack: FakeSlack) -> None:  # noqa: F811
    """The update of the first message, owed while no server was up, is made by the next
    server after the gate was asked again and decided again: it says how the request it
    was posted for was decided (approved by al), not the later decision (rejected)."""
    served = Served(project, "--auth", "chat-auth.yaml", "--slack-channel", "CGATES")

    def stopped_after_the_post(n: int) -> None:
        if n == 1:
            with served.client("tok-alice") as c:
                posted(c, "k3")  # (on record: the next server does not post it again)
            served.stop()

    try:
        approved_then_killed(project, "k3", stopped_after_the_post)
    finally:
        served.stop()
    store = f"sqlite:///{project / 'runs.db'}"
    rejected = interlock(project, store, "resume", "k3", "--gate", "fix", "--reject",
                         "--by", "bob")
    assert rejected.returncode in (0, 1), rejected.stderr
    again = Served(project, "--auth", "chat-auth.yaml", "--slack-channel", "CGATES")
    try:
        [update] = slack.wait("chat.update")
        said = json.dumps(update["blocks"])
        assert "Approved by al (via cli)" in said and "Rejected" not in said, said
        assert len(slack.of("chat.postMessage")) == 1  # (the second asking: decided unposted)
    finally:
        again.stop()
