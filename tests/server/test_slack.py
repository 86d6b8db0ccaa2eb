"""Gates in Slack (SPEC §13) against a real ``interlock serve`` and a fake Slack Web API
(a real HTTP server on loopback, reached through ``SLACK_API_URL``), with clicks signed
as Slack signs them (slack-sdk's `SignatureVerifier`, with the app's signing secret)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from _harness import write_auth, write_folder
from test_server import GATED, NODES, Served, events, pythonpath, wait_status

httpx = pytest.importorskip("httpx")
signature = pytest.importorskip("slack_sdk.signature")

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
USERS = {  # name: (token, roles, Slack user id)
    "alice": ("tok-alice", ["approver"], "UALICE"),
    "bob": ("tok-bob", ["approver"], "UBOB"),  # not in the gate's approvers:
    "vic": ("tok-vic", ["viewer"], "UVIC"),
    "olga": ("tok-olga", ["operator"], None),  # starts the runs; not in Slack
}


CNODES = """
    def start(state):
        return {"x": 1}

    def plan(state):
        return {"targets": ["t0", "t1", "t2"], "env": "prod"}

    def report(state):
        return {"report": [d["decision"] for d in state["decisions"]]}

    def done(state):
        with open("done.log", "a") as f:
            f.write("done\\n")
        return {"done": True}
"""

AUDIT = """
    workflow: audit
    nodes:
      start: cnodes:start
      legal: {approval: {show: [x], approvers: [alice]}}
      finance: {approval: {show: [x], approvers: [bob]}}
      done: cnodes:done
    edges:
      - {from: START, to: start}
      - {from: start, to: [legal, finance]}
      - {from: [legal, finance], to: done}
"""

DEPLOYS = """
    workflow: deploys
    nodes:
      plan: cnodes:plan
      deploy: {approval: {show: [env]}}
      report: cnodes:report
    edges:
      - {from: START, to: plan}
      - {from: plan, map: 'targets', to: deploy, as: target, collect: decisions}
      - {from: deploy, to: report}
"""


class FakeSlack:
    """chat.postMessage, chat.update and response_url, on loopback; what each got."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.changed = threading.Condition()
        # answers given before the next success of a method: (method, status, headers,
        # body), the first that matches used once; and every answer given: (path,
        # status, when)
        self.failures: list[tuple[str, int, dict[str, str], dict[str, Any]]] = []
        self.answers: list[tuple[str, int, float]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = json.loads(body or b"{}")
                status, headers = 200, {}
                answer: dict[str, Any] = {"ok": True}
                with fake.changed:
                    failure = next((f for f in fake.failures if self.path.endswith(f[0])),
                                   None)
                    if failure is not None:
                        fake.failures.remove(failure)
                        _, status, headers, answer = failure
                    fake.calls.append((self.path, data, dict(self.headers)))
                    fake.answers.append((self.path, status, time.time()))
                    n = len(fake.calls)
                    fake.changed.notify_all()
                if failure is None and self.path.endswith("chat.postMessage"):
                    answer |= {"channel": data["channel"], "ts": f"1700000000.{n:06d}"}
                elif failure is None and self.path.endswith("chat.update"):
                    answer |= {"channel": data["channel"], "ts": data["ts"]}
                raw = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def of(self, suffix: str) -> list[dict[str, Any]]:
        return [d for p, d, _ in self.calls if suffix in p]

    def wait(self, suffix: str, count: int = 1) -> list[dict[str, Any]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.of(suffix)) >= count, 30), \
                f"no {count} call(s) of {suffix}: {self.calls}"
            return self.of(suffix)

    def taken(self, suffix: str) -> list[float]:
        """When each call of ``suffix`` answered 200 came."""
        with self.changed:
            return [t for p, s, t in self.answers if p.endswith(suffix) and s == 200]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("INTERLOCK_STORE", raising=False)
    monkeypatch.delenv("INTERLOCK_LOG_KEY", raising=False)
    return write_folder(tmp_path, {"snodes": NODES, "cnodes": CNODES},
                        {"gated": GATED, "audit": AUDIT, "deploys": DEPLOYS})


@pytest.fixture
def slack(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    fake = FakeSlack()
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("SLACK_API_URL", f"{fake.url}/api/")
    write_auth(project, USERS, "chat-auth.yaml", chat="slack")
    yield fake
    fake.http.shutdown()
    fake.http.server_close()


@pytest.fixture
def served(project: Path, slack: FakeSlack) -> Iterator[Served]:
    server = Served(project, "--auth", "chat-auth.yaml", "--slack-channel", "CGATES",
                    "--notify-timeout", "5")
    yield server
    server.stop()
    assert not [line for line in server.lines if "Traceback" in line], "".join(server.lines)


def click(fake: FakeSlack, message: dict[str, Any], user: str, kind: str = "approve", *,
          secret: str = SECRET, age: float = 0.0, reply: str = "/respond/1"
          ) -> tuple[bytes, dict[str, str]]:
    """Slack's interactivity request for a click on ``message``'s ``kind`` button."""
    button = next(e for b in message["blocks"] if b["type"] == "actions"
                  for e in b["elements"] if e.get("action_id") == f"interlock.{kind}")
    payload = {"type": "block_actions", "user": {"id": user, "name": user.lower()},
               "response_url": fake.url + reply, "container": {"message_ts": "x"},
               "actions": [{"action_id": button["action_id"], "value": button["value"],
                            "type": "button"}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time() - age))
    sig = signature.SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return body, {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig,
                  "Content-Type": "application/x-www-form-urlencoded"}


def decided(client: Any, run_id: str) -> list[dict[str, Any]]:
    return [r for r in client.get(f"/api/runs/{run_id}/records").json()
            if r["type"] == "approval.decided"]


def sent(client: Any, run_id: str, action: str) -> list[dict[str, Any]]:
    return [r for r in client.get(f"/api/runs/{run_id}/records").json()
            if r["type"] == "notify.sent" and r.get("action") == action]


def posted(client: Any, run_id: str) -> dict[str, Any]:
    """The record of the gate's post (followed on the run's event stream)."""
    for ev in events(client, run_id, params={"after": 0}, until="notify.sent"):
        if ev["event"] == "notify.sent":
            assert ev["data"]["action"] == "post", ev
            return dict(ev["data"])
    raise AssertionError(f"no notify.sent for run {run_id}")


def start(client: Any, run_id: str, workflow: str = "gated") -> None:
    operator = httpx.Client(base_url=str(client.base_url), timeout=30,
                            headers={"Authorization": "Bearer tok-olga"})
    with operator:
        r = operator.post(f"/api/workflows/{workflow}/runs",
                          json={"input": {"n": 1}, "run_id": run_id})
    assert r.status_code == 201, r.text
    wait_status(client, run_id, "WAITING_APPROVAL")


def test_a_gate_is_posted_approved_by_a_click_updated_and_the_run_continues(
        served: Served, slack: FakeSlack) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "s1")
        post = slack.wait("chat.postMessage")[0]
        assert post["channel"] == "CGATES"
        text = json.dumps(post["blocks"])
        assert "gated" in text and "s1" in text and "gate" in text
        buttons = {e["text"]["text"]: e for b in post["blocks"] if b["type"] == "actions"
                   for e in b["elements"]}
        assert set(buttons) == {"Approve", "Reject", "Open in the dashboard"}
        assert "/approvals?run_id=s1" in buttons["Open in the dashboard"]["url"]
        calls = [h for p, _, h in slack.calls if p.endswith("chat.postMessage")]
        assert calls[0]["Authorization"] == "Bearer xoxb-test-token"
        # the post is on record, with where the message is
        record = posted(c, "s1")
        # a button decides the asking it was posted for (its approval.requested's seq)
        assert json.loads(buttons["Approve"]["value"]) == {
            "run_id": "s1", "gate": "gate", "decision": "approve",
            "request": record["request"]}
        assert record["via"] == "slack" and record["where"]["channel"] == "CGATES"

        # a click, verified (no bearer token: Slack's signature is the credential)
        body, headers = click(slack, post, "UALICE")
        r = anonymous.post("/api/integrations/slack/actions", content=body, headers=headers)
        assert r.status_code == 200, r.text
        update = slack.wait("chat.update")[0]
        assert update["ts"] == record["where"]["ts"] and update["channel"] == "CGATES"
        assert not [b for b in update["blocks"] if b["type"] == "actions"]  # no buttons
        assert "Approved by alice (via slack)" in json.dumps(update["blocks"])
        # its first line (and the notification text) says the gate was decided: someone
        # scanning the channel does not read "is waiting" on a decided request
        first = update["blocks"][0]["text"]["text"]
        assert first.startswith("gated: run s1: gate approved by alice (via slack) at "), first
        assert "waiting" not in json.dumps(update)
        assert update["text"].startswith("gated: run s1: gate approved by alice")
        run = wait_status(c, "s1", "COMPLETED")
        assert run["state"]["last"] == 4
        [d] = decided(c, "s1")
        assert (d["decision"], d["by"], d.get("via")) == ("approved", "alice", "slack")
        assert len(slack.of("chat.postMessage")) == 1


@pytest.mark.parametrize("case", ["bad signature", "stale timestamp", "no signature"])
def test_a_click_that_does_not_verify_is_401_and_records_nothing(
        served: Served, slack: FakeSlack, case: str) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "s2")
        post = slack.wait("chat.postMessage")[0]
        posted(c, "s2")
        before = c.get("/api/runs/s2/records").json()
        body, headers = click(slack, post, "UALICE",
                              secret="not-the-secret" if case == "bad signature" else SECRET,
                              age=400 if case == "stale timestamp" else 0)
        if case == "no signature":
            del headers["X-Slack-Signature"]
        r = anonymous.post("/api/integrations/slack/actions", content=body, headers=headers)
        assert r.status_code == 401, r.text
        # the caller is told it does not verify; why is in the server's log
        assert r.json()["detail"] == "the request's signature does not verify"
        assert "SLACK_SIGNING_SECRET" not in r.text
        deadline = time.monotonic() + 10
        while not [line for line in served.lines if "SLACK_SIGNING_SECRET" in line] and \
                time.monotonic() < deadline:
            time.sleep(0.05)  # (the server's stderr is read by a thread)
        assert [line for line in served.lines if "401" in line and
                "SLACK_SIGNING_SECRET" in line], served.lines[-5:]
        assert c.get("/api/runs/s2/records").json() == before  # nothing at all
        assert c.get("/api/runs/s2").json()["status"] == "WAITING_APPROVAL"
        assert not slack.of("/respond/1")


def test_refused_clicks_record_no_decision_and_are_answered_ephemerally(
        served: Served, slack: FakeSlack) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "s3")
        post = slack.wait("chat.postMessage")[0]
        record = posted(c, "s3")
        cases = [("UNOBODY", "is not mapped to an approver"),
                 ("UBOB", "'bob' may not decide 'gate'"),
                 ("UVIC", "vic may not decide gates")]
        for n, (user, why) in enumerate(cases, 1):
            body, headers = click(slack, post, user, reply=f"/respond/{n}")
            r = anonymous.post("/api/integrations/slack/actions", content=body,
                               headers=headers)
            assert r.status_code == 200, r.text
            [answer] = slack.wait(f"/respond/{n}")
            assert answer["response_type"] == "ephemeral"
            assert answer["replace_original"] is False
            assert why in answer["text"], answer
        assert decided(c, "s3") == []
        assert c.get("/api/runs/s3").json()["status"] == "WAITING_APPROVAL"
        assert not slack.of("chat.update")
        # each answer is on record (and those are the only records the clicks added)
        deadline = time.monotonic() + 30
        while len(sent(c, "s3", "answer")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # (the records are appended after the answers are sent)
        answers = sent(c, "s3", "answer")
        assert sorted(a["user"] for a in answers) == ["UBOB", "UNOBODY", "UVIC"]
        types = {r["type"] for r in c.get("/api/runs/s3/records").json()
                 if r["seq"] > record["seq"]}
        assert types == {"notify.sent"}

        # a double click: the second finds the gate decided
        body, headers = click(slack, post, "UALICE", reply="/respond/4")
        assert anonymous.post("/api/integrations/slack/actions", content=body,
                              headers=headers).status_code == 200
        wait_status(c, "s3", "COMPLETED")
        body, headers = click(slack, post, "UALICE", reply="/respond/5")
        assert anonymous.post("/api/integrations/slack/actions", content=body,
                              headers=headers).status_code == 200
        [again] = slack.wait("/respond/5")
        assert again["response_type"] == "ephemeral" and "No decision" in again["text"]
        assert len(decided(c, "s3")) == 1
        assert not slack.of("/respond/4")


def test_a_gate_decided_from_the_api_or_the_cli_updates_the_message(
        served: Served, slack: FakeSlack, project: Path) -> None:
    with served.client("tok-alice") as c:
        start(c, "s4")
        slack.wait("chat.postMessage")
        r = c.post("/api/runs/s4/decisions", json={"decision": "reject",
                                                   "comment": "not today"})
        assert r.status_code == 200, r.text
        [update] = slack.wait("chat.update")
        assert "Rejected by alice (via api)" in json.dumps(update["blocks"])

        # decided by another process (the CLI, on the same store): the server's watch
        start(c, "s5")
        posts = slack.wait("chat.postMessage", 2)
        assert "s5" in json.dumps(posts[1]["blocks"])
        done = subprocess.run(
            [sys.executable, "-m", "interlock", "resume", "s5", "--approve", "--by", "alice",
             "--store", f"sqlite:///{project / 'runs.db'}"],
            cwd=project, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": pythonpath(project)})
        assert done.returncode == 0, done.stderr
        updates = slack.wait("chat.update", 2)
        assert "Approved by alice (via cli)" in json.dumps(updates[1]["blocks"])


def test_parallel_gates_get_a_message_each_and_a_racing_double_click_decides_once(
        served: Served, slack: FakeSlack, project: Path) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "s6", "audit")
        posts = {json.loads(e["value"])["gate"]: p for p in slack.wait("chat.postMessage", 2)
                 for b in p["blocks"] if b["type"] == "actions" for e in b["elements"]
                 if e.get("action_id") == "interlock.approve"}
        assert set(posts) == {"legal", "finance"}
        # alice's two clicks on legal at once: one decision, one answer
        clicks = [click(slack, posts["legal"], "UALICE", reply=f"/respond/{n}")
                  for n in (1, 2)]
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda bh: anonymous.post(
                "/api/integrations/slack/actions", content=bh[0], headers=bh[1]), clicks))
        assert [a.status_code for a in answers] == [200, 200]
        [refused] = slack.wait("/respond/", 1)
        assert "No decision recorded" in refused["text"]
        [update] = slack.wait("chat.update")
        assert "Approved by alice" in json.dumps(update["blocks"])
        assert c.get("/api/runs/s6").json()["status"] == "WAITING_APPROVAL"  # finance waits
        body, headers = click(slack, posts["finance"], "UBOB", reply="/respond/3")
        assert anonymous.post("/api/integrations/slack/actions", content=body,
                              headers=headers).status_code == 200
        wait_status(c, "s6", "COMPLETED")
        updates = slack.wait("chat.update", 2)
        assert "Approved by bob" in json.dumps(updates[1]["blocks"])
        assert updates[0]["ts"] != updates[1]["ts"]  # each gate its own message
        assert [(d["node"], d["by"]) for d in decided(c, "s6")] == [
            ("legal", "alice"), ("finance", "bob")]
        assert (project / "done.log").read_text() == "done\n"  # the join, once
        assert len(slack.of("chat.postMessage")) == 2 and len(slack.of("chat.update")) == 2


@pytest.mark.parametrize("case", ["no slack token", "no chat key", "bad slack id"])
def test_serve_refuses_a_chat_it_cannot_use_before_listening(
        project: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "GOOGLE_CHAT_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    auth = {"tokens": [{"name": "alice", "sha256": "0" * 64, "roles": ["approver"],
                        **({"slack": 7} if case == "bad slack id" else {})}]}
    (project / "chat-auth.yaml").write_text(json.dumps(auth))
    args, want = {
        "no slack token": (["--slack-channel", "C1"], "needs SLACK_BOT_TOKEN and "
                                                      "SLACK_SIGNING_SECRET"),
        "no chat key": (["--google-chat-space", "spaces/A"], "needs GOOGLE_CHAT_CREDENTIALS"),
        "bad slack id": (["--auth", "chat-auth.yaml"], "slack must be the user's id"),
    }[case]
    done = subprocess.run(
        [sys.executable, "-m", "interlock", "serve", "--port", "0", "--workflows", "flows",
         "--store", f"sqlite:///{project / 'runs.db'}", *args],
        cwd=project, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": pythonpath(project)})
    assert done.returncode == 2, done.stderr
    assert want in done.stderr
    assert "Uvicorn running" not in done.stderr


def test_a_gate_of_a_run_executed_by_the_cli_is_posted_and_decided_by_a_click(
        served: Served, slack: FakeSlack, project: Path) -> None:
    """The server executes nothing of it: its watch finds the gate in the store, and a
    click's decision continues the run in the server."""
    store = f"sqlite:///{project / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": pythonpath(project)}
    done = subprocess.run(
        [sys.executable, "-m", "interlock", "run", "flows/gated.yaml", "--input", '{"n": 2}',
         "--run-id", "s7", "--store", store],
        cwd=project, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 3, done.stderr  # waiting for a decision
    [post] = slack.wait("chat.postMessage")
    assert "s7" in json.dumps(post["blocks"])
    with served.client("tok-alice") as c, served.client() as anonymous:
        posted(c, "s7")
        body, headers = click(slack, post, "UALICE")
        assert anonymous.post("/api/integrations/slack/actions", content=body,
                              headers=headers).status_code == 200
        assert wait_status(c, "s7", "COMPLETED")["state"]["last"] == 6
        [update] = slack.wait("chat.update")
        assert "Approved by alice (via slack)" in json.dumps(update["blocks"])
        assert len(slack.of("chat.postMessage")) == 1


def test_each_mapped_item_s_gate_is_a_message_decided_by_its_own_click(
        served: Served, slack: FakeSlack) -> None:
    with served.client("tok-alice") as c, served.client() as anonymous:
        start(c, "s8", "deploys")
        posts = {json.loads(e["value"])["gate"]: p for p in slack.wait("chat.postMessage", 3)
                 for b in p["blocks"] if b["type"] == "actions" for e in b["elements"]
                 if e.get("action_id") == "interlock.approve"}
        assert set(posts) == {"deploy[0]", "deploy[1]", "deploy[2]"}
        for n, i in enumerate([2, 0, 1], 1):
            body, headers = click(slack, posts[f"deploy[{i}]"], "UALICE",
                                  "reject" if i == 1 else "approve", reply=f"/respond/{n}")
            assert anonymous.post("/api/integrations/slack/actions", content=body,
                                  headers=headers).status_code == 200
            [*_, update] = slack.wait("chat.update", n)
            verb = "Rejected" if i == 1 else "Approved"
            assert f"{verb} by alice (via slack)" in json.dumps(update["blocks"])
        run = wait_status(c, "s8", "COMPLETED")
        assert run["state"]["report"] == ["approved", "rejected", "approved"]
        assert not slack.of("/respond/")  # no click refused
        assert len(slack.of("chat.update")) == 3
